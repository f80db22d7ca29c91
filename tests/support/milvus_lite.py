"""``milvus-lite server`` on a loopback port, for tests of several Milvus clients."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def milvus_lite_server(data_dir: Path, port: int | None = None) -> Iterator[str]:
    """Run ``milvus-lite server`` on ``port`` (default: a free loopback one).

    Yields its URI once it answers; a second server on the same ``data_dir`` and
    port is the first one restarted.
    """
    with milvus_lite_process(data_dir, port) as (uri, _):
        yield uri


@contextmanager
def milvus_lite_process(
    data_dir: Path, port: int | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """:func:`milvus_lite_server`, and its process (e.g. to stop it with SIGSTOP)."""
    if port is None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    process = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "milvus-lite"),
            "server",
            "--data-dir",
            str(data_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            with socket.socket() as client:
                if client.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert process.poll() is None, "milvus-lite server exited"
            assert time.monotonic() < deadline, "milvus-lite server never listened"
            time.sleep(0.1)  # polling a condition, not synchronising on time
        yield f"http://127.0.0.1:{port}", process
    finally:
        process.terminate()
        process.wait(timeout=60)
