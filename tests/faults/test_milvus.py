"""Milvus faults (issue 33, findings 1, 2 and 6), against real ``normcal serve`` subprocesses.

Each test runs on Milvus Lite 3.x (a file: the Lite server lives in normcal's
process and restarts with it) and on the real C++ engine (milvus-lite 2.5.1's
server over TCP, a server of the test's own, restarted where the test restarts
normcal: both come back from the same data). Every test asserts the refusal or the
bound *and* that nothing changed: the documents of every collection and a search's
result.

1. Ids are values: hostile ids and filter values sent by one tenant (``eve``) never
   read, change or delete another tenant's documents, or their own but the one
   named (the shared layout on Lite 3.x; the engine cannot serve it, so there the
   per-collection layout).
2. Start-up never stops on what it can open later: 1, 2 and 5 collections, after
   SIGTERM and after kill -9; ``/readyz`` is ready only once every collection can
   answer, and a search sent while the server starts waits for the loads instead
   of a 503.
6. Document-frequency lookups are bounded per query (``NORMCAL_MILVUS_TERM_LOOKUPS``,
   at the bound and one past, read from ``/metrics``) and a batch of long queries
   is served.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.collections.test_storage_contract import needs_milvus
from tests.conftest import assert_problem
from tests.support.corpus import CORPUS, QUERIES
from tests.support.milvus_engine import MISSING_REASON, engine_binary, engine_server
from tests.support.server import ServerProcess, source_env

pytestmark = [needs_milvus, pytest.mark.server]
ENGINES = ["milvus", "milvus-engine"]
TENANTS = ("alice", "bob", "eve")
# (collections, how the server stops): SIGTERM and kill -9 with each count
STAGES = [(n, stop) for n in (1, 2, 5) for stop in ("term", "kill")]
HOSTILE = [
    "paris'] or tpk not in ['",  # on pymilvus's paste: every row of every tenant
    "paris'] or id not in ['",
    "paris' or tpk != '",
    "paris') or (tpk != '",
    "paris' or id != '",
    'paris" or tpk != "',
    'paris"] or tpk != ["',
    "' or '1'='1",
    "paris\\",
    "paris, faiss",
    "[paris]",
    "alice/paris",
    "paris or python",
]


@contextmanager
def milvus_of(kind: str, tmp_path: Path) -> Iterator[tuple[str, ExitStack]]:
    """The URI of a Milvus for one test, and a stack its engine server (if any) is on.

    ``milvus``: a Lite 3.x file (normcal's process runs it). ``milvus-engine``: an
    engine server of this test's own (tests restart it).
    """
    if kind == "milvus":
        with ExitStack() as stack:
            yield str(tmp_path / "milvus.db"), stack
        return
    binary = engine_binary()
    if binary is None:
        pytest.skip(MISSING_REASON)
    with ExitStack() as stack:
        uri = stack.enter_context(engine_server(binary, tmp_path / "engine"))
        yield uri, stack


def normcal(tmp_path: Path, uri: str, log: Any, **env: str) -> ServerProcess:
    settings = {"NORMCAL_STORAGE": "milvus", "NORMCAL_MILVUS_URI": uri, **env}
    return ServerProcess(tmp_path / "data", env=source_env(**settings), log=log)


def fill(http: httpx.Client, name: str) -> None:
    assert http.post("/v1/collections", json={"name": name}).status_code == 201
    docs = [
        {"id": k, "text": v, "metadata": {"owner": name, "n": i}}
        for i, (k, v) in enumerate(CORPUS.items())
    ]
    r = http.put(f"/v1/collections/{name}/documents", json={"documents": docs})
    assert r.status_code == 200, r.text


def state(http: httpx.Client, names: list[str]) -> dict[str, Any]:
    """What must not change: every collection's documents and count, and a search."""
    out: dict[str, Any] = {}
    for name in names:
        base = f"/v1/collections/{name}"
        found = http.post(f"{base}/documents/get", json={"ids": list(CORPUS)})
        assert found.status_code == 200, found.text
        search = http.post(f"{base}/search", json={"query": QUERIES["paris"], "k": 3})
        assert search.status_code == 200, search.text
        out[name] = {
            "documents": sorted(
                (d["id"], d["text"], d["metadata"]) for d in found.json()["data"]
            ),
            "count": http.get(base).json()["documents"],
            "search": [(h["id"], round(h["score"], 5)) for h in search.json()["hits"]],
        }
    return out


# -- 1. ids are values ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "layout"), [("milvus", "shared"), ("milvus-engine", "per-collection")]
)
def test_hostile_ids_and_filters_touch_nothing_but_their_own_document(
    tmp_path: Path, kind: str, layout: str
) -> None:
    log = (tmp_path / "server.log").open("wb")
    with milvus_of(kind, tmp_path) as (uri, _):
        server = normcal(tmp_path, uri, log, NORMCAL_MILVUS_LAYOUT=layout).start()
        try:
            with httpx.Client(base_url=server.url, timeout=120) as http:
                for name in TENANTS:
                    fill(http, name)
                before = state(http, list(TENANTS))
                eve = "/v1/collections/eve"
                for doc_id in HOSTILE:
                    path = f"{eve}/documents/{quote(doc_id, safe='')}"
                    assert_problem(http.get(path), 404)
                    assert_problem(http.delete(path), 404)
                    patch = http.patch(path, json={"metadata": {"owner": "eve"}})
                    assert_problem(patch, 404)
                    got = http.post(
                        f"{eve}/documents/get", json={"ids": [doc_id]}
                    ).json()
                    assert (got["data"], got["missing"]) == ([], [doc_id])
                    for where in ({"owner": doc_id}, {doc_id: "x"}):
                        r = http.post(f"{eve}/documents/delete", json={"filter": where})
                        assert r.json()["deleted"] == 0, (where, r.text)
                        body = {"query": doc_id, "filter": where}
                        assert (
                            http.post(f"{eve}/search", json=body).json()["hits"] == []
                        )
                r = http.post(f"{eve}/documents/delete", json={"ids": HOSTILE})
                assert r.json()["deleted"] == 0, r.text
                assert state(http, list(TENANTS)) == before
                # an ordinary id with a quote: the whole life of a document...
                doc = {"id": "O'Brien", "text": "Mr O'Brien's notes.", "metadata": {}}
                put = http.put(f"{eve}/documents", json={"documents": [doc]})
                path = f"{eve}/documents/{quote(doc['id'], safe='')}"
                if kind == "milvus":
                    assert put.status_code == 200, put.text
                    assert http.get(path).json()["text"] == doc["text"]
                    patched = http.patch(path, json={"metadata": {"seen": True}})
                    assert patched.json()["metadata"] == {"seen": True}, patched.text
                    assert http.delete(path).status_code == 204
                    assert_problem(http.get(path), 404)
                else:  # ...but Milvus Lite 2.x pastes ids into its own SQL: refused
                    body = assert_problem(put, 422)
                    assert body["errors"][0]["loc"] == ["documents", "0", "id"], body
                    assert_problem(http.get(path), 404)
                # a line break: no expression can carry it on both engines
                doc = {"id": "line\nbreak", "text": "t", "metadata": {}}
                put = http.put(f"{eve}/documents", json={"documents": [doc]})
                body = assert_problem(put, 422)
                assert body["errors"][0]["loc"] == ["documents", "0", "id"], body
                assert state(http, list(TENANTS)) == before
        finally:
            server.stop()
            log.close()


