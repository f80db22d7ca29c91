"""Shared fixtures: the embedder, settings, app and client; markers by what a test needs.

``embedder`` is the real bundled model (loaded once per session) unless the module
is marked ``fake_embedder``, which gets the deterministic :class:`tests.support.fakes.HashEmbedder`.
Tests that end up with the real model are marked ``model`` at collection, so
``pytest -m "not model"`` runs everything that needs no model at all.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

# The real Milvus engine's session server and the per-test emptied URI (fixtures).
from tests.support.milvus_engine import engine_uri, milvus_engine  # noqa: F401

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The suite compares embeddings with sentence-transformers' own to 1e-5 and must give
# the same figures on every CPU: the model runs fp32 unless a test (tests/embedding/
# test_precision.py) asks for auto or bf16. Server subprocesses inherit it.
os.environ.setdefault("NORMCAL_EMBED_PRECISION", "fp32")

REPO = Path(__file__).resolve().parents[1]
# Each test file's seconds in a whole run (``make test-seconds``), to start the
# longest first.
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")
SHARED_DATA = Path(
    os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data")
)


@pytest.fixture(autouse=True)
def clean_environ() -> Iterator[None]:
    """Snapshot and restore ``os.environ`` around every test."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that gets the real model ``model``; a server test loads it
    too, in its subprocess, and is slow. Every test gets its own node id. The
    longest files come first (:func:`_longest_files_first`)."""
    _name_node_ids_after_their_items(items)
    for item in items:
        server = item.get_closest_marker("server") is not None
        if server or _uses_real_model(item):
            item.add_marker(pytest.mark.model)
        if server:
            item.add_marker(pytest.mark.slow)
    _longest_files_first(items)


def _longest_files_first(items: list[pytest.Item]) -> None:
    """Order the files by their measured seconds (``FILE_SECONDS``), longest first,
    each file's tests in their own order.

    pytest-xdist hands whole files to workers in collection order (``make test``
    passes ``--no-loadscope-reorder``; its own order is by number of tests, which
    left a 6-test file of four minutes to the end, one core idle meanwhile). A file
    not measured yet counts one second a test.
    """
    seconds: dict[str, float] = json.loads(FILE_SECONDS.read_text())
    counts = Counter(item.nodeid.split("::")[0] for item in items)
    place = {path: i for i, path in enumerate(dict.fromkeys(counts))}

    def cost(item: pytest.Item) -> tuple[float, int]:
        path = item.nodeid.split("::")[0]
        return -seconds.get(path, counts[path]), place[path]

    items.sort(key=cost)  # stable: a file's tests keep their order


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With ``NORMCAL_TEST_SECONDS_OUT=path``, write each file's seconds there (setup,
    call and teardown of its tests; the controller hears every worker's reports) in
    ``FILE_SECONDS``'s format: ``make test-seconds`` refreshes it."""
    out = os.environ.get("NORMCAL_TEST_SECONDS_OUT")
    if out and not hasattr(session.config, "workerinput"):
        measured = {path: round(s, 1) for path, s in sorted(_SECONDS.items())}
        Path(out).write_text(json.dumps(measured, indent=0) + "\n")


_SECONDS: Counter[str] = Counter()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SECONDS[report.nodeid.split("::")[0]] += report.duration


def _name_node_ids_after_their_items(items: list[pytest.Item]) -> None:
    """Give each item the node id its name says, and fail on a duplicate.

    pytest 9 builds a test's id from its function's name and its ``parametrize``
    ids; schemathesis names each API operation's test ``test[GET /path]`` outside
    both, so its 45 tests shared one id, and pytest-xdist's per-file scheduling
    (``--dist loadfile``, ``make test``) keeps one test per id: it ran one of them.
    """
    for item in items:
        if not isinstance(item, pytest.Function) or item.nodeid.endswith(item.name):
            continue
        suffix = item.name.removeprefix(item.originalname)
        if suffix.startswith("[") and suffix.endswith("]"):
            assert item.parent is not None
            # pytest's own construction (Function.__init__), with the name's params.
            item._id = item.parent.id.child(item.originalname).with_params(suffix[1:-1])
    twice = sorted(
        i for i, n in Counter(item.nodeid for item in items).items() if n > 1
    )
    if twice:
        raise pytest.UsageError(
            f"tests share a node id (pytest-xdist would run one of each): {twice[:5]}"
        )


def _uses_real_model(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    if "real_embedder" in names:
        return True
    return "embedder" in names and item.get_closest_marker("fake_embedder") is None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection imported (torch, scikit-learn, every test module), as
    ``normcal serve`` freezes its start-up: a full collection no longer walks it
    (~0.4 s each, ~15% of a worker's CPU before)."""
    from app.api.lifespan import freeze_start_up

    freeze_start_up()


@pytest.fixture(scope="session")
def real_embedder():
    """The real all-MiniLM-L6-v2 embedder, loaded once per test session (and frozen
    with the rest of start-up, see :func:`pytest_collection_finish`)."""
    from app.api.lifespan import freeze_start_up, load_embedder
    from app.settings import Settings

    model = load_embedder(Settings())
    freeze_start_up()
    return model


@pytest.fixture(scope="module")
def embedder(request: pytest.FixtureRequest):
    """The embedder the module asked for: the fake if marked ``fake_embedder``."""
    if request.node.get_closest_marker("fake_embedder") is not None:
        from tests.support.fakes import HashEmbedder

        return HashEmbedder()
    return request.getfixturevalue("real_embedder")


@pytest.fixture
def settings(tmp_path: Path):
    from app.settings import Settings

    return Settings(data_dir=tmp_path / "data")


@pytest.fixture
def app(settings, embedder):
    from app.api.app import create_app

    return create_app(settings, embedder=embedder)


@pytest.fixture
def client(app):
    from fastapi.testclient import TestClient

    with TestClient(app) as c:
        yield c


@pytest.fixture(scope="session")
def chromium() -> str:
    """Path of chromium for the browser tests (tests/ui, tests/faults), installed from
    Debian's packages when absent (root only); skip when it cannot be had."""
    found = shutil.which("chromium")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"],
            check=False,
            env=env,
            timeout=900,
        )
        found = shutil.which("chromium")
    if found is None:
        pytest.skip("chromium is not installed and could not be installed here")
    return found


def shared_dataset(name: str) -> Path:
    """Path of a staged dataset, or skip when it is absent: the suite passes
    without the data; CI sets ``NORMCAL_SHARED_DATA`` so these tests run."""
    path = SHARED_DATA / name
    if not (path / "corpus.jsonl").exists():
        pytest.skip(
            f"{path} not available (set NORMCAL_SHARED_DATA; default ../shared/data)"
        )
    return path


def alter_sqlite(path: Path, *statements: str) -> None:
    """Run ``statements`` on the SQLite file ``path`` in one commit (crafting files)."""
    conn = sqlite3.connect(path)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


def assert_problem(response, status: int = 422) -> dict:
    """Check an RFC 9457 problem+json response with ``status``; return its body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body["title"] and body["detail"]
    assert body["type"].startswith("/problems/")
    # A 500 is answered by Starlette's outermost middleware, past the request-id one.
    request_id = response.headers.get("x-request-id", body["instance"].split(":")[-1])
    assert body["instance"] == f"urn:request:{request_id}"
    return body
