"""Batching across requests: concurrent small embeds share one forward pass.

A forward pass of 16 queries costs little more than one on a CPU, so embedding each
single-query search alone wastes most of the machine under load. The
:class:`EmbedBatcher` runs up to ``lanes`` passes at a time on the CPU pool (one lane
per core when a pass runs on one thread, ``NORMCAL_EMBED_THREADS=1``; one lane when a
pass already uses every core): a request that finds a lane free starts a pass at
once, so an idle service adds no latency; requests arriving while every lane is busy
queue up, and the next pass takes every queued request of the same input type, up to
``max_texts`` texts. ``window`` optionally holds a *following* pass back a moment so
stragglers join it; it never delays a request that finds the batcher idle.

An interactive request longer than ``max_texts`` goes through in chunks, one after
the other, so a large one cannot hold a waiting search back for more than one pass.

A caller that would find the batcher idle may take a lane for itself
(:meth:`EmbedBatcher.lane`) and run its pass inside a pool job of its own, beside its
other work: a lone search then hands one job to the pool, not two (its pass, then
its collection search and scoring).

**Priority.** Each request says who waits for it (:data:`Priority`): ``interactive``
(the default: a search, a rerank, ``/v1/embed``, the judging page; someone is
waiting for the answer) or ``bulk`` (an upsert, a fit job's queries). The priority
is the request's kind, not its input type: a rerank's candidates are documents,
embedded at interactive priority. Everything above is the interactive side. Bulk
requests never share its lanes or its queue:

- a bulk request is cut into *micro-batches*, one forward pass each, by the same
  token budget as the model's passes (``max_tokens`` padded tokens, ``max_texts``
  rows; its texts counted first, longest first, so padding stays small);
- micro-batches run on their own pool (``bulk_pool``, whose threads run at a lower
  OS priority, see ``app.api.lifespan``) on at most ``lanes`` bulk lanes, one after
  the other, oldest request first;
- a bulk lane starts its next micro-batch only if the interactive side leaves it
  room: while ``n`` interactive lanes are busy (passes, or lanes lent to searches),
  at most ``max(1, lanes - n)`` bulk micro-batches run. So a query never queues
  behind documents: it starts its pass at once on the interactive side, the bulk
  lane it needs stops at its current micro-batch's end (the OS priority lets the
  query's thread take the core meanwhile), and one bulk lane always runs, so an
  ingest keeps going under a stream of searches.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from app.concurrency import CpuPool
from app.embedding.base import Embedder, EmbeddingBatch, InputType, forward_passes
from app.embedding.cache import cached
from app.exceptions import OverloadedError

Priority = Literal["interactive", "bulk"]
"""Who waits for an embedding: a caller answering now, or bulk work (module docs)."""


@dataclass
class _Job:
    """One chunk of a request, waiting for (or in) a pass."""

    texts: list[str]
    input_type: InputType
    future: asyncio.Future[EmbeddingBatch] = field(repr=False)


@dataclass
class _BulkJob:
    """A bulk request: its micro-batches still to run, and the ones done."""

    texts: list[str]
    input_type: InputType
    future: asyncio.Future[EmbeddingBatch] = field(repr=False)
    todo: deque[NDArray[np.int64]] = field(default_factory=deque)  # rows of each
    done: list[tuple[NDArray[np.int64], EmbeddingBatch]] = field(default_factory=list)
    running: int = 0

    def result(self) -> EmbeddingBatch:
        """The micro-batches' embeddings, back in the request's order."""
        rows = np.concatenate([r for r, _ in self.done])
        batch = concatenate([b for _, b in self.done])
        order = np.argsort(rows, kind="stable")
        return _take_rows(batch, order)


def lanes_for(threads: int, workers: int) -> int:
    """Passes to run at once: as many as the cores hold at ``threads`` per pass.

    ``threads`` 0 (one per core) gives one lane; never more than the pool's
    ``workers``, which run them.
    """
    if threads <= 0:
        return 1
    return max(1, min(workers, (os.cpu_count() or 1) // threads))


def concatenate(batches: list[EmbeddingBatch]) -> EmbeddingBatch:
    """The batches one after the other, as one batch."""
    if len(batches) == 1:
        return batches[0]
    return EmbeddingBatch(
        vectors=np.concatenate([b.vectors for b in batches]),
        norms=np.concatenate([b.norms for b in batches]),
        n_tokens=np.concatenate([b.n_tokens for b in batches]),
        truncated=np.concatenate([b.truncated for b in batches]),
    )


def _take_rows(batch: EmbeddingBatch, rows: NDArray[np.int64]) -> EmbeddingBatch:
    return EmbeddingBatch(
        vectors=batch.vectors[rows],
        norms=batch.norms[rows],
        n_tokens=batch.n_tokens[rows],
        truncated=batch.truncated[rows],
    )


def _slice(batch: EmbeddingBatch, start: int, stop: int) -> EmbeddingBatch:
    return EmbeddingBatch(
        vectors=batch.vectors[start:stop],
        norms=batch.norms[start:stop],
        n_tokens=batch.n_tokens[start:stop],
        truncated=batch.truncated[start:stop],
    )


class EmbedBatcher:
    """Embed through ``embedder`` on ``pool``, merging concurrent requests.

    Parameters
    ----------
    embedder : Embedder
        The model; any backend.
    pool : CpuPool
        Where passes run.
    max_texts : int
        Texts per pass at most (the model's batch size is a good choice).
    window : float
        Seconds a pass that follows another waits for more requests, unless it is
        already full; 0 takes what is queued at once.
    max_queued : int
        Chunks queued or in running passes beyond which a request gets
        ``OverloadedError`` (HTTP 503), as the pool counts its running jobs in its bound.
    lanes : int
        Passes that may run at once (each on its own pool thread), on each side:
        interactive passes on ``pool``, bulk micro-batches on ``bulk_pool``.
    enabled : bool
        False embeds each request on its own, as without a batcher (to compare),
        whatever its priority.
    max_tokens : int
        Padded tokens (rows x longest text) of one bulk micro-batch at most; the
        model's own pass budget is the right choice, so a micro-batch is one pass.
    bulk_pool : CpuPool, optional
        Where bulk micro-batches (and their token counts) run; ``pool`` if not given.
    """

    def __init__(
        self,
        embedder: Embedder,
        pool: CpuPool,
        *,
        max_texts: int,
        window: float = 0.0,
        max_queued: int = 64,
        lanes: int = 1,
        enabled: bool = True,
        max_tokens: int = 512,
        bulk_pool: CpuPool | None = None,
    ) -> None:
        self.embedder = embedder
        self.pool = pool
        self.max_texts = max_texts
        self.window = window
        self.max_queued = max_queued
        self.lanes = max(1, lanes)
        self.enabled = enabled
        self.max_tokens = max_tokens
        self.bulk_pool = bulk_pool or pool
        self._queue: deque[_Job] = deque()
        self._in_pass = 0  # requests in running passes
        # The interactive lanes in use: drainer tasks, and tokens of callers
        # holding a lane.
        self._drainers: set[object] = set()
        self._bulk: deque[_BulkJob] = deque()  # jobs with micro-batches to start
        self._bulk_in_flight = 0  # bulk requests accepted and not answered
        self._bulk_drainers: set[asyncio.Task[None]] = set()  # the bulk lanes in use

    @property
    def pending(self) -> int:
        """Interactive requests (chunks) queued for a pass, not counting running ones."""
        return sum(not job.future.done() for job in self._queue)

    @property
    def bulk_pending(self) -> int:
        """Bulk micro-batches not started yet."""
        return sum(len(job.todo) for job in self._bulk if not job.future.done())

    @contextmanager
    def lane(self, wanted: bool = True) -> Iterator[bool]:
        """A lane for a caller that runs its own pass in a pool job of its own.

        Yields True when ``wanted`` and an interactive request now would start its
        pass at once and alone (nothing queued, an interactive lane free; bulk
        work does not count), or when batching is off; the caller then embeds by
        calling the model itself, in its job. The lane counts as busy until the
        block ends, so requests arriving meanwhile queue for passes on the other
        lanes as usual, and bulk lanes give it room. Yields False otherwise: embed
        through :meth:`embed`.
        """
        if not wanted or not self.enabled:
            yield wanted
            return
        if self._queue or len(self._drainers) >= self.lanes:
            yield False
            return
        token = object()
        self._drainers.add(token)
        try:
            yield True
        finally:
            self._drainers.discard(token)
            self._wake()
            self._wake_bulk()

    def _wake(self) -> None:
        """Start a drainer on a free lane if requests are queued."""
        if self._queue and len(self._drainers) < self.lanes:
            self._drainers.add(asyncio.create_task(self._drain()))

    async def embed(
        self,
        texts: list[str],
        input_type: InputType,
        priority: Priority = "interactive",
    ) -> EmbeddingBatch:
        """Embed ``texts`` in order, sharing passes with concurrent requests.

        ``priority`` is who waits for them (:data:`Priority`); ``bulk`` work gives
        way to interactive work at each micro-batch.
        """
        known = cached(self.embedder, texts, input_type)
        if known is not None:  # every text cached: no pass, no lane, no pool job
            return known
        if not self.enabled or not texts:
            return await self.pool.run(self.embedder.embed, texts, input_type)
        if priority == "bulk":
            return await self._submit_bulk(texts, input_type)
        parts = []
        for start in range(0, len(texts), self.max_texts):
            chunk = texts[start : start + self.max_texts]
            parts.append(await self._submit(chunk, input_type))
        return concatenate(parts)

    def _check_bound(self) -> None:
        # Running passes count too, as running jobs count in the pool's bound; a
        # bulk request counts once, however many micro-batches it has.
        in_flight = self.pending + self._in_pass + self._bulk_in_flight
        if in_flight >= self.max_queued:
            raise OverloadedError(
                f"{in_flight} embeddings are already in flight; retry shortly",
                retry_after=1,
            )

    async def _submit(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        self._check_bound()
        job = _Job(texts, input_type, asyncio.get_running_loop().create_future())
        self._queue.append(job)
        self._wake()
        # A cancelled caller cancels its future; the drainer skips it or drops its
        # result, and the other requests carry on.
        return await job.future

    async def _drain(self) -> None:
        """Run passes one after the other until the queue is empty, then stop.

        Each lane is one drainer; the next request starts one again, so an idle
        batcher holds no task.
        """
        try:
            following = False
            while self._queue:
                if following and self.window > 0 and not self._full():
                    await asyncio.sleep(self.window)
                jobs = self._take()
                if jobs:
                    await self._run(jobs)
                following = True
        finally:
            # Only reached with jobs left if this task was cancelled (shutdown).
            while self._queue:
                self._queue.popleft().future.cancel()
            # Here, not in a done-callback: a request queued before that ran would
            # find every lane taken by drainers that have stopped.
            self._drainers.discard(asyncio.current_task())
            self._wake_bulk()

    def _full(self) -> bool:
        head = self._queue[0].input_type
        queued = sum(len(j.texts) for j in self._queue if j.input_type == head)
        return queued >= self.max_texts

    def _take(self) -> list[_Job]:
        """Take the next pass's requests; the rest stay queued.

        That is every live queued request of the oldest one's input type that still
        fits in ``max_texts``, oldest first.
        """
        while self._queue and self._queue[0].future.done():
            self._queue.popleft()  # its caller was cancelled
        if not self._queue:
            return []
        input_type = self._queue[0].input_type
        taken: list[_Job] = []
        kept: deque[_Job] = deque()
        n = 0
        for job in self._queue:
            if job.future.done():
                continue
            if job.input_type == input_type and n + len(job.texts) <= self.max_texts:
                taken.append(job)
                n += len(job.texts)
            else:
                kept.append(job)
        self._queue = kept
        return taken

    async def _run(self, jobs: list[_Job]) -> None:
        """Run one pass for ``jobs``.

        If it fails, each job runs again alone, so one bad request fails only itself.
        """
        texts = [t for job in jobs for t in job.texts]
        self._in_pass += len(jobs)
        try:
            batch = await self.pool.run(self.embedder.embed, texts, jobs[0].input_type)
        except asyncio.CancelledError:
            for job in jobs:
                job.future.cancel()
            raise
        except (
            OverloadedError
        ) as error:  # refused, not broken: retrying alone won't help
            for job in jobs:
                _settle(job, error=error)
            return
        except Exception as error:
            if len(jobs) == 1:
                _settle(jobs[0], error=error)
                return
            for job in jobs:
                if not job.future.done():
                    await self._run([job])
            return
        finally:
            self._in_pass -= len(jobs)
        start = 0
        for job in jobs:
            _settle(job, _slice(batch, start, start + len(job.texts)))
            start += len(job.texts)

    # -- bulk --------------------------------------------------------------------------
    async def _submit_bulk(
        self, texts: list[str], input_type: InputType
    ) -> EmbeddingBatch:
        """Cut ``texts`` into micro-batches, queue them, await them all."""
        self._check_bound()
        job = _BulkJob(texts, input_type, asyncio.get_running_loop().create_future())
        self._bulk_in_flight += 1
        try:
            counts = await self.bulk_pool.run(self.embedder.token_counts, texts)
            lengths = np.minimum(counts, self.embedder.max_seq_length)
            job.todo.extend(forward_passes(lengths, self.max_texts, self.max_tokens))
            self._bulk.append(job)
            self._wake_bulk()
            # A cancelled caller cancels its future; its micro-batches not started
            # are skipped, and the other requests carry on.
            return await job.future
        finally:
            self._bulk_in_flight -= 1

    def _bulk_room(self) -> int:
        """Bulk lanes the interactive side leaves: never fewer than one."""
        return max(1, self.lanes - len(self._drainers))

    def _wake_bulk(self) -> None:
        """Start bulk lanes while micro-batches wait and there is room."""
        while self.bulk_pending and len(self._bulk_drainers) < self._bulk_room():
            self._bulk_drainers.add(asyncio.create_task(self._drain_bulk()))

    async def _drain_bulk(self) -> None:
        """Run micro-batches one after the other while there is room, then stop.

        A lane beyond the room stops at its micro-batch's end (leaving the set at
        once, so the others see the room it left); interactive work starts the bulk
        lanes again as it ends.
        """
        try:
            while len(self._bulk_drainers) <= self._bulk_room():
                taken = self._take_bulk()
                if taken is None:
                    return
                await self._run_bulk(*taken)
        except asyncio.CancelledError:  # shutdown: nothing queued will run
            while self._bulk:
                self._bulk.popleft().future.cancel()
            raise
        finally:
            self._bulk_drainers.discard(asyncio.current_task())

    def _take_bulk(self) -> tuple[_BulkJob, NDArray[np.int64]] | None:
        """The oldest live job's next micro-batch (a job leaves once all started)."""
        while self._bulk:
            job = self._bulk[0]
            if job.future.done() or not job.todo:
                self._bulk.popleft()
                continue
            rows = job.todo.popleft()
            if not job.todo:
                self._bulk.popleft()
            return job, rows
        return None

    async def _run_bulk(self, job: _BulkJob, rows: NDArray[np.int64]) -> None:
        """Run one micro-batch; the job is answered when its last one is done."""
        texts = [job.texts[i] for i in rows]
        job.running += 1
        try:
            batch = await self.bulk_pool.run(self.embedder.embed, texts, job.input_type)
        except asyncio.CancelledError:
            job.future.cancel()
            raise
        except Exception as error:  # the request fails; its other micro-batches stop
            _settle(job, error=error)
            return
        finally:
            job.running -= 1
        job.done.append((rows, batch))
        if not job.todo and not job.running:
            _settle(job, job.result())


def _settle(
    job: _Job | _BulkJob,
    batch: EmbeddingBatch | None = None,
    *,
    error: BaseException | None = None,
) -> None:
    """Hand the caller its result or error, unless it stopped waiting."""
    if job.future.done():
        return
    if error is not None:
        job.future.set_exception(error)
    else:
        assert batch is not None
        job.future.set_result(batch)