# -- 2. start-up ----------------------------------------------------------------------
def search_while_starting(
    port_file: Path, body: dict[str, Any]
) -> tuple[threading.Thread, list[httpx.Response]]:
    """A thread that sends ``body`` to ``/v1/collections/c0/search`` as soon as the
    server (about to start) has bound its port, loads maybe under way; its answer
    lands in the list."""
    port_file.unlink(missing_ok=True)  # the last run's
    answers: list[httpx.Response] = []

    def port() -> int:
        while True:  # polling a condition: the file is there, and written
            try:
                return int(port_file.read_text())
            except (OSError, ValueError):
                threading.Event().wait(0.05)

    def send() -> None:
        url = f"http://127.0.0.1:{port()}/v1/collections/c0/search"
        with httpx.Client(timeout=120) as http:  # one: each new one costs a TLS context
            while True:
                try:
                    answers.append(http.post(url, json=body))
                    return
                except httpx.TransportError:  # bound, not yet accepting
                    threading.Event().wait(0.05)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread, answers


@pytest.mark.timeout(1800)  # seven starts of the server (~40 s each on a busy CI)
@pytest.mark.parametrize("kind", ENGINES)
def test_restarts_with_1_2_and_5_collections_start_and_answer_at_once(
    tmp_path: Path, kind: str
) -> None:
    log = (tmp_path / "server.log").open("wb")
    query = {"query": QUERIES["paris"], "k": 3}
    with milvus_of(kind, tmp_path) as (uri, stack):
        server = normcal(tmp_path, uri, log).start()
        names: list[str] = []
        try:
            for count, stop in STAGES:
                with httpx.Client(base_url=server.url, timeout=120) as http:
                    while len(names) < count:
                        names.append(f"c{len(names)}")
                        fill(http, names[-1])
                    before = state(http, names)
                if stop == "term":
                    server.stop()  # SIGTERM: the graceful path
                else:
                    server.kill()
                if kind == "milvus-engine":  # the engine restarts too: all released
                    stack.close()
                    port = int(uri.rsplit(":", 1)[1])
                    binary = engine_binary()
                    assert binary is not None
                    again = engine_server(binary, tmp_path / "engine", port)
                    assert stack.enter_context(again) == uri
                early, answers = search_while_starting(server._port_file, query)
                server.start()  # returns once /readyz answers 200
                ready = httpx.get(f"{server.url}/readyz").json()
                assert (ready["status"], ready["loading"]) == ("ready", []), ready
                assert ready["collections"] == count
                with httpx.Client(base_url=server.url, timeout=120) as http:
                    assert state(http, names) == before, (count, stop)
                    listed = http.get("/v1/collections").json()["data"]
                assert [(c["name"], c["status"]) for c in listed] == [
                    (n, "ready") for n in names
                ]
                early.join(300)
                (answer,) = answers  # sent while the server started: it waited
                assert answer.status_code == 200, answer.text
                assert [
                    (h["id"], round(h["score"], 5)) for h in answer.json()["hits"]
                ] == before["c0"]["search"]
        finally:
            server.stop()
            log.close()


