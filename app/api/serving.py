"""How ``normcal serve`` runs uvicorn so that slow or idle clients cannot wear it down.

uvicorn (h11) times out idle keep-alive connections, but not a client that never
finishes its request head, nor one that stops half-way through a body: each holds a
file descriptor (and up to ``max_body_bytes`` of buffered body) for ever. This
module adds those read deadlines, caps open connections (503 beyond the cap), keeps
the asyncio log from flooding when descriptors run out, and raises the process's
open-file limit to what the system allows. It also turns Nagle's algorithm off on
every connection (see :func:`no_delay`), and re-reads the API keys file on SIGHUP.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Literal, cast

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.api.keys import Keyring
from app.settings import Settings

logger = logging.getLogger(__name__)

Phase = Literal["head", "body"]


def no_delay(transport: asyncio.BaseTransport) -> None:
    """Send small writes at once (``TCP_NODELAY``) on a TCP connection.

    asyncio sets it only on sockets whose ``proto`` is ``IPPROTO_TCP``; the socket
    :func:`serve` binds (:func:`bind_socket`, as ``uvicorn.Config.bind_socket`` would)
    has proto 0, and so do the connections it accepts. With Nagle on, a response's
    body waited for the client to acknowledge its head, which a keep-alive client
    delays by ~40 ms: every request after a connection's first took 44 ms longer than
    it did work.
    """
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class ReadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on reading each request.

    The head must be complete within ``header_timeout`` seconds of the connection
    opening or of the first byte after a keep-alive pause, and the body within
    ``body_timeout`` seconds of the head. The deadline is not renewed by each byte,
    so trickling one byte at a time does not keep a connection alive. A connection
    that misses its deadline is closed. Use :meth:`with_deadlines`.
    """

    header_timeout = 10.0
    body_timeout = 60.0
    _phase: Phase | None = None
    _deadline: asyncio.TimerHandle | None = None

    @classmethod
    def with_deadlines(
        cls, *, header: float, body: float
    ) -> type[ReadDeadlineProtocol]:
        """A subclass with these deadlines (uvicorn instantiates a class per socket)."""
        attrs = {"header_timeout": header, "body_timeout": body}
        return cast("type[ReadDeadlineProtocol]", type(cls.__name__, (cls,), attrs))

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the head deadline as the connection opens; no Nagle delays."""
        no_delay(transport)
        super().connection_made(transport)
        self._watch()

    def data_received(self, data: bytes) -> None:
        """Feed h11, then follow the request into its next phase."""
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        """A response went out: the next request (or keep-alive idling) begins."""
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        """Drop the deadline with the connection."""
        self._set_phase(None)
        super().connection_lost(exc)

    def _watch(self) -> None:
        """Arm the deadline of the phase the client is in, once per phase."""
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._set_phase("body")
        elif state is h11.IDLE and self.timeout_keep_alive_task is None:
            self._set_phase("head")  # keep-alive idling has its own, shorter timer
        else:
            self._set_phase(None)

    def _set_phase(self, phase: Phase | None) -> None:
        if phase == self._phase:
            return
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._phase = phase
        if phase is not None and not self.transport.is_closing():
            timeout = self.header_timeout if phase == "head" else self.body_timeout
            self._deadline = self.loop.call_later(timeout, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        self.transport.close()


class RateLimitFilter(logging.Filter):
    """Let one record per message through each ``interval`` seconds; count the rest.

    When descriptors run out, asyncio logs "socket.accept() out of system resource"
    with a traceback for every failed accept, thousands a second (61 MB in 15 s).
    Records are keyed by their first line; the next one let through says how many
    were dropped.
    """

    def __init__(self, interval: float = 10.0, max_keys: int = 256) -> None:
        super().__init__()
        self.interval = interval
        self.max_keys = max_keys
        self._seen: dict[
            str, tuple[float, int]
        ] = {}  # key -> (last let through, dropped)
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is emitted."""
        message = record.getMessage()
        key = message.partition("\n")[0]
        now = time.monotonic()
        with self._lock:
            last, dropped = self._seen.get(key, (-self.interval, 0))
            if now - last < self.interval:
                self._seen[key] = (last, dropped + 1)
                return False
            if len(self._seen) >= self.max_keys:
                self._seen.clear()
            self._seen[key] = (now, 0)
        if dropped:
            record.msg = f"{message} ({dropped} more like this were not logged)"
            record.args = None
        return True


