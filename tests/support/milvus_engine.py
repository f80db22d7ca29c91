"""The real Milvus engine for tests: milvus-lite 2.5.1's C++ server over TCP.

milvus-lite 3.x (what ``pip install normcal[milvus]`` gives, in ``.venv``) is a
pure-Python re-implementation; 2.5.1 ships the C++ engine (segcore, knowhere,
tantivy) as the executable ``milvus_lite/lib/milvus``, run as
``milvus <db-file> <host:port> <loglevel>``. Both packages import as ``milvus_lite``,
so 2.5.1 lives in its own environment (``make test`` builds ``.venv-milvus-engine``
from requirements/milvus-engine.txt; ``NORMCAL_TEST_MILVUS_ENGINE`` names another).
The executable is started directly, with its bundled libraries: nothing of that
environment is imported here.

One server per test session (:func:`milvus_engine`); :func:`engine_uri` gives a
test that server emptied of every collection, so tests share it without seeing
each other's collections.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENGINE_VERSION = "2.5.1"
_START_TIMEOUT = 120  # seconds for the server to answer a call after it is started


def engine_binary() -> Path | None:
    """The engine's executable in its environment, or ``None`` when not installed."""
    env = REPO / os.environ.get("NORMCAL_TEST_MILVUS_ENGINE", ".venv-milvus-engine")
    found = sorted(env.glob("lib/python3*/site-packages/milvus_lite/lib/milvus"))
    return found[0] if found else None


MISSING_REASON = (
    f"the real Milvus engine (milvus-lite {ENGINE_VERSION} in .venv-milvus-engine or "
    "$NORMCAL_TEST_MILVUS_ENGINE) is not installed: make .venv-milvus-engine/.installed"
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers(uri: str) -> bool:
    """Whether the server at ``uri`` serves a call (listening is not enough: the
    engine opens its port before its storage)."""
    from pymilvus import MilvusClient, MilvusException

    from app.collections.milvus_client import GRPC_OPTIONS

    try:
        client = MilvusClient(uri=uri, timeout=5, grpc_options=GRPC_OPTIONS)
    except MilvusException:
        return False
    try:
        client.list_collections()
        return True
    except MilvusException:
        return False
    finally:
        client.close()


@contextmanager
def engine_server(
    binary: Path, data_dir: Path, port: int | None = None
) -> Iterator[str]:
    """Run the engine on ``port`` (default: a free loopback one), its data in
    ``data_dir``; yields its URI once it answers, stops it after."""
    port = port or _free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    libs = str(binary.parent)
    env = {**os.environ, "LD_LIBRARY_PATH": libs}
    log = (data_dir / "milvus.log").open("wb")
    process = subprocess.Popen(
        [str(binary), str(data_dir / "milvus.db"), f"127.0.0.1:{port}", "ERROR"],
        cwd=data_dir,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + _START_TIMEOUT
        while not _answers(uri):
            assert process.poll() is None, (
                f"the Milvus engine exited ({process.returncode}); see {log.name}"
            )
            assert time.monotonic() < deadline, "the Milvus engine never answered"
            time.sleep(0.1)  # polling a condition, not synchronising on time
        yield uri
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture(scope="session")
def milvus_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URI of the session's real-engine server; skips (with the reason) when the
    engine's environment is not installed."""
    binary = engine_binary()
    if binary is None:
        pytest.skip(MISSING_REASON)
    with engine_server(binary, tmp_path_factory.mktemp("milvus-engine")) as uri:
        yield uri


def emptied(uri: str) -> str:
    """``uri``, its server emptied of every collection earlier tests left."""
    from pymilvus import MilvusClient

    from app.collections.milvus_client import GRPC_OPTIONS

    client = MilvusClient(uri=uri, grpc_options=GRPC_OPTIONS)
    try:
        for name in client.list_collections():
            client.drop_collection(name)
    finally:
        client.close()
    return uri


@pytest.fixture
def engine_uri(milvus_engine: str) -> str:
    """:func:`milvus_engine`, emptied of every collection earlier tests left."""
    return emptied(milvus_engine)
