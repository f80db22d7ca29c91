"""Milvus going away after start-up: 503 ``storage-unavailable``, then served again.

A real server on a loopback port (``milvus-lite server``, 3.x, and the C++ engine of
milvus-lite 2.5.1), the app through TestClient with the real model. The server is stopped under a running app (every collection route
answers 503 with ``Retry-After``, the process stays live, nothing is written), then
started again on the same port and data: the same app serves again, with the data
written before the outage and without the write refused during it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from tests.collections.test_storage_contract import (
    DOCS,
    URL,
    backend_settings,
    needs_milvus,
)
from tests.conftest import assert_problem
from tests.support.milvus_engine import MISSING_REASON, engine_binary, engine_server

pytestmark = [needs_milvus, pytest.mark.slow]
TOKEN = "root:not-to-be-shown"
QUERY = {"query": "Which city is the capital of France?", "k": 3}
LATE = {"id": "late", "text": "Written while Milvus was down."}


def poll(answer: Callable[[], httpx.Response], status: int) -> httpx.Response:
    """The first response of ``answer`` with ``status`` (a generous deadline)."""
    deadline = time.monotonic() + 120
    while True:
        response = answer()
        if response.status_code == status:
            return response
        assert time.monotonic() < deadline, response.text
        time.sleep(0.2)  # polling a condition, not synchronising on time


def unavailable(response: httpx.Response, uri: str) -> dict[str, Any]:
    body = assert_problem(response, 503)
    assert body["type"] == "/problems/storage-unavailable", body
    assert int(response.headers["retry-after"]) > 0
    assert "Milvus" in body["detail"]  # but not where: the log says that
    assert uri.removeprefix("http://") not in body["detail"], body
    assert "not-to-be-shown" not in body["detail"]
    return body


@contextmanager
def serving(kind: str, data: Path, port: int | None = None) -> Iterator[str]:
    """A server of ``kind`` on ``data`` (a second one on the same port and data is
    the first restarted); its URI once it answers."""
    if kind == "milvus":
        from tests.support.milvus_lite import milvus_lite_server

        with milvus_lite_server(data, port) as uri:
            yield uri
        return
    binary = engine_binary()
    if binary is None:
        pytest.skip(MISSING_REASON)
    with engine_server(binary, data, port) as uri:
        yield uri


@pytest.mark.parametrize("kind", ["milvus", "milvus-engine"])
def test_an_outage_is_a_503_and_the_same_process_serves_again(tmp_path, embedder, kind):
    data = tmp_path / "server"
    with serving(kind, data) as uri:
        port = int(uri.rsplit(":", 1)[1])
        settings = backend_settings(
            tmp_path, "milvus", milvus_uri=uri, milvus_token=TOKEN
        )
        client = TestClient(create_app(settings, embedder=embedder))
        client.__enter__()
        assert client.post("/v1/collections", json={"name": "kb"}).status_code == 201
        assert client.put(f"{URL}/documents", json={"documents": DOCS}).is_success
        before = client.post(f"{URL}/search", json=QUERY)
        assert before.status_code == 200, before.text
        # user errors stay 4xx: the translation is of Milvus's failures only
        assert_problem(client.get(f"{URL}/documents/nope"), 404)
        assert_problem(client.post("/v1/collections/nope/search", json=QUERY), 404)
        bad = {**QUERY, "filter": {"topic": {"$regex": "a"}}}
        assert_problem(client.post(f"{URL}/search", json=bad), 422)
        # a value Milvus's expressions cannot hold is matched in Python, not refused
        odd = {**QUERY, "filter": {"topic": "a\x01b"}}  # a control character
        assert client.post(f"{URL}/search", json=odd).json()["hits"] == []
    try:
        # the server is gone: every collection route is a 503, never a 500
        for request in (
            lambda: client.post(f"{URL}/search", json=QUERY),
            lambda: client.put(f"{URL}/documents", json={"documents": [LATE]}),
            lambda: client.get("/v1/collections"),
            lambda: client.get(f"{URL}/documents/paris"),
            lambda: client.get(f"{URL}/documents"),
            lambda: client.post("/v1/collections", json={"name": "other"}),
        ):
            unavailable(request(), uri)
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "not ready"
        assert any(uri in reason for reason in ready.json()["reasons"]), ready.text
        assert client.get("/healthz").status_code == 200  # the process is alive
        assert client.get("/metrics").status_code == 200  # scrapes go on

        with serving(kind, data, port=port) as again:
            assert again == uri
            poll(lambda: client.get("/readyz"), 200)
            after = poll(lambda: client.post(f"{URL}/search", json=QUERY), 200)
            assert after.json()["hits"] == before.json()["hits"]
            assert client.get(f"{URL}/documents/paris").status_code == 200
            assert_problem(client.get(f"{URL}/documents/late"), 404)  # not written
            assert client.get(URL).json()["documents"] == len(DOCS)
            names = [c["name"] for c in client.get("/v1/collections").json()["data"]]
            assert names == ["kb"]
            r = client.put(f"{URL}/documents", json={"documents": [LATE]})
            assert r.status_code == 200, r.text
            assert client.get(f"{URL}/documents/late").status_code == 200
    finally:
        client.__exit__(None, None, None)
