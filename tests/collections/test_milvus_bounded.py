"""Bounded calls on Milvus: timeouts, released collections, top-k limits, schema
version, consistency levels.

Real model, real engines (Milvus Lite 3.x and the C++ engine of milvus-lite 2.5.1),
the app through TestClient. A Milvus that stops answering is a server of the test's
own stopped with SIGSTOP (its port stays open, nothing answers); a released
collection is released by a second client, as an operator or a restarted server
would.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from app.api.app import create_app
from app.settings import (
    MAX_QUERY_TERMS,
    MILVUS_LOAD_WAIT_MAX_S,
    MILVUS_TIMEOUT_BOUNDS,
    MILVUS_TOP_K,
    Limits,
    Settings,
)
from tests.collections.test_milvus_outage import poll, unavailable
from tests.collections.test_storage_contract import (
    DOCS,
    HAS_MILVUS,
    URL,
    backend_settings,
    needs_milvus,
)
from tests.conftest import assert_problem

QUERY = {"query": "Which city is the capital of France?", "k": 3}


# -- settings ---------------------------------------------------------------------------
def test_max_k_on_milvus_is_bounded_by_milvus_top_k_cap(tmp_path: Path) -> None:
    at = Limits(max_k=MILVUS_TOP_K)
    assert Settings(storage="milvus", limits=at).limits.max_k == MILVUS_TOP_K
    past = Limits(max_k=MILVUS_TOP_K + 1)
    with pytest.raises(ValidationError, match=f"at most {MILVUS_TOP_K}.*top-k cap"):
        Settings(storage="milvus", limits=past)
    assert Settings(storage="local", limits=past).limits.max_k == MILVUS_TOP_K + 1


@pytest.mark.parametrize("bound", MILVUS_TIMEOUT_BOUNDS)
def test_the_milvus_timeout_is_declared_and_checked(bound: float) -> None:
    assert Settings(milvus_timeout_s=bound).milvus_timeout_s == bound
    past = bound - 0.01 if bound == MILVUS_TIMEOUT_BOUNDS[0] else bound + 1
    with pytest.raises(ValidationError, match="milvus_timeout_s"):
        Settings(milvus_timeout_s=past)


@pytest.mark.parametrize(
    ("field", "bound", "below"),
    [
        ("milvus_load_wait_s", MILVUS_LOAD_WAIT_MAX_S, 0.0),
        ("milvus_term_lookups", MAX_QUERY_TERMS, 0),
    ],
)
def test_the_load_wait_and_the_term_lookups_are_declared_and_checked(
    field: str, bound: float, below: float
) -> None:
    """Accepted at both ends of the range, refused one past either."""
    for value in (below, bound):
        assert getattr(Settings(**{field: value}), field) == value
    for past in (below - 1, bound + 1):
        with pytest.raises(ValidationError, match=field):
            Settings(**{field: past})


def test_the_consistency_level_is_one_of_milvus_levels() -> None:
    for level in ("Strong", "Bounded", "Session", "Eventually"):
        assert Settings(milvus_consistency=level).milvus_consistency == level
    with pytest.raises(ValidationError, match="milvus_consistency"):
        Settings(milvus_consistency="Customized")


# -- on an engine -----------------------------------------------------------------------
@pytest.fixture
def lite_server(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """A ``milvus-lite server`` and its process; continued if a test stopped it."""
    from tests.support.milvus_lite import milvus_lite_process

    with milvus_lite_process(tmp_path / "server") as (uri, process):
        try:
            yield uri, process
        finally:
            os.kill(process.pid, signal.SIGCONT)


def _child_serving(port: int) -> int:
    """The pid of this process's child serving ``port`` (from /proc: Linux)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
        if parent == os.getpid() and f"127.0.0.1:{port}".encode() in args:
            return int(entry.name)
    raise AssertionError(f"no child process serves port {port}")


