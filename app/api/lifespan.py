"""The lifespan owns every heavy resource: embedder, collections, CPU pool."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import TypedDict

from fastapi import FastAPI

from app.api.errors import job_error
from app.collections.backends import open_registry
from app.collections.base import Registry
from app.collections.index import limit_threads
from app.collections.registry import CollectionRegistry
from app.concurrency import CpuPool, lower_priority
from app.embedding import Embedder, InputType, SentenceTransformerEmbedder
from app.embedding.cache import CachedEmbedder, EmbeddingCache
from app.embedding.known import contradiction
from app.exceptions import StorageUnavailableError
from app.observability import Metrics
from app.profiles import load_default_profile, load_external_profile
from app.services import NO_DEFAULT_REASON, Context, Service
from app.settings import Settings
from calibration.profile import Profile

logger = logging.getLogger(__name__)

# Nice steps of the bulk pool's threads (bulk embeddings: upserts, fit jobs' queries)
# below the rest of the process: a search's thread then takes the core a document
# pass was using (app.embedding.batching, docs/performance.md).
BULK_NICE = 10


def bulk_thread(threads: int) -> None:
    """Set up one bulk pool thread: its FAISS threads, and its lower priority."""
    limit_threads(threads)
    lower_priority(BULK_NICE)


class ModelNameError(ValueError):
    """``NORMCAL_MODEL_NAME`` names a known model the files are not (one line)."""


class State(TypedDict):
    """Lifespan state, available to requests as ``request.state``."""

    service: Service


def load_embedder(settings: Settings) -> Embedder:
    """Load the configured model from local files with the configured backend."""
    prompts: dict[InputType, str] = {
        "query": settings.query_prompt,
        "document": settings.document_prompt,
    }
    if settings.embedding_backend == "onnx":
        from app.embedding.onnx_backend import OnnxEmbedder
        from app.embedding.onnx_export import ensure_onnx

        graph = ensure_onnx(settings.model_path, settings.data_dir, settings.onnx_path)
        return OnnxEmbedder(
            settings.model_path,
            graph,
            model_name=settings.model_name,
            prompts=prompts,
            batch_size=settings.embed_batch_size,
            max_batch_tokens=settings.embed_max_batch_tokens,
            threads=settings.embed_threads,
        )
    return SentenceTransformerEmbedder(
        settings.model_path,
        model_name=settings.model_name,
        prompts=prompts,
        batch_size=settings.embed_batch_size,
        max_batch_tokens=settings.embed_max_batch_tokens,
        device=settings.device,
        threads=settings.embed_threads,
        precision=settings.embed_precision,
    )


def _counted(registry: Registry[Profile]) -> str:
    """How many collections there are, for the start-up line; never raises.

    Milvus may be loading what its restart released, or not answer: start-up goes
    on (``/readyz`` says why) rather than fail on a log line.
    """
    try:
        return str(len(registry.names()))
    except StorageUnavailableError as error:
        return f"? ({error.detail})"


async def _wait_for_lexical_builds(registry: Registry[Profile], timeout: float) -> None:
    """Serve once the collections' in-memory BM25 indexes are built, or ``timeout`` s.

    A restarted server would otherwise answer its first searches from FTS5 while
    the builds run beside them (25-150 ms a search against ~20 ms at 11k documents,
    ``benchmarks/first_request.py``). The log names at most ten still building.
    """
    if not isinstance(registry, CollectionRegistry):  # Milvus scores BM25 itself
        return
    started = time.perf_counter()
    building = await asyncio.to_thread(registry.settle, timeout)
    waited = time.perf_counter() - started
    if building:  # a warning when the bound cut the wait short, not when it is 0
        more = len(building) - 10
        logger.log(
            logging.WARNING if timeout else logging.INFO,
            "lexical index still building after %.1fs (NORMCAL_LEXICAL_BUILD_WAIT_S)"
            " for %s%s: their searches score BM25 through FTS5, slower, until it is done",
            waited,
            ", ".join(building[:10]),
            f" and {more} more" if more > 0 else "",
        )
    else:
        logger.info("lexical indexes ready: start-up waited %.2fs for them", waited)


def freeze_start_up() -> None:
    """Put what start-up loaded out of the garbage collector's reach.

    The model, torch and scikit-learn (~0.5 M objects) live as long as the process;
    once frozen (after collecting start-up's own garbage), a full collection no
    longer walks them (~0.4 s, inside whichever request triggered it) and neither
    does the interpreter's exit (~2 s after every stop). Only for a process that
    loaded its model in the lifespan: tests sharing one model keep their collector.
    """
    gc.collect()
    gc.freeze()


def make_lifespan(
    settings: Settings,
    embedder: Embedder | None = None,
    metrics: Metrics | None = None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[State]]:
    """Build the lifespan; ``embedder`` lets tests share one loaded model."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[State]:
        # Logged here, not when the keys are read: a refused start-up (the data dir
        # busy, a bad setting) stays one line.
        logger.info("api keys: %s", app.state.keyring.summary())
        model = embedder if embedder is not None else load_embedder(settings)
        lie = contradiction(
            model.model_name, model.model_id, model.dim, settings.model_path
        )
        if lie is not None:  # `normcal serve` says it in one line before loading
            raise ModelNameError(lie)
        registry = open_registry(
            settings,
            model_name=model.model_name,
            model_id=model.model_id,
            dim=model.dim,
            load_calibrator=Profile.from_json,
        )
        pool = CpuPool(
            settings.worker_threads,
            settings.max_pending_jobs,
            initializer=partial(limit_threads, settings.embed_threads),
        )
        # The batcher bounds the bulk work it accepts by max_pending_jobs; each
        # request has at most one job here besides the lanes' micro-batches.
        bulk_pool = CpuPool(
            settings.worker_threads,
            settings.max_pending_jobs + settings.worker_threads,
            initializer=partial(bulk_thread, settings.embed_threads),
            name="normcal-cpu-bulk",
        )
        default = load_default_profile(model.model_name, model.model_id)
        external = load_external_profile(model.model_name, model.model_id)
        if isinstance(external, str):
            logger.warning("rerank serves the search default: %s", external)
        no_default = default if isinstance(default, str) else NO_DEFAULT_REASON
        if isinstance(default, str):
            logger.warning("search is uncalibrated until a fit: %s", default)
        elif default.agnostic_because is not None:
            logger.warning(
                "serving the model-agnostic default profile: %s",
                default.agnostic_because,
            )
        logger.info(
            "normcal ready: model %s (%s, dim %d), %s collections in %s (%s)",
            model.model_name,
            model.model_id,
            model.dim,
            _counted(registry),
            settings.data_dir if registry.backend == "local" else settings.milvus_uri,
            registry.backend,
        )
        if metrics is not None:
            model = metrics.instrument(model)  # counts forward passes: under the cache
            metrics.watch(registry)
        if settings.embed_cache_entries and settings.embed_cache_bytes:
            cache = EmbeddingCache(
                settings.embed_cache_entries, settings.embed_cache_bytes
            )
            model = CachedEmbedder(model, cache)
            if metrics is not None:
                metrics.watch_cache(cache.stats)
        context = Context(
            settings,
            model,
            registry,
            pool,
            bulk_pool=bulk_pool,
            default_profile=None if isinstance(default, str) else default.profile,
            no_default_reason=no_default,
            default_note=None
            if isinstance(default, str) or default.agnostic_because is None
            else f"model-agnostic default ({default.agnostic_because})",
            rerank_profile=None if isinstance(external, str) else external,
            no_rerank_reason=external if isinstance(external, str) else None,
            metrics=metrics,
            job_error=job_error,
        )
        context.fit_jobs.open()  # fails the jobs a previous process left unfinished
        if metrics is not None:
            metrics.watch_drift(context.drift.samples)
        # Opening the collections began their builds; they ran while the rest loaded.
        await _wait_for_lexical_builds(registry, settings.lexical_build_wait_s)
        if embedder is None:  # this process is the server's: start-up is over
            # The access log's route templates come from the OpenAPI document
            # (~0.2 s to render): here, not inside the first request.
            app.openapi()
            freeze_start_up()
        try:
            yield {"service": Service(context)}
        finally:
            # Reverse order: stop fit jobs, finish CPU work, then close the storage
            # (SQLite files, or the Milvus client) cleanly.
            await context.fit_jobs.close()
            if metrics is not None:
                metrics.watch(None)
                metrics.watch_drift(None)
                metrics.watch_cache(None)
            bulk_pool.shutdown()
            pool.shutdown()
            registry.close()
            logger.info("normcal stopped")

    return lifespan
