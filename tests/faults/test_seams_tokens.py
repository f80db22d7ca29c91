"""One input must not break a collection (issue 21, defects 4 and 5), on a real server.

A ``normcal serve`` subprocess with the real model, its own data directory (shared by
the module's tests, which each use their own collection).

4. A token over FTS5's 32,768 bytes (``"心" * 10923`` is cut inside a character) used
   to break the in-memory BM25 postings for good: every search 500'd, a queued
   judging query made ``judging/next`` 500, the upsert answered 500 but committed.
   Now it is accepted (stored whole, matched by its first 32,768 bytes), every mode
   and ``judging/next`` answer, and after a restart the postings are built again.
5. A filter of 991 keys used to be SQLite's ``Expression tree is too large`` (500):
   ``max_filter_keys`` (64 by default) is served, one more is a 422 naming
   ``filter``, and nothing changed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from app.settings import Limits
from tests.conftest import assert_problem
from tests.support.server import ServerProcess, source_env

pytestmark = [pytest.mark.server, pytest.mark.slow]

MAX_FILTER_KEYS = Limits().max_filter_keys  # the shipped default
# At FTS5's bound (3 bytes short of it), and one past it (cut after 2 of 3 bytes).
AT_BOUND, PAST = "心" * 10_922, "心" * 10_923
CORPUS = [
    {"id": "paris", "text": "Paris is the capital of France.", "metadata": {"n": 1}},
    {"id": "lava", "text": "Volcanoes erupt molten lava.", "metadata": {"n": 2}},
    {"id": "tea", "text": "Green tea is brewed from leaves.", "metadata": {"n": 3}},
]
LONG = [
    {"id": "at", "text": f"capital {AT_BOUND}", "metadata": {"n": 4}},
    {"id": "past", "text": f"lava {PAST} tea", "metadata": {"n": 5}},
    {"id": "four", "text": "x" + "\U00020000" * 8_192, "metadata": {"n": 6}},
]
MODES = ("dense", "lexical", "hybrid")


def _server(data: Path, log: IO[bytes]) -> ServerProcess:
    env = source_env(NORMCAL_LOG_LEVEL="DEBUG")  # the postings' "built" line
    return ServerProcess(data, env=env, log=log).start()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("seams-tokens")
    log_path = root / "server.log"
    with log_path.open("ab") as log:
        server = _server(root / "data", log)
        state = {"server": server, "log": log_path, "data": root / "data"}
        try:
            yield state
        finally:
            state["server"].stop()


def _client(served: dict[str, Any]) -> httpx.Client:
    return httpx.Client(base_url=served["server"].url, timeout=120)


def _make(c: httpx.Client, name: str) -> str:
    assert c.post("/v1/collections", json={"name": name}).status_code == 201
    docs = f"/v1/collections/{name}/documents"
    assert c.put(docs, json={"documents": CORPUS}).status_code == 200
    return f"/v1/collections/{name}"


def _counts(c: httpx.Client, base: str) -> tuple[int, int, int]:
    info = c.get(base).json()
    return info["documents"], info["lexical_indexed"], info["indexed"]


def _search(
    c: httpx.Client, base: str, query: str, mode: str, **extra: Any
) -> list[str]:
    r = c.post(f"{base}/search", json={"query": query, "mode": mode, "k": 6} | extra)
    assert r.status_code == 200, r.text[:500]
    return [h["id"] for h in r.json()["hits"]]


def _lexical_everywhere(c: httpx.Client, base: str) -> None:
    """Every mode answers queries holding the long tokens; BM25 finds them."""
    for query in (PAST, AT_BOUND, f"{PAST} capital", "lava tea"):
        for mode in MODES:
            _search(c, base, query, mode)
    assert _search(c, base, PAST, "lexical") == ["past"]
    assert _search(c, base, AT_BOUND, "lexical") == ["at"]
    # Cut alike in query and document: one tail past the bound is another's too...
    assert _search(c, base, PAST + "心", "lexical") == ["past"]
    # ... but a token cut inside another character is another token.
    assert _search(c, base, AT_BOUND + "木", "lexical") == []
    assert _search(c, base, "x" + "\U00020000" * 9_000, "lexical") == ["four"]


def _postings_built(log: Path, since: int, name: str, deadline: float) -> bool:
    """Poll the server's log, from byte ``since``, for ``name``'s postings served."""
    while time.monotonic() < deadline:
        text = log.read_bytes()[since:].decode(errors="replace")
        assert "searches stay on FTS5" not in text
        if any(
            "lexical postings of" in line and f"/{name}.sqlite3: " in line
            for line in text.splitlines()
        ):
            return True
        time.sleep(0.2)  # polling the log for a condition, with a deadline
    return False


def test_a_token_past_fts5s_bound_is_accepted_and_breaks_nothing(
    served: dict[str, Any],
) -> None:
    with _client(served) as c:
        base = _make(c, "long")
        for mode in MODES:  # the postings serve before the long tokens arrive
            _search(c, base, "lava", mode)
        r = c.put(f"{base}/documents", json={"documents": LONG})
        assert r.status_code == 200, r.text[:500]
        assert _counts(c, base) == (6, 6, 6)
        assert c.get(f"{base}/documents/past").json()["text"] == LONG[1]["text"]
        _lexical_everywhere(c, base)
        # A queued judging query holding the token: judging/next answers with hits.
        queued = c.post(f"{base}/judging/queries", json={"queries": [f"{PAST} lava"]})
        assert queued.status_code == 201, queued.text[:500]
        nxt = c.get(f"{base}/judging/next")
        assert nxt.status_code == 200, nxt.text[:500]
        assert "past" in [h["id"] for h in nxt.json()["hits"]]
        # Replacing and deleting the document keep the three counts together.
        again = c.put(f"{base}/documents", json={"documents": LONG[1:2]})
        assert again.status_code == 200
        assert c.delete(f"{base}/documents/four").status_code == 204
        assert _counts(c, base) == (5, 5, 5)
        _search(c, base, PAST, "hybrid")

    # A restart builds the postings from a file holding the cut tokens.
    server: ServerProcess = served["server"]
    server.stop()
    since = served["log"].stat().st_size
    with served["log"].open("ab") as log:
        served["server"] = _server(served["data"], log)
    with _client(served) as c:
        assert _counts(c, base) == (5, 5, 5)
        assert _search(c, base, PAST, "lexical") == ["past"]
        assert _postings_built(served["log"], since, "long", time.monotonic() + 120)
        assert _search(c, base, PAST, "lexical") == ["past"]  # from the postings
        assert _search(c, base, AT_BOUND, "lexical") == ["at"]
        for mode in MODES:
            _search(c, base, f"{PAST} {AT_BOUND}", mode)
        assert c.get(f"{base}/judging/next").status_code == 200


@pytest.mark.parametrize("where", ["search", "batch search", "delete"])
def test_a_filter_at_max_filter_keys_is_served_one_more_is_422(
    served: dict[str, Any], where: str
) -> None:
    with _client(served) as c:
        base = _make(c, f"filter-{where.replace(' ', '-')}")
        before = (_counts(c, base), _search(c, base, "lava", "hybrid"))
        # Keys no document has, except the first: the filter matches nothing.
        at = {"n": 2} | {f"k{i}": i for i in range(MAX_FILTER_KEYS - 1)}
        past = at | {"one_more": True}
        assert len(at) == MAX_FILTER_KEYS and len(past) == MAX_FILTER_KEYS + 1
        if where == "delete":
            path, body = f"{base}/documents/delete", {}
        else:
            queries = {"queries": ["lava", "tea"]} if where == "batch search" else {}
            path, body = f"{base}/search", {"query": "lava"} | queries
            if queries:
                del body["query"]
        served_at = c.post(path, json=body | {"filter": at})
        assert served_at.status_code == 200, served_at.text[:500]
        refused = assert_problem(c.post(path, json=body | {"filter": past}), 422)
        assert refused["type"] == "/problems/limit-exceeded"
        assert refused["detail"].startswith("filter.one_more:")  # the JSON path
        assert str(MAX_FILTER_KEYS) in refused["detail"]
        # SQLite's own limit (~990 keys) is never reached either.
        assert_problem(
            c.post(path, json=body | {"filter": {f"k{i}": i for i in range(991)}}),
            422,
        )
        assert (_counts(c, base), _search(c, base, "lava", "hybrid")) == before
