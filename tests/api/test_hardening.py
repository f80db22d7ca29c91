"""Hostile input over HTTP: body cap (413), limits at the bound and one past, names
that try to escape the data directory, overload (503 + Retry-After), and a graceful
shutdown that lets an in-flight request finish."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.api.app import create_app
from app.settings import Limits, Settings
from tests.conftest import assert_problem
from tests.support.server import ServerProcess

# What the model makes of a text does not matter here: the deterministic fake.
pytestmark = pytest.mark.fake_embedder

BODY_CAP = 4096
LIMITS = Limits(
    max_texts_per_request=3,
    max_text_chars=40,
    max_documents_per_upsert=3,
    max_queries_per_search=2,
    max_k=5,
    max_judgments_per_fit=4,
    max_body_bytes=BODY_CAP,
    max_filter_keys=3,
    max_filter_depth=2,
    max_filter_values=2,
    max_filter_value_chars=8,
    max_page_size=3,
)


@pytest.fixture
def data_dir(tmp_path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def small(data_dir, embedder):
    settings = Settings(data_dir=data_dir, limits=LIMITS)
    with TestClient(create_app(settings, embedder=embedder)) as c:
        assert c.post("/v1/collections", json={"name": "kb"}).status_code == 201
        yield c


def _padded(payload: bytes, size: int) -> bytes:
    """Valid JSON of exactly ``size`` bytes (trailing white space is legal JSON)."""
    assert len(payload) <= size
    return payload + b" " * (size - len(payload))


# -- body cap -------------------------------------------------------------------------
def test_body_at_the_cap_is_served_one_byte_more_is_413(small):
    headers = {"content-type": "application/json"}
    ok = small.post(
        "/v1/embed", content=_padded(b'{"texts": ["a"]}', BODY_CAP), headers=headers
    )
    assert ok.status_code == 200, ok.text
    too_big = small.post(
        "/v1/embed", content=_padded(b'{"texts": ["a"]}', BODY_CAP + 1), headers=headers
    )
    body = assert_problem(too_big, 413)
    assert (
        body["type"] == "/problems/payload-too-large"
        and str(BODY_CAP) in body["detail"]
    )


def test_chunked_body_without_length_is_counted(small):
    def chunks(total: int, size: int = 1000):
        payload = _padded(b'{"texts": ["a"]}', total)
        for i in range(0, total, size):
            yield payload[i : i + size]

    headers = {"content-type": "application/json"}
    r = small.post("/v1/embed", content=chunks(BODY_CAP), headers=headers)
    assert "content-length" not in r.request.headers
    assert r.status_code == 200, r.text
    r = small.post("/v1/embed", content=chunks(BODY_CAP + 1), headers=headers)
    assert "content-length" not in r.request.headers
    assert_problem(r, 413)


def test_oversized_upsert_writes_nothing(small):
    docs = [
        {"id": f"d{i}", "text": "x" * 30, "metadata": {"pad": "y" * 2000}}
        for i in range(3)
    ]
    assert_problem(
        small.put("/v1/collections/kb/documents", json={"documents": docs}), 413
    )
    assert small.get("/v1/collections/kb").json()["documents"] == 0


# -- declared limits: the bound is served, one past it is a 422 problem ----------------
def _embed(n=1, chars=1):
    return "/v1/embed", {"texts": ["a" * chars] * n}


def _upsert(n=1, chars=5):
    docs = [{"id": f"d{i}", "text": "b" * chars} for i in range(n)]
    return "/v1/collections/kb/documents", {"documents": docs}


def _search(k=1, chars=5, queries=None):
    body = {"k": k} | (
        {"queries": ["q" * chars] * queries} if queries else {"query": "q" * chars}
    )
    return "/v1/collections/kb/search", body


def _shaped(where: dict[str, object], path: str = "search", queries: int = 0):
    if path in ("delete", "query", "count"):
        return f"/v1/collections/kb/documents/{path}", {"filter": where}
    return _search(queries=queries)[0], _search(queries=queries)[1] | {"filter": where}


def _filtered(keys: int, path: str = "search", queries: int = 0):
    return _shaped({f"k{i}": i for i in range(keys)}, path, queries)


LIMIT_CASES = {
    "texts per request": (_embed(n=3), _embed(n=4)),
    "characters per text": (_embed(chars=40), _embed(chars=41)),
    "characters per document": (_upsert(chars=40), _upsert(chars=41)),
    "characters per query": (_search(chars=40), _search(chars=41)),
    "documents per upsert": (_upsert(n=3), _upsert(n=4)),
    "k": (_search(k=5), _search(k=6)),
    "queries per search": (_search(queries=2), _search(queries=3)),
    "filter keys of a search": (_filtered(3), _filtered(4)),
    "filter keys of a batch search": (_filtered(3, queries=2), _filtered(4, queries=2)),
    "filter keys of a delete": (_filtered(3, "delete"), _filtered(4, "delete")),
    "filter conditions with operators": (
        _shaped({"$or": [{"a": 1}, {"b": {"$gt": 2}}]}),
        _shaped({"$or": [{"a": 1}, {"b": {"$gt": 2, "$lt": 5}}]}),
    ),
    "filter depth": (
        _shaped({"$not": {"a": 1}}),
        _shaped({"$not": {"$not": {"a": 1}}}),
    ),
    "filter depth of a delete": (
        _shaped({"$or": [{"a": 1}]}, "delete"),
        _shaped({"$or": [{"$and": [{"a": 1}]}]}, "delete"),
    ),
    "values of a filter's $in": (
        _shaped({"a": {"$in": [1, 2]}}),
        _shaped({"a": {"$in": [1, 2, 3]}}),
    ),
    "values of a delete filter's $nin": (
        _shaped({"a": {"$nin": [1, 2]}}, "delete"),
        _shaped({"a": {"$nin": [1, 2, 3]}}, "delete"),
    ),
    "characters of a filter value": (
        _shaped({"a": {"$gte": "x" * 8}}),
        _shaped({"a": {"$gte": "x" * 9}}),
    ),
    "characters of a filter key": (_shaped({"k" * 8: 1}), _shaped({"k" * 9: 1})),
    "filter keys of a documents query": (_filtered(3, "query"), _filtered(4, "query")),
    "filter keys of a documents count": (_filtered(3, "count"), _filtered(4, "count")),
    "filter depth of a documents query": (
        _shaped({"$not": {"a": 1}}, "query"),
        _shaped({"$not": {"$not": {"a": 1}}}, "query"),
    ),
    "values of a documents count filter's $in": (
        _shaped({"a": {"$in": [1, 2]}}, "count"),
        _shaped({"a": {"$in": [1, 2, 3]}}, "count"),
    ),
    "page size of a documents query": (
        ("/v1/collections/kb/documents/query", {"limit": 3}),
        ("/v1/collections/kb/documents/query", {"limit": 4}),
    ),
}


@pytest.mark.parametrize("case", LIMIT_CASES, ids=list(LIMIT_CASES))
def test_limit_at_bound_and_one_past(small, case):
    (path, at), (_, past) = LIMIT_CASES[case]
    method = small.put if path.endswith("/documents") else small.post
    assert method(path, json=at).status_code == 200
    body = assert_problem(method(path, json=past), 422)
    assert body["type"] in ("/problems/limit-exceeded", "/problems/validation-error")
    if "filter" in past:
        assert body["type"] == "/problems/limit-exceeded"
        assert body["errors"][0]["loc"][0] == "filter"


def test_judgments_per_fit(small):
    judgments = [
        {"query": f"q{i}", "document_id": "d0", "relevance": i % 2} for i in range(5)
    ]
    # k explicit, though the fit's default is min(20, max_k) anyway.
    fit = {"judgments": judgments, "k": 5}
    body = assert_problem(small.post("/v1/collections/kb/calibrators", json=fit), 422)
    assert "judgments" in body["detail"] and "4" in body["detail"]
    # At the bound the limit itself passes (the fit may still refuse too few labels).
    fit["judgments"] = judgments[:4]
    r = small.post("/v1/collections/kb/calibrators", json=fit)
    assert r.status_code != 500 and "exceeds the limit" not in r.text


# -- collection names map to files: no path tricks ---------------------------------------
BAD_NAMES = [
    "..",
    ".",
    "../escape",
    "a/b",
    "a\\b",
    "a%2Fb",
    "a\x00b",
    "x" * 65,
    "ünïcode",
    "名前",
    "a b",
    "-leading",
    "",
    "kb.sqlite3",
]


@pytest.mark.parametrize("name", BAD_NAMES, ids=range(len(BAD_NAMES)))
def test_bad_collection_names_are_rejected_on_create(small, name):
    assert_problem(small.post("/v1/collections", json={"name": name}), 422)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/collections/..%2F..%2Fescape",
        "/v1/collections/%2E%2E",
        "/v1/collections/a%00b",
        "/v1/collections/" + "x" * 300,
        "/v1/collections/%C3%BC",
        "/v1/collections/..%5Cescape/documents",
    ],
)
def test_bad_collection_names_in_paths_are_4xx(small, path):
    for method in ("GET", "DELETE", "PUT"):
        r = small.request(method, path, json={"documents": [{"id": "a", "text": "t"}]})
        assert 400 <= r.status_code < 500, (method, path, r.status_code)
        assert r.headers["content-type"] == "application/problem+json"


def test_no_file_is_created_outside_the_data_dir(small, data_dir):
    before = set(data_dir.parent.rglob("*"))
    for name in BAD_NAMES:
        small.post("/v1/collections", json={"name": name})
        small.put(
            f"/v1/collections/{quote(name, safe='')}/documents",
            json={"documents": [{"id": "a", "text": "t"}]},
        )
    after = set(data_dir.parent.rglob("*"))
    assert after == before
    assert {p.name for p in data_dir.iterdir()} <= {
        "kb.sqlite3",
        "kb.sqlite3-wal",
        "kb.sqlite3-shm",
    }


# -- overload: the pool refuses instead of queueing forever ----------------------------
class GatedEmbedder:
    """An embedder whose first call waits for ``release``: that call holds the
    pool's only slot for as long as the test needs, whatever the machine's speed."""

    def __init__(self, inner):
        self.inner = inner
        self.model_name, self.dim = inner.model_name, inner.dim
        self.max_seq_length = inner.max_seq_length
        self.entered = threading.Event()
        self.release = threading.Event()

    def embed(self, texts, input_type):
        if not self.entered.is_set():
            self.entered.set()
            self.release.wait(120)
        return self.inner.embed(texts, input_type)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.anyio
async def test_overload_is_503_with_retry_after(data_dir, embedder):
    settings = Settings(data_dir=data_dir, worker_threads=1, max_pending_jobs=1)
    gated = GatedEmbedder(embedder)
    app = create_app(settings, embedder=gated)
    body = {"texts": ["sentence about overload and retries"]}
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t"
        ) as client:
            first = asyncio.ensure_future(client.post("/v1/embed", json=body))
            try:
                # The first job is running in the pool's only slot: the rest refuse.
                assert await asyncio.to_thread(gated.entered.wait, 120)
                refused = await asyncio.gather(
                    *(client.post("/v1/embed", json=body) for _ in range(5))
                )
            finally:
                gated.release.set()
            assert (await first).status_code == 200
            for r in refused:
                assert r.status_code == 503
                assert r.headers["retry-after"] == "1"
                assert r.headers["content-type"] == "application/problem+json"
                assert r.json()["type"] == "/problems/overloaded"
            # Once the queue drains, the service answers again.
            again = await client.post("/v1/embed", json={"texts": ["hello"]})
            assert again.status_code == 200


@pytest.fixture
def anyio_backend():
    return "asyncio"


# -- graceful shutdown: SIGTERM lets the in-flight request finish ------------------------
def _until(condition: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    """Poll ``condition`` until it holds; the deadline only bounds a hang."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"still not true after {timeout} s: {what}")
        time.sleep(0.05)


