"""Test helpers around the ``normcal serve`` subprocess (see :mod:`app.cli.process`)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.cli import process
from app.cli.process import Process, wait_for_port_file, wait_ready
from tests.support import zygote

__all__ = [
    "ServerProcess",
    "refused_port",
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
    (:mod:`tests.support.zygote`): the same server without ~10 s of imports a start."""

    def spawn(self, cmd: list[str]) -> Process:
        forked = zygote.spawn(cmd, self.env, self.log, self.nofile)
        return forked if forked is not None else super().spawn(cmd)


@contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port nobody listens on, for as long as the block runs.

    The socket is bound (so nothing else can take the port) but never listens, so
    connecting to it is refused.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])
