"""Concurrency primitives: a readers-writer lock, a bounded CPU pool, a keyed gate.

CPU work (embedding, FAISS, fitting) never runs on the event loop. The pool refuses
work beyond ``max_pending`` queued jobs with :class:`OverloadedError` (HTTP 503 +
``Retry-After``) instead of queueing forever. The gate lets only so many jobs of one
key (a collection's metadata filters) into the pool at once.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from typing import ParamSpec, TypeVar

from app.exceptions import OverloadedError

P = ParamSpec("P")
T = TypeVar("T")

logger = logging.getLogger(__name__)


def lower_priority(steps: int) -> bool:
    """Lower the calling thread's CPU priority by ``steps`` nice steps, for good.

    On Linux the nice value belongs to each thread (``setpriority(2)`` on its thread
    id), so one pool's threads can give way to the rest of the process: where they
    compete for a core, a thread at nice 10 gets about a tenth of what one at 0
    gets. Threads it starts inherit it. Taking it back needs a privilege, so only a
    thread that does nothing but background work calls this. Elsewhere, or if the
    system refuses, nothing changes; returns whether it did.
    """
    if sys.platform != "linux" or steps <= 0:
        return False
    tid = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, now + steps))
    except OSError as error:
        logger.warning("could not lower a background thread's priority: %s", error)
        return False
    return True


class RWLock:
    """Many readers or one writer; a waiting writer blocks new readers."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        """Hold the lock shared."""
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        """Hold the lock exclusively."""
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class CpuPool:
    """A thread pool with a bound on queued work.

    Parameters
    ----------
    workers : int
        Threads running CPU-bound jobs.
    max_pending : int
        Jobs (running or queued) beyond which :meth:`run` raises ``OverloadedError``.
    initializer : callable, optional
        Run once in each thread as it starts (per-thread library settings).
    name : str
        Prefix of its threads' names.
    """

    def __init__(
        self,
        workers: int,
        max_pending: int,
        initializer: Callable[[], object] | None = None,
        name: str = "normcal-cpu",
    ) -> None:
        self._executor = ThreadPoolExecutor(
            workers, thread_name_prefix=name, initializer=initializer
        )
        self._max_pending = max_pending
        self._pending = 0
        self._lock = threading.Lock()

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet finished."""
        return self._pending

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` in the pool and await its result."""
        with self._lock:
            if self._pending >= self._max_pending:
                raise OverloadedError(
                    f"{self._pending} jobs are already queued; retry shortly",
                    retry_after=1,
                )
            self._pending += 1
        ctx = contextvars.copy_context()
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self._executor, lambda: ctx.run(fn, *args, **kwargs)
            )
        finally:
            with self._lock:
                self._pending -= 1

    def shutdown(self) -> None:
        """Wait for running jobs, then stop the threads."""
        self._executor.shutdown(wait=True, cancel_futures=True)


class KeyedGate:
    """At most ``per_key`` holders of one key at once; the others wait their turn.

    A waiter holds no thread (it awaits on the event loop, before its job enters
    the pool), so a key's queue never occupies the workers other keys need. Beyond
    ``max_waiting`` waiters in all, :meth:`hold` raises :class:`OverloadedError`.
    Used from the event loop only.
    """

    def __init__(self, per_key: int, max_waiting: int) -> None:
        self._per_key = per_key
        self._max_waiting = max_waiting
        self._gates: dict[str, asyncio.Semaphore] = {}
        self._users: dict[str, int] = {}  # holders and waiters, per key
        self._waiting = 0

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Hold one of ``key``'s places for the block, once it is free."""
        gate = self._gates.setdefault(key, asyncio.Semaphore(self._per_key))
        if gate.locked() and self._waiting >= self._max_waiting:
            raise OverloadedError(
                f"{self._waiting} requests are already waiting for their turn; "
                "retry shortly",
                retry_after=1,
            )
        self._users[key] = self._users.get(key, 0) + 1
        try:
            self._waiting += 1
            try:
                await gate.acquire()
            finally:
                self._waiting -= 1
            try:
                yield
            finally:
                gate.release()
        finally:
            self._users[key] -= 1
            if not self._users[key]:  # no one left: forget the key
                del self._users[key], self._gates[key]