@pytest.mark.server
def test_sigterm_finishes_in_flight_request_and_closes_sqlite(tmp_path):
    """The upsert is held in flight by the test itself (half its body sent), so
    SIGTERM provably lands while it runs, whatever the machine's speed."""
    data_dir = tmp_path / "data"
    server = ServerProcess(data_dir).start()
    with httpx.Client(base_url=server.url, timeout=120) as c:
        assert c.post("/v1/collections", json={"name": "slow"}).status_code == 201
    docs = [{"id": f"d{i}", "text": f"document {i} about shutdown"} for i in range(8)]
    body = json.dumps({"documents": docs}).encode()
    release = threading.Event()

    def body_in_two_parts() -> Iterator[bytes]:
        yield body[: len(body) // 2]
        release.wait(120)
        yield body[len(body) // 2 :]

    result: dict[str, httpx.Response] = {}

    def upsert() -> None:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            result["r"] = c.put(
                "/v1/collections/slow/documents",
                content=body_in_two_parts(),
                headers={
                    "content-type": "application/json",
                    "content-length": str(len(body)),
                },
            )

    def upsert_in_flight() -> bool:
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
        return any(
            s.labels == {"method": "PUT", "route": "/v1/collections/{name}/documents"}
            and s.value == 1
            for family in text_string_to_metric_families(metrics)
            if family.name == "normcal_http_requests_in_flight"
            for s in family.samples
        )

    def refuses_new_connections() -> bool:
        try:
            socket.create_connection(("127.0.0.1", server.port), timeout=30).close()
        except ConnectionRefusedError:
            return True
        return False

    writer = threading.Thread(target=upsert)
    writer.start()
    try:
        _until(upsert_in_flight, "the server is serving the upsert")
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        _until(refuses_new_connections, "the server stopped listening after SIGTERM")
    finally:
        release.set()
    writer.join(120)
    assert result["r"].status_code == 200, result["r"].text
    assert result["r"].json()["upserted"] == len(docs)
    # Not server.stop(): a second SIGTERM would make uvicorn force its exit.
    returncode = server.proc.wait(120)
    assert returncode in (0, -15)  # uvicorn re-raises SIGTERM after a clean shutdown
    db = data_dir / "slow.sqlite3"
    assert not Path(f"{db}-wal").exists(), "WAL left behind: SQLite was not closed"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM documents").fetchone()[0] == len(docs)