@pytest.fixture(params=["milvus-lite-server", "milvus-engine"])
def stoppable(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, int]]:
    """A Milvus server of this test only and its pid; continued if a test stopped it.

    ``milvus-lite server`` (3.x), or the real engine (a server of its own, not the
    session's: stopping that one would stop the other tests).
    """
    from tests.support import milvus_engine

    if request.param == "milvus-engine":
        binary = milvus_engine.engine_binary()
        if binary is None:
            pytest.skip(milvus_engine.MISSING_REASON)
        server = milvus_engine.engine_server(binary, tmp_path / "engine")
        with server as uri:
            pid = _child_serving(int(uri.rsplit(":", 1)[1]))
            try:
                yield uri, pid
            finally:
                os.kill(pid, signal.SIGCONT)
        return
    from tests.support.milvus_lite import milvus_lite_process

    with milvus_lite_process(tmp_path / "server") as (uri, process):
        try:
            yield uri, process.pid
        finally:
            os.kill(process.pid, signal.SIGCONT)


def app_on(settings: Settings, embedder: Any) -> TestClient:
    client = TestClient(create_app(settings, embedder=embedder))
    client.__enter__()
    assert client.post("/v1/collections", json={"name": "kb"}).status_code == 201
    assert client.put(f"{URL}/documents", json={"documents": DOCS}).is_success
    return client


@needs_milvus
@pytest.mark.slow
def test_a_call_past_its_timeout_is_a_503_and_the_request_ends(
    tmp_path: Path, embedder: Any, stoppable: tuple[str, int]
) -> None:
    uri, pid = stoppable
    settings = backend_settings(
        tmp_path, "milvus", milvus_uri=uri, milvus_timeout_s=1.0
    )
    client = app_on(settings, embedder)
    try:
        before = client.post(f"{URL}/search", json=QUERY)
        assert before.status_code == 200, before.text
        os.kill(pid, signal.SIGSTOP)  # the port stays open; nothing answers
        for request in (
            lambda: client.post(f"{URL}/search", json=QUERY),
            lambda: client.get(f"{URL}/documents/paris"),
            lambda: client.put(f"{URL}/documents", json={"documents": DOCS[:1]}),
        ):
            unavailable(request(), uri)  # answered: the request did not hang
        os.kill(pid, signal.SIGCONT)
        after = poll(lambda: client.post(f"{URL}/search", json=QUERY), 200)
        assert after.json()["hits"] == before.json()["hits"]
    finally:
        client.__exit__(None, None, None)


