"""Issue 33, findings 3, 4, 5, 7, 8 and 9: exact filters, explicit match-all, bounded
costs, bounded state, and the hygiene of what the service leaves on disk.

Against real ``normcal serve`` subprocesses (real model, SQLite and FAISS; Milvus Lite
3.x in the server's process, or the C++ engine of milvus-lite 2.5.1 over TCP):

- 3: NUL in metadata (a key or a string, in documents and in filters) is refused,
  naming the field; every other control character is stored and compared exactly.
- 4: an empty sub-filter is a 422 at parse; a delete whose filter matches every
  document whatever it holds needs ``"all": true``.
- 5: a filter's scan past ``NORMCAL_FILTER_TIMEOUT_MS`` is stopped (503 with
  ``Retry-After``, nothing deleted); one collection's costly filters leave another
  collection's search a worker (it is answered while they still run).
- 7: calibrators stop at ``NORMCAL_MAX_CALIBRATORS_PER_COLLECTION``; the list pages
  summaries.
- 8: the query log keeps ``NORMCAL_MAX_LOGGED_QUERY_CHARS`` of a query, flagged.
- 9: interrupted snapshot files are gone after a start, a damaged fit-job file is
  reported by ``/readyz`` (and fits are 503s naming no path), fits at a full disk
  are 507s, every file is 0600 and every folder 0700.

Every refusal is followed by the proof that nothing changed: the documents of every
collection, a search's hits, the calibrators; and no problem names a server path, the
Milvus URI or Milvus's own collection names.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import assert_problem
from tests.faults.test_storage import _tmpfs
from tests.support.corpus import CORPUS, QUERIES
from tests.support.milvus_engine import emptied
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.server]

CALIBRATORS = 3  # NORMCAL_MAX_CALIBRATORS_PER_COLLECTION
LOGGED_CHARS = 60  # NORMCAL_MAX_LOGGED_QUERY_CHARS (the test queries are shorter)
JUDGMENTS = [
    {"query": q, "document_id": doc, "relevance": 1} for doc, q in QUERIES.items()
]
TOPICS = {"aspirin": "health", "photosynthesis": "science"}  # the others: "tech"


def _docs(**extra: dict[str, Any]) -> list[dict[str, Any]]:
    """The five test documents, each with a topic and ``extra[id]`` as metadata."""
    return [
        {
            "id": key,
            "text": text,
            "metadata": {"topic": TOPICS.get(key, "tech"), **extra.get(key, {})},
        }
        for key, text in CORPUS.items()
    ]


class Api:
    """A client of one server; every problem it gets must name none of ``secrets``
    (the data dir's path, the Milvus URI, Milvus's collection names)."""

    def __init__(self, url: str, secrets: list[str]) -> None:
        self.http = httpx.Client(base_url=url, timeout=600)
        self.secrets = [s for s in secrets if s]

    def problem(self, response: httpx.Response, status: int = 422) -> dict[str, Any]:
        body = assert_problem(response, status)
        for secret in self.secrets:
            assert secret not in response.text, (secret, body)
        return body

    def collection(self, name: str, docs: list[dict[str, Any]] | None = None) -> str:
        assert self.http.post("/v1/collections", json={"name": name}).status_code == 201
        path = f"/v1/collections/{name}"
        r = self.http.put(f"{path}/documents", json={"documents": docs or _docs()})
        assert r.status_code == 200, r.text
        return path

    def counts(self) -> dict[str, int]:
        listed = self.http.get("/v1/collections").json()["data"]
        return {c["name"]: c["documents"] for c in listed}

    def top(self, path: str, key: str = "paris") -> list[str]:
        r = self.http.post(f"{path}/search", json={"query": QUERIES[key], "k": 3})
        assert r.status_code == 200, r.text
        return [h["id"] for h in r.json()["hits"]]

    def ids(self, path: str, where: dict[str, Any]) -> list[str]:
        """The documents a filtered search returns (every one of them)."""
        body = {"query": QUERIES["paris"], "k": 10, "filter": where}
        r = self.http.post(f"{path}/search", json=body)
        assert r.status_code == 200, r.text
        return sorted(h["id"] for h in r.json()["hits"])

    def state(self, *paths: str) -> dict[str, Any]:
        """What a refusal must leave as it was."""
        return {
            "counts": self.counts(),
            "hits": {p: self.top(p) for p in paths},
            "calibrators": {
                p: [c["id"] for c in self.http.get(f"{p}/calibrators").json()["data"]]
                for p in paths
            },
        }


@contextmanager
def _serving(data: Path, env: dict[str, str], *secrets: str) -> Iterator[Api]:
    """A ``normcal serve`` on ``data`` (its log beside it) and a client of it; the
    folder holding ``data`` and ``secrets`` are never named by a problem."""
    with (data.parent / f"{data.name}.log").open("wb") as log:
        server = ServerProcess(data, env=env, log=log).start()
        api = Api(server.url, [str(data.parent), *secrets])
        try:
            yield api
        finally:
            api.http.close()
            server.stop()


@pytest.fixture(scope="module", params=["local", "milvus", "milvus-engine"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    """One server per backend, with small caps; tests use collections of their own."""
    tmp = tmp_path_factory.mktemp(f"bounds-{request.param}")
    env = {
        "NORMCAL_MAX_CALIBRATORS_PER_COLLECTION": str(CALIBRATORS),
        "NORMCAL_MAX_LOGGED_QUERY_CHARS": str(LOGGED_CHARS),
    }
    uri = ""
    if request.param == "milvus":
        uri = str(tmp / "milvus.db")
    elif request.param == "milvus-engine":
        uri = emptied(str(request.getfixturevalue("milvus_engine")))
    if uri:
        env |= {"NORMCAL_STORAGE": "milvus", "NORMCAL_MILVUS_URI": uri}
    with _serving(tmp / "data", env, uri, "ncd_", "ncs_") as api:
        yield api


# -- 3: NUL refused, every other control character compared exactly --------------------
CONTROL = {
    "aspirin": {"user": "alice\x01mallory", "k\x1fey": "x"},
    "paris": {"user": "alice", "tab": "a\tb"},
    "python": {"user": "alice\x7f"},
}


def test_3_nul_is_refused_naming_the_field_and_control_characters_match_exactly(
    served: Api,
):
    api = served
    path = api.collection("zeros", _docs(**CONTROL))
    other = api.collection("zeros_other")
    before = api.state(path, other)
    refused = [
        (
            "PUT",
            f"{path}/documents",
            {
                "documents": [
                    {"id": "x", "text": "t", "metadata": {"user": "alice\x00mallory"}}
                ]
            },
            "documents.0.metadata",
        ),
        (
            "PUT",
            f"{path}/documents",
            {"documents": [{"id": "paris", "text": "t", "metadata": {"a\x00b": 1}}]},
            "documents.0.metadata",
        ),
        (
            "PATCH",
            f"{path}/documents/paris",
            {"metadata": {"user": "\x00"}},
            "metadata",
        ),
        (
            "POST",
            f"{path}/documents/update",
            {"updates": [{"id": "paris", "metadata": {"n": ["x\x00"]}}]},
            "updates.0.metadata",
        ),
        (
            "POST",
            f"{path}/search",
            {"query": "q", "filter": {"user": "alice\x00"}},
            "filter",
        ),
        (
            "POST",
            f"{path}/documents/delete",
            {"filter": {"user\x00": "alice"}},
            "filter",
        ),
        (
            "POST",
            f"{path}/documents/delete",
            {"filter": {"user": {"$in": ["\x00"]}}},
            "filter",
        ),
    ]
    for method, url, body, field in refused:
        problem = api.problem(api.http.request(method, url, json=body))
        assert "NUL" in problem["detail"], problem
        assert field in problem["detail"] or field in str(problem["errors"]), problem
    assert api.state(path, other) == before
    # Exact: a prefix, or the string without its control character, is another value.
    assert api.ids(path, {"user": "alice"}) == ["paris"]
    assert api.ids(path, {"user": "alice\x01mallory"}) == ["aspirin"]
    assert api.ids(path, {"user": {"$gt": "alice"}}) == ["aspirin", "python"]
    assert api.ids(path, {"k\x1fey": {"$exists": True}}) == ["aspirin"]
    assert api.ids(path, {"tab": "a\tb"}) == ["paris"]
    deleted = api.http.post(
        f"{path}/documents/delete", json={"filter": {"user": "alice"}}
    )
    assert deleted.json() == {"deleted": 1}  # only the exact match
    assert api.counts()["zeros"] == len(CORPUS) - 1
    assert api.counts()["zeros_other"] == len(CORPUS)


# -- 4: match-all is explicit -------------------------------------------------------------
EMPTY_SUB_FILTERS = [
    {"$or": [{}]},
    {"$and": [{}]},
    {"$not": {"$not": {}}},
    {"$or": [{"topic": "tech"}, {}]},
]
TAUTOLOGIES = [
    {"$or": [{"topic": "tech"}, {"topic": {"$ne": "tech"}}]},
    {"topic": {"$nin": []}},
    {"$not": {"$and": [{"topic": "tech"}, {"topic": "health"}]}},
    {"$or": [{"topic": {"$exists": True}}, {"topic": {"$exists": False}}]},
]


def test_4_match_all_takes_all_true_and_an_empty_sub_filter_is_refused(served: Api):
    api = served
    path = api.collection("matchall")
    other = api.collection("matchall_other")
    before = api.state(path, other)
    for where in EMPTY_SUB_FILTERS:
        for url, body in (
            (f"{path}/documents/delete", {"filter": where}),
            (f"{path}/search", {"query": "q", "filter": where}),
        ):
            problem = api.problem(api.http.post(url, json=body))
            assert "empty filter matches every document" in problem["detail"]
    for where in TAUTOLOGIES:
        problem = api.problem(
            api.http.post(f"{path}/documents/delete", json={"filter": where})
        )
        assert '"all": true' in problem["detail"], problem
        assert problem["errors"][0]["loc"] == ["filter"]
        # A search with it is fine: it matches everything.
        assert api.ids(path, where) == sorted(CORPUS)
    assert api.state(path, other) == before
    # Not tautologies: a delete of the documents they match.
    narrow = {"$or": [{"topic": "health"}, {"topic": {"$gte": "t"}}]}
    deleted = api.http.post(f"{path}/documents/delete", json={"filter": narrow})
    assert deleted.json() == {"deleted": 4}
    everything = api.http.post(f"{path}/documents/delete", json={"all": True})
    assert everything.json() == {"deleted": 1}
    assert api.counts()["matchall_other"] == len(CORPUS)


# -- 7: calibrators capped, listed as summaries --------------------------------------------
def test_7_calibrators_stop_at_their_cap_and_list_summaries(served: Api):
    api = served
    path = api.collection("capped")
    other = api.collection("capped_other")
    fit = {"judgments": JUDGMENTS, "method": "platt", "k": 5}
    first = api.http.post(f"{path}/calibrators", json=fit)
    assert first.status_code == 201, first.text
    profile = api.http.get(f"{path}/calibrators/{first.json()['id']}/export").json()
    for _ in range(CALIBRATORS - 1):  # up to the bound
        r = api.http.post(f"{path}/calibrators/import", json={"profile": profile})
        assert r.status_code == 201, r.text
    before = api.state(path, other)
    for refused in (
        api.http.post(f"{path}/calibrators/import", json={"profile": profile}),
        api.http.post(f"{path}/calibrators", json=fit),
        api.http.post(f"{path}/fit-jobs", json=fit),
    ):
        problem = api.problem(refused)
        assert problem["type"] == "/problems/limit-exceeded"
        assert (
            f"calibrators: {CALIBRATORS + 1} exceeds the limit of {CALIBRATORS}"
            in (problem["detail"])
        )
    assert api.state(path, other) == before
    page = api.http.get(f"{path}/calibrators", params={"limit": 2}).json()
    assert page["count"] == 2 and page["next_cursor"]
    rest = api.http.get(f"{path}/calibrators", params={"cursor": page["next_cursor"]})
    listed = page["data"] + rest.json()["data"]
    assert [c["id"] for c in listed] == before["calibrators"][path]
    assert all("report" not in c and "cv" not in c for c in listed)
    assert len(api.http.get(f"{path}/calibrators").content) < 4000  # summaries


# -- 8: the query log keeps a bounded text -------------------------------------------------
def test_8_the_query_log_keeps_its_bound_of_a_query_and_says_it_cut(served: Api):
    api = served
    path = api.collection("logged")
    other = api.collection("logged_other")
    on = {"enabled": True, "retention": 10}
    assert api.http.put(f"{path}/query-log", json=on).status_code == 200
    long = QUERIES["python"] + " please" * 4000  # 28,048 characters
    r = api.http.post(f"{path}/search", json={"query": long})
    assert r.status_code == 200, r.text
    exact = (QUERIES["paris"] + "?" * LOGGED_CHARS)[:LOGGED_CHARS]  # at the bound
    assert api.http.post(f"{path}/search", json={"query": exact}).status_code == 200
    assert api.http.get(f"{path}/query-log").json()["entries"] == 2
    offered = {}
    for _ in range(2):
        body = api.http.get(f"{path}/judging/next", params={"k": 3}).json()
        offered[body["query"]] = body["truncated"]
        skip = {"query": body["query"]}
        assert api.http.post(f"{path}/judging/skip", json=skip).status_code == 204
    assert offered == {long[:LOGGED_CHARS]: True, exact: False}
    assert api.counts()["logged_other"] == len(CORPUS)
    assert api.http.get(f"{other}/query-log").json()["entries"] == 0


# -- 5: costly filters are bounded ---------------------------------------------------------
DIM = 8
WIDE = {f"key{i:04d}": i for i in range(1000)}  # ~16 KB of metadata a document
COSTLY = {"$or": [{f"missing{i}": i} for i in range(62)]}  # 63 conditions, none early


def _wide_collection(api: Api, name: str, count: int) -> str:
    """A collection of the client's own vectors whose documents have wide metadata."""
    created = api.http.post(
        "/v1/collections",
        json={"name": name, "embedding": {"dimension": DIM, "model": "own"}},
    )
    assert created.status_code == 201, created.text
    vectors = np.random.default_rng(0).standard_normal((count, DIM))
    path = f"/v1/collections/{name}"
    for start in range(0, count, 200):
        docs = [
            {
                "id": f"w{i}",
                "text": f"wide document {i}",
                "metadata": WIDE,
                "vector": vectors[i].tolist(),
            }
            for i in range(start, min(count, start + 200))
        ]
        r = api.http.put(f"{path}/documents", json={"documents": docs})
        assert r.status_code == 200, r.text
    return path