def raise_open_file_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; return the soft limit.

    Every connection and every open collection holds descriptors, and the usual
    soft limit (1024) is far below what the system allows a process.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as error:
            logger.warning(
                "could not raise the open file limit from %d: %s", soft, error
            )
            return soft
        logger.info("raised the open file limit from %d to %d", soft, target)
        return target
    return soft


def write_port_file(path: Path, port: int) -> None:
    """Write ``port`` to ``path`` atomically (readers never see a partial file)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(f"{port}\n", encoding="ascii")
    os.replace(partial, path)


class CannotListenError(Exception):
    """``normcal serve`` could not bind its address: the reason and what to do."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        reason = (error.strerror or str(error)).lower()
        super().__init__(f"cannot listen on {address}: {reason}; {_listen_hint(error)}")


def _listen_hint(error: OSError) -> str:
    if error.errno == errno.EADDRINUSE:
        return (
            "another process listens there (a normcal serve already running?): "
            "stop it, or choose another --port (NORMCAL_PORT)"
        )
    if error.errno == errno.EACCES:
        return "ports below 1024 need privileges: choose another --port (NORMCAL_PORT)"
    return "check --host and --port (NORMCAL_HOST, NORMCAL_PORT)"


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port``, as uvicorn would bind it.

    uvicorn logs a bind failure without the address and exits 3 (``sys.exit``);
    this raises :class:`CannotListenError`, which names the address.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise CannotListenError(host, port, error) from None
    sock.set_inheritable(True)
    return sock


def reload_keys_on_sighup(app: FastAPI) -> None:
    """SIGHUP re-reads ``NORMCAL_API_KEYS_FILE`` (rotation without a restart).

    Only when a keys file is set: otherwise SIGHUP keeps its default (the process
    ends, as when its terminal closes). uvicorn handles SIGINT and SIGTERM only.
    The handler runs on the main thread, between two steps of the event loop: the
    file is at most 1 MiB, and the keys in use are swapped in one assignment.
    """
    keyring = getattr(app.state, "keyring", None)
    if isinstance(keyring, Keyring) and keyring.path is not None:
        signal.signal(signal.SIGHUP, lambda _signum, _frame: keyring.reload())


def serve(
    app: FastAPI, settings: Settings, *, host: str, port: int, port_file: Path | None
) -> int:
    """Serve ``app`` until a signal stops it; return the process exit code.

    The socket is bound here, before the model loads, so ``port=0`` gets a free
    port from the kernel with no race, and ``port_file`` names it for callers. An
    address that cannot be bound raises :class:`CannotListenError`.
    """
    nofile = raise_open_file_limit()
    if nofile < settings.max_connections + 64:
        logger.warning(
            "open file limit %d leaves little room above max_connections=%d",
            nofile,
            settings.max_connections,
        )
    logging.getLogger("asyncio").addFilter(RateLimitFilter())
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=ReadDeadlineProtocol.with_deadlines(
            header=settings.header_timeout, body=settings.body_timeout
        ),
        # uvicorn answers 503 once this many connections are open, the requester's
        # included: +1 so that max_connections connections are all served.
        limit_concurrency=settings.max_connections + 1,
        timeout_keep_alive=settings.keepalive_timeout,
        log_config=None,  # keep configure_logging's handlers
        access_log=False,  # AccessLogMiddleware logs each request with its id
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=30,
    )
    server = uvicorn.Server(config)
    reload_keys_on_sighup(app)
    sock = bind_socket(host, port)
    bound = int(sock.getsockname()[1])
    # uvicorn says where it listens only when it binds itself.
    logger.info("normcal listening on http://%s:%d", host, bound)
    if port_file is not None:
        write_port_file(port_file, bound)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    return 0 if server.started else 3
