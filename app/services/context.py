"""The state the service's parts share, and the calibrator every part reports.

``Context`` is built once by the lifespan; each part (``app.services.documents`` and
the others) is a ``Part`` over it, so a use case reads ``self.registry`` or
``self.batcher`` whichever part it lives in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TypeVar

from app.collections.base import CollectionBackend, Registry, own_vectors
from app.collections.snapshots import Snapshots
from app.concurrency import CpuPool, KeyedGate
from app.embedding import Embedder
from app.embedding.batching import EmbedBatcher, lanes_for
from app.exceptions import StorageLoadingError
from app.observability import Metrics
from app.profiles import agnostic_profile
from app.schemas import filters
from app.schemas.collections import CalibratorRef, DriftStatus, Guarantee, NextStep
from app.schemas.judging import QueryLogSettings
from app.services.drift import DriftMonitor
from app.services.jobs import JOBS_FILE, Describe, FitJobs
from app.services.next_query import FIT_MIN_QUERIES
from app.settings import Settings
from calibration.profile import Profile

DEFAULT_PAGE_SIZE = 100  # items per page of a listing without a limit
NO_DEFAULT_REASON = "no calibration profile ships for this embedding model"
JUDGE_PAGE = "/ui/collections/{name}/judge"
LOAD_POLL_S = 0.05  # seconds between looks at a storage load a request waits for
T = TypeVar("T")


@dataclass
class Context:
    """The state every part of the service shares, owned by the app's lifespan."""

    settings: Settings
    embedder: Embedder
    registry: Registry[Profile]
    pool: CpuPool
    # Where bulk embeddings run (``EmbedBatcher``'s ``bulk_pool``); ``pool`` if None.
    bulk_pool: CpuPool | None = None
    default_profile: Profile | None = None
    # Why no shipped profile serves this model (``app.profiles.load_default_profile``).
    no_default_reason: str = NO_DEFAULT_REASON
    # Why the default is the model-agnostic one (None: the model's own profile).
    default_note: str | None = None
    # The shipped default for candidate lists of other retrievers (POST /v1/rerank),
    # and why there is none (rerank then scores lists with the search default).
    rerank_profile: Profile | None = None
    no_rerank_reason: str | None = None
    # Prometheus metrics of the app; the calibrator fit calls metrics.observe_fit.
    metrics: Metrics | None = None
    # Only the local backend has snapshots (files of SQLite's online backup).
    snapshots: Snapshots | None = field(init=False)
    # Every embedding goes through it, so concurrent requests share forward passes.
    batcher: EmbedBatcher = field(init=False)
    fit_jobs: FitJobs = field(init=False)
    # The served queries each collection's calibrator is compared with (in memory).
    drift: DriftMonitor = field(init=False)
    # How a failed fit job is recorded: the HTTP layer's error table renders it.
    job_error: Describe = field(kw_only=True)
    # Metadata filters' scans of one collection, a few at a time (filter_turn).
    filter_gate: KeyedGate = field(init=False)

    def __post_init__(self) -> None:
        self.snapshots = self.registry.snapshots
        workers = self.settings.worker_threads
        self.filter_gate = KeyedGate(
            self.settings.filter_jobs_per_collection or max(1, workers - 1),
            self.settings.max_pending_jobs,
        )
        self.fit_jobs = FitJobs(
            self.settings.data_dir / JOBS_FILE, self.settings.limits, self.job_error
        )
        self.drift = DriftMonitor(
            self.settings.drift_window, self.settings.drift_min_queries
        )
        self.batcher = EmbedBatcher(
            self.embedder,
            self.pool,
            max_texts=self.settings.embed_batch_size,
            window=self.settings.embed_batch_window_ms / 1000,
            max_queued=self.settings.max_pending_jobs,
            lanes=lanes_for(self.settings.embed_threads, self.settings.worker_threads),
            enabled=self.settings.embed_batching,
            max_tokens=self.settings.embed_max_batch_tokens,
            bulk_pool=self.bulk_pool,
        )