def _vector_search(api: Api, path: str, where: dict[str, Any]) -> httpx.Response:
    body = {"vector": [1.0] * DIM, "k": 3, "mode": "dense", "filter": where}
    return api.http.post(f"{path}/search", json=body)


def test_5_a_filter_past_its_deadline_is_stopped_and_changes_nothing(tmp_path):
    with _serving(tmp_path / "data", {"NORMCAL_FILTER_TIMEOUT_MS": "10"}) as api:
        wide = _wide_collection(api, "wide", 300)
        small = api.collection("small")
        before = {"counts": api.counts(), "hits": api.top(small)}
        for response in (
            _vector_search(api, wide, COSTLY),
            api.http.post(
                f"{wide}/documents/delete", json={"filter": {"$not": COSTLY}}
            ),
        ):
            problem = api.problem(response, 503)
            assert problem["type"] == "/problems/filter-timeout"
            assert "NORMCAL_FILTER_TIMEOUT_MS (10 ms)" in problem["detail"]
            assert response.headers["retry-after"] == "1"
        assert {"counts": api.counts(), "hits": api.top(small)} == before
        assert api.ids(small, {"topic": "tech"}) == ["faiss", "paris", "python"]


def test_5_one_collections_costly_filters_leave_other_collections_a_worker(tmp_path):
    """Two costly filtered searches of one collection, on a server of two workers:
    one runs, the other waits its turn holding no worker, so searches of another
    collection are answered one after the other while both are still in flight.
    Without the turn both would hold a worker and every other search would wait for
    one of them to end (at most the first, sent before they arrive, gets through).
    """
    env = {"NORMCAL_FILTER_TIMEOUT_MS": "600000", "NORMCAL_WORKER_THREADS": "2"}
    with _serving(tmp_path / "data", env) as api:
        wide = _wide_collection(api, "wide", 2000)
        small = api.collection("small")
        expected = api.top(small)
        with ThreadPoolExecutor(2) as threads:
            costly: list[Future[httpx.Response]] = [
                threads.submit(_vector_search, api, wide, COSTLY) for _ in range(2)
            ]
            for _ in range(3):
                assert api.top(small) == expected
            running = [not f.done() for f in costly]
            answers = [f.result() for f in costly]
        assert running == [True, True], "the other collection waited for a filter"
        assert [r.status_code for r in answers] == [200, 200]
        assert all(r.json()["hits"] == [] for r in answers)  # nothing has the keys


