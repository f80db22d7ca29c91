"""Test helpers around the ``normcal serve`` subprocess (see :mod:`app.ops.process`)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

from app.ops.process import ServerProcess, wait_for_port_file

__all__ = ["ServerProcess", "refused_port", "wait_for_port_file"]


@contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port nobody listens on, for as long as the block runs.

    The socket is bound (so nothing else can take the port) but never listens, so
    connecting to it is refused.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])