@needs_milvus
@pytest.mark.slow
@pytest.mark.parametrize("wait", [0.0, MILVUS_LOAD_WAIT_MAX_S])
def test_a_released_collection_is_loaded_in_the_background_and_a_search_waits(
    tmp_path: Path,
    embedder: Any,
    lite_server: tuple[str, Any],
    wait: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The request never loads; while the background load runs ``/readyz`` is not
    ready and names the collection, and a search waits for the load, bounded by
    NORMCAL_MILVUS_LOAD_WAIT_S (0: never, a 503 with Retry-After, then served).

    The load is held at a gate (the real load, started late) so that the search
    arrives during it. (The engine of Lite 2.5.1 ignores ``release_collection``:
    Lite 3.x here.)
    """
    from pymilvus import MilvusClient

    from app.collections.milvus_client import Guarded, milvus_name

    gate, real_load = threading.Event(), Guarded._load

    def gated_load(self: Guarded, milvus: str) -> None:
        assert gate.wait(120)
        real_load(self, milvus)

    uri, _ = lite_server
    settings = backend_settings(
        tmp_path, "milvus", milvus_uri=uri, milvus_load_wait_s=wait
    )
    client = app_on(settings, embedder)
    other = MilvusClient(uri=uri)
    try:
        before = client.post(f"{URL}/search", json=QUERY)
        assert before.status_code == 200, before.text
        monkeypatch.setattr(Guarded, "_load", gated_load)
        for kind in ("ncs_", "ncd_"):  # Lite 3.x counts a released one: not enough
            other.release_collection(milvus_name("kb", kind))
        answers: list[httpx.Response] = []
        search = threading.Thread(
            target=lambda: answers.append(client.post(f"{URL}/search", json=QUERY))
        )
        search.start()
        ready = poll(lambda: client.get("/readyz"), 503)  # the load has started
        assert ready.json()["status"] == "not ready"
        assert ready.json()["loading"] == ["kb"]
        (listed,) = client.get("/v1/collections").json()["data"]
        assert (listed["name"], listed["status"]) == ("kb", "loading"), listed
        assert "being loaded" in listed["reason"]
        if wait == 0:
            search.join()
            body = unavailable(answers[0], uri)
            assert "being loaded" in body["detail"]
        gate.set()
        search.join()
        storage = client.app_state["service"].context.registry._storage
        storage.client.reloads.wait()
        after = answers[0]
        for _ in range(
            2 if wait == 0 else 0
        ):  # one collection's load, then the other's
            after = client.post(f"{URL}/search", json=QUERY)
            storage.client.reloads.wait()
        assert after.status_code == 200, after.text
        assert after.json()["hits"] == before.json()["hits"]
        for kind in ("ncs_", "ncd_"):
            state = other.get_load_state(milvus_name("kb", kind))["state"]
            assert state.name == "Loaded"
        ready = client.get("/readyz")
        assert (ready.status_code, ready.json()["loading"]) == (200, [])
    finally:
        gate.set()
        other.close()
        client.__exit__(None, None, None)


@needs_milvus
@pytest.mark.slow
@pytest.mark.parametrize("layout", ["per-collection", "shared"])
def test_an_app_started_on_a_milvus_that_released_everything_serves_at_once(
    tmp_path: Path, embedder: Any, layout: str
) -> None:
    """Milvus Lite restarts with the app that opens its file: every collection is
    released. Start-up goes on (it used to fail with two collections), and the first
    searches wait for the loads instead of a 503."""
    settings = backend_settings(tmp_path, "milvus", milvus_layout=layout)
    names = ("kb", "kb2")
    with TestClient(create_app(settings, embedder=embedder)) as first:
        for name in names:
            assert first.post("/v1/collections", json={"name": name}).is_success
            docs = {"documents": DOCS}
            assert first.put(f"/v1/collections/{name}/documents", json=docs).is_success
        before = {
            name: first.post(f"/v1/collections/{name}/search", json=QUERY).json()
            for name in names
        }
    with TestClient(create_app(settings, embedder=embedder)) as again:
        for name in names:
            answer = again.post(f"/v1/collections/{name}/search", json=QUERY)
            assert answer.status_code == 200, answer.text
            assert answer.json()["hits"] == before[name]["hits"]
        ready = poll(lambda: again.get("/readyz"), 200)
        assert (ready.json()["loading"], ready.json()["collections"]) == ([], 2)
        listed = again.get("/v1/collections").json()["data"]
        assert [(c["name"], c["status"]) for c in listed] == [
            (n, "ready") for n in names
        ]


@needs_milvus
@pytest.mark.slow
@pytest.mark.parametrize("engine", ["milvus", "milvus-engine"])
def test_k_and_candidates_up_to_milvus_cap_and_not_one_past(
    tmp_path: Path, embedder: Any, engine: str, request: pytest.FixtureRequest
) -> None:
    """Milvus accepts a search of top ``MILVUS_TOP_K`` (``ef`` raised to it on HNSW);
    one past is a 422 naming the limit, never a call Milvus would refuse."""
    if engine == "milvus-engine":  # FLAT: Lite 2.x has no HNSW
        where = {"milvus_uri": request.getfixturevalue("engine_uri")}
    else:
        where = {"milvus_uri": str(tmp_path / "milvus.db"), "index_type": "hnsw"}
    settings = Settings(
        data_dir=tmp_path / "data",
        storage="milvus",
        limits=Limits(max_k=MILVUS_TOP_K),
        **where,
    )
    client = app_on(settings, embedder)
    try:
        at = {**QUERY, "k": MILVUS_TOP_K, "candidates": MILVUS_TOP_K}
        found = client.post(f"{URL}/search", json=at)
        assert found.status_code == 200, found.text
        assert len(found.json()["hits"]) == len(DOCS)
        for field in ("k", "candidates"):
            past = {**at, field: MILVUS_TOP_K + 1}
            body = assert_problem(client.post(f"{URL}/search", json=past), 422)
            assert str(MILVUS_TOP_K) in body["detail"], body
    finally:
        client.__exit__(None, None, None)


# -- schema version ---------------------------------------------------------------------
if HAS_MILVUS:  # Milvus Lite 3.x and the real engine
    from tests.collections.test_milvus import uri  # noqa: F401


@needs_milvus
def test_the_schema_version_is_recorded_and_an_older_one_migrated(uri: str) -> None:
    from app.collections.milvus_client import STATE, milvus_name
    from app.collections.milvus_state import SCHEMA_VERSION, read_meta, write_meta
    from app.exceptions import StorageUnavailableError
    from tests.collections.test_milvus import META, open_storage

    state = milvus_name("kb", STATE)
    storage = open_storage(uri)
    try:
        storage.create("kb", dict(META))
        assert read_meta(storage.client, state)["schema_version"] == SCHEMA_VERSION
        # version 1: written before normcal recorded a version (no row)
        storage.client.delete(
            state, filter='kind == "meta" and key == "schema_version"'
        )
        assert "schema_version" not in read_meta(storage.client, state)
        opened = storage.open("kb")
        assert opened.meta["schema_version"] == SCHEMA_VERSION
        assert read_meta(storage.client, state)["schema_version"] == SCHEMA_VERSION
        assert opened.meta["dim"] == META["dim"]  # the rest as it was
        # a newer normcal's collection is refused, naming both versions
        write_meta(storage.client, state, schema_version=SCHEMA_VERSION + 1)
        with pytest.raises(StorageUnavailableError) as refused:
            storage.open("kb")
        assert f"version {SCHEMA_VERSION + 1}" in refused.value.detail
        assert f"up to {SCHEMA_VERSION}" in refused.value.detail
        assert refused.value.retry_after is None  # waiting will not fix it
    finally:
        storage.close()


# -- consistency levels across replicas -------------------------------------------------
@pytest.fixture(params=["milvus-lite-server", "milvus-engine"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A Milvus server two clients share: ``milvus-lite server`` or the engine."""
    if request.param == "milvus-engine":
        yield str(request.getfixturevalue("engine_uri"))
        return
    from tests.support.milvus_lite import milvus_lite_server

    with milvus_lite_server(tmp_path / "server") as uri:
        yield uri


@needs_milvus
@pytest.mark.slow
@pytest.mark.parametrize("level", ["Strong", "Session", "Bounded", "Eventually"])
def test_what_each_consistency_level_guarantees_across_two_replicas(
    server: str, level: str
) -> None:
    """Two replicas (two clients of one server) reading at ``level``.

    * ``Strong``: a write acknowledged to one replica is seen by the other's next
      read;
    * ``Session``: a replica's next read sees its own acknowledged writes; the
      other replica sees them eventually;
    * ``Bounded``: the other replica sees them within Milvus's staleness bound
      (``common.gracefulTime``, 5 s by default) - eventually, as far as a test
      that does not time things can tell;
    * ``Eventually``: no bound; seen eventually.

    Milvus Lite (3.x, and 2.5.1's single-process engine) applies every write before
    it acknowledges it, so there every level behaves as ``Strong``: the weaker
    assertions are what a cluster guarantees.
    """
    from app.collections.milvus import MilvusStorage
    from app.collections.milvus_client import CallOptions
    from tests.collections.conftest import new_docs
    from tests.collections.test_milvus import META, load

    options = CallOptions(consistency=level)
    first, second = (MilvusStorage(server, load, options=options) for _ in range(2))
    try:
        kb = first.create("kb", dict(META))
        other = second.open("kb")
        kb.upsert(new_docs(["a"]))
        if level == "Strong":
            assert other.missing(["a"]) == []
        else:
            if level == "Session":
                assert kb.missing(["a"]) == []
            seen = poll_until(lambda: other.missing(["a"]) == [])
            assert seen, f"{level}: never seen by the other replica"
    finally:
        first.close()
        second.close()


def poll_until(condition: Any) -> bool:
    """Whether ``condition()`` holds within a generous deadline (polled)."""
    import time

    deadline = time.monotonic() + 60
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)  # polling a condition, not synchronising on time
    return True
