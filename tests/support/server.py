"""Test helpers around the ``normcal serve`` subprocess (see :mod:`app.cli.process`)."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from app.cli import process
from app.cli.process import Process, wait_for_port_file, wait_ready
from tests.support import zygote

__all__ = [
    "ServerProcess",
    "refused_port",
    "run_cli",
    "source_env",
    "wait_for_port_file",
    "wait_ready",
]

REPO = Path(__file__).resolve().parents[2]


def source_env(**extra: str) -> dict[str, str]:
    """``os.environ`` for a Python subprocess that imports this checkout.

    The checkout comes first on the path (``tests.*`` imports, and ``app`` from here
    even if the venv was installed from another tree); ``normcal_client`` comes from
    the venv, where ``make install`` put it from ``clients/python``.
    """
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), **extra}


class ServerProcess(process.ServerProcess):
    """:class:`app.cli.process.ServerProcess`, forked from a pre-imported interpreter
    (:mod:`tests.support.zygote`): the same server without ~10 s of imports a start.
    Its environment is :func:`source_env`'s, as :func:`run_cli`'s, so that servers and
    CLI runs fork from one zygote."""

    def __init__(self, data_dir: Path, *, env: dict[str, str] | None = None, **kw: Any):
        super().__init__(data_dir, env={**source_env(), **(env or {})}, **kw)

    def spawn(self, cmd: list[str]) -> Process:
        forked = zygote.spawn(cmd, self.env, self.log, self.nofile)
        return forked if forked is not None else super().spawn(cmd)


def run_cli(*args: str, timeout: float, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m app.cli ARGS`` run to its end, as ``subprocess.run(...,
    capture_output=True, text=True)`` would, forked from the zygote (or started
    afresh where none can fork); ``env`` on top of :func:`source_env`."""
    cmd = [sys.executable, "-m", "app.cli", *args]
    environ = source_env(HF_HUB_OFFLINE="1", **env)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = zygote.spawn(cmd, environ, err, None, stdout=out)
        if proc is None:
            return subprocess.run(
                cmd, env=environ, capture_output=True, text=True, timeout=timeout
            )
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            raise
        return subprocess.CompletedProcess(cmd, code, _text(out), _text(err))


def _text(stream: IO[bytes]) -> str:
    """What ``text=True`` reads: the locale's encoding, universal newlines."""
    stream.seek(0)
    with io.TextIOWrapper(stream, encoding=None) as text:  # closes ``stream``
        return text.read()


@contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port nobody listens on, for as long as the block runs.

    The socket is bound (so nothing else can take the port) but never listens, so
    connecting to it is refused.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])