# -- 9: what the service leaves on disk ---------------------------------------------------
def _modes(data: Path) -> dict[str, str]:
    """Every file and folder under ``data`` whose mode is not 0600 / 0700."""
    wrong = {}
    for path in [data, *data.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        want = 0o700 if path.is_dir() else 0o600
        if mode != want:
            wrong[str(path.relative_to(data))] = oct(mode)
    return wrong


def test_9_leftovers_are_removed_a_damaged_job_file_is_reported_files_are_private(
    tmp_path,
):
    data = tmp_path / "data"
    folder = data / "snapshots" / "kb"
    for level in (data, folder.parent, folder):  # as the service makes them
        level.mkdir(mode=0o700)
    partial = folder / ".20260101T000000000Z-0badcafe.partial-1234abcd.sqlite3"
    planted = {
        partial: os.urandom(1 << 20),  # a backup a crash interrupted
        Path(f"{partial}-journal"): os.urandom(4096),
        folder / "notes.txt": b"mine",  # not the service's: left alone
        data / "_jobs.sqlite3": b"SQLite format 3\x00" + os.urandom(8192),  # damaged
        data / "broken.sqlite3": os.urandom(8192),  # a quarantined collection
    }
    for path, content in planted.items():
        path.write_bytes(content)
        path.chmod(0o600)
    jobs, kept = data / "_jobs.sqlite3", folder / "notes.txt"
    with _serving(data, {}) as api:
        assert not partial.exists() and not Path(f"{partial}-journal").exists()
        assert kept.read_bytes() == b"mine"
        ready = api.http.get("/readyz").json()
        assert ready["status"] == "degraded", ready
        reasons = " ".join(ready["reasons"])
        assert "_jobs.sqlite3" in reasons and str(tmp_path) not in reasons
        path = api.collection("kb")
        fit = {"judgments": JUDGMENTS, "method": "platt", "k": 5}
        for refused in (
            api.http.post(f"{path}/calibrators", json=fit),
            api.http.post(f"{path}/fit-jobs", json=fit),
            api.http.get(f"{path}/fit-jobs"),
        ):
            problem = api.problem(refused, 503)
            assert "_jobs.sqlite3 in the data dir" in problem["detail"], problem
        problem = api.problem(api.http.get("/v1/collections/broken"), 503)
        assert "broken.sqlite3 in the data dir" in problem["detail"]
        before = api.state(path)
        api.problem(api.http.post(f"{path}/calibrators/nope/activate"), 404)
        api.problem(api.http.post("/v1/collections", json={"name": "kb"}), 409)
        assert api.state(path) == before
        # The operator moves the damaged file away: fits work again, no restart.
        jobs.rename(tmp_path / "jobs.damaged")
        assert api.http.get("/readyz").json()["status"] == "degraded"  # broken.sqlite3
        assert "_jobs" not in " ".join(api.http.get("/readyz").json()["reasons"])
        assert api.http.post(f"{path}/calibrators", json=fit).status_code == 201
        on = {"enabled": True, "retention": 5}
        assert api.http.put(f"{path}/query-log", json=on).status_code == 200
        assert api.top(path)
        assert api.http.post(f"{path}/snapshots").status_code == 201
        # While it runs: -wal and -shm files of the collection and of the job file.
        assert Path(f"{data / 'kb.sqlite3'}-wal").exists()
        assert Path(f"{jobs}-wal").exists()
        assert _modes(data) == {}


def test_9_a_fit_at_a_full_disk_is_a_507_and_changes_nothing(tmp_path):
    data = tmp_path / "data"
    with _tmpfs(data, "64m"), _serving(data, {}) as api:
        path = api.collection("kb")
        before = api.state(path)
        filler = data / "filler"
        with filler.open("wb") as out:  # the disk full, to the last block
            chunk = b"\0" * (1 << 20)
            try:
                while True:
                    out.write(chunk)
                    out.flush()
            except OSError as error:
                assert error.errno == errno.ENOSPC
        fit = {"judgments": JUDGMENTS, "method": "platt", "k": 5}
        for refused in (
            api.http.post(f"{path}/calibrators", json=fit),
            api.http.post(f"{path}/fit-jobs", json=fit),
            api.http.put(f"{path}/documents", json={"documents": _docs()}),
        ):
            problem = api.problem(refused, 507)
            assert problem["type"] == "/problems/insufficient-storage"
        filler.unlink()
        assert api.state(path) == before
        fitted = api.http.post(f"{path}/calibrators", json=fit)
        assert fitted.status_code == 201, fitted.text