# -- 6. document-frequency lookups ----------------------------------------------------
def lookups(http: httpx.Client) -> tuple[int, int]:
    """``(counted, past_bound)`` of ``normcal_milvus_term_lookups_total``."""
    text = http.get("/metrics").text
    found = dict(
        re.findall(
            r'^normcal_milvus_term_lookups_total\{outcome="(\w+)"\} ([0-9.e+]+)$',
            text,
            re.MULTILINE,
        )
    )
    return int(float(found["counted"])), int(float(found["past_bound"]))


def fresh(tag: str, n: int) -> str:
    """``n`` words no document holds and no earlier query used."""
    return " ".join(f"zq{tag}x{i}" for i in range(n))


@pytest.mark.parametrize("kind", ENGINES)
def test_term_lookups_are_bounded_per_query_at_the_bound_and_one_past(
    tmp_path: Path, kind: str
) -> None:
    bound = 4
    log = (tmp_path / "server.log").open("wb")
    with milvus_of(kind, tmp_path) as (uri, _):
        env = {"NORMCAL_MILVUS_TERM_LOOKUPS": str(bound)}
        server = normcal(tmp_path, uri, log, **env).start()
        try:
            with httpx.Client(base_url=server.url, timeout=300) as http:
                for name in ("kb", "other"):
                    fill(http, name)
                before = state(http, ["kb", "other"])
                for new, tag in ((bound, "a"), (bound + 1, "b")):
                    first = lookups(http)
                    body = {"query": fresh(tag, new), "k": 3}
                    r = http.post("/v1/collections/kb/search", json=body)
                    assert r.status_code == 200, r.text
                    counted, past = (
                        a - b for a, b in zip(lookups(http), first, strict=True)
                    )
                    assert (counted, past) == (bound, new - bound), new
                # a batch of long queries: every query counts at most `bound` new terms
                first = lookups(http)
                queries = [fresh(f"c{q}", 64) for q in range(32)]
                r = http.post("/v1/collections/kb/search", json={"queries": queries})
                assert r.status_code == 200, r.text
                counted, past = (
                    a - b for a, b in zip(lookups(http), first, strict=True)
                )
                assert (counted, past) == (32 * bound, 32 * (64 - bound))
                assert state(http, ["kb", "other"]) == before
        finally:
            server.stop()
            log.close()