class Part:
    """A part of the service (one resource's use cases) over the shared ``Context``.

    The properties read the context, so every part sees the same registry, pool,
    batcher and fit jobs; the methods below say which calibrator serves a
    collection, which collections, search, judging and calibrators all report.
    """

    def __init__(self, context: Context) -> None:
        self.context = context

    @property
    def settings(self) -> Settings:
        """The service's settings."""
        return self.context.settings

    @property
    def embedder(self) -> Embedder:
        """The serving model."""
        return self.context.embedder

    @property
    def registry(self) -> Registry[Profile]:
        """The collections."""
        return self.context.registry

    @property
    def pool(self) -> CpuPool:
        """The bounded pool every CPU-bound step runs in."""
        return self.context.pool

    @property
    def batcher(self) -> EmbedBatcher:
        """The batcher every embedding goes through."""
        return self.context.batcher

    @property
    def fit_jobs(self) -> FitJobs:
        """The fit jobs of every collection."""
        return self.context.fit_jobs

    @property
    def drift(self) -> DriftMonitor:
        """The served-query windows of the drift check."""
        return self.context.drift

    @property
    def snapshots(self) -> Snapshots | None:
        """The snapshots (``None`` off the local backend)."""
        return self.context.snapshots

    @property
    def metrics(self) -> Metrics | None:
        """The app's Prometheus metrics, if it has them."""
        return self.context.metrics

    @property
    def default_profile(self) -> Profile | None:
        """The shipped default profile of the serving model, if one fits it."""
        return self.context.default_profile

    @property
    def no_default_reason(self) -> str:
        """Why no shipped profile serves this model."""
        return self.context.no_default_reason

    async def after_loads(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()``, tried again when it found a collection being loaded.

        A restarted Milvus releases its collections; the request waits for the load
        under way (never holding a thread: the event is polled), then tries again,
        for at most ``NORMCAL_MILVUS_LOAD_WAIT_S`` in all. Past that, the
        :class:`~app.exceptions.StorageLoadingError` is the answer: a 503 with
        ``Retry-After``.
        """
        deadline = time.monotonic() + self.settings.milvus_load_wait_s
        while True:
            try:
                return await attempt()
            except StorageLoadingError as loading:
                while True:  # at least one pause: never a busy loop of retries
                    if time.monotonic() >= deadline:
                        raise
                    await asyncio.sleep(LOAD_POLL_S)
                    if loading.loaded.is_set():
                        break

    def filter_turn(
        self, name: str, where: filters.Node
    ) -> AbstractAsyncContextManager[object]:
        """Wait for collection ``name``'s turn to scan metadata by ``where``.

        Only NORMCAL_FILTER_JOBS_PER_COLLECTION filtered jobs of one collection
        enter the pool at once (by default one worker fewer than there are), so a
        flood of costly filters on one collection leaves other collections a
        worker. No filter: no turn to wait for.
        """
        if where == filters.MATCH_ALL:
            return nullcontext()
        return self.context.filter_gate.hold(name)

    def _profile_for(self, collection: CollectionBackend[Profile]) -> Profile | None:
        if collection.state.profile is not None:
            return collection.state.profile
        return self._default_for(collection)

    def _default_for(self, collection: CollectionBackend[Profile]) -> Profile | None:
        """The shipped default profile, if it was fitted for the collection's model."""
        if own_vectors(collection.meta):
            return agnostic_profile(str(collection.meta["model"]))
        default = self.default_profile
        if default is not None and default.model == collection.meta.get("model"):
            return default
        return None

    def _own_vectors_note(self, collection: CollectionBackend[Profile]) -> str | None:
        """Why a collection of the client's own vectors gets the model-agnostic default."""
        if not own_vectors(collection.meta):
            return None
        return (
            "model-agnostic default: the vectors are the client's own, from model "
            f"{collection.meta['model']!r}, for which no profile ships"
        )

    def _calibrator_ref(
        self,
        collection: str,
        profile: Profile | None,
        *,
        drift: DriftStatus | None = None,
        reason: str | None = None,
    ) -> CalibratorRef:
        """The ref of ``profile``; ``reason`` only for the client's own vectors.

        ``reason`` says why the default in use is the model-agnostic one, or why no
        calibrator serves. Such a ref offers no judging page: it embeds queries with
        the server's model.
        """
        if reason is None:
            return _calibrator_ref(
                collection,
                profile,
                self.no_default_reason,
                drift,
                self.context.default_note,
            )
        if profile is None:
            return CalibratorRef(status="none", default=False, reason=reason)
        ref = _calibrator_ref(collection, profile, reason, drift, reason)
        return ref.model_copy(update={"next_step": None})


def query_log_settings(collection: CollectionBackend[Profile]) -> QueryLogSettings:
    """The stored query log settings (the defaults, off, when never set)."""
    return QueryLogSettings.model_validate(collection.meta.get("query_log", {}))


def judging_step(collection: str) -> NextStep:
    """The judging loop, offered until the collection has a fit of its own."""
    return NextStep(
        action="judge",
        url=JUDGE_PAGE.format(name=collection),
        detail=f"judge {FIT_MIN_QUERIES}-10 queries there, then fit: the "
        "probabilities get this collection's level",
    )


def _calibrator_ref(
    collection: str,
    profile: Profile | None,
    no_default_reason: str,
    drift: DriftStatus | None,
    default_note: str | None = None,
) -> CalibratorRef:
    """Status of the calibrator in use (see ``CalibratorRef``)."""
    if profile is None:
        return CalibratorRef(
            status="none",
            default=False,
            reason=f"{no_default_reason}; fit one from judgments "
            "(POST .../calibrators)",
            next_step=judging_step(collection),
        )
    policy = None if profile.default else profile.certified_policy
    return CalibratorRef(
        status="default" if profile.default else "fitted",
        id=profile.id,
        method=profile.method,
        default=profile.default,
        reorders_hits=profile.reorders_hits,
        n_queries=None if profile.default else profile.report.n_queries,
        guarantee=None
        if policy is None
        else Guarantee(
            target=policy.target_risk,
            delta=policy.delta,
            n_queries=policy.n_calibration,
        ),
        reason=default_note if profile.default else None,
        drift=drift,
        next_step=judging_step(collection) if profile.default else None,
    )
