"""Search: embed the queries, retrieve a pool, score it, pick hits by mode, cut.

It also records searched texts in the collection's query log (``app.services.judging``
sets the log up and judges from it), and each calibrated query's summary in the
collection's drift window (``app.services.drift``).
"""

from __future__ import annotations

import logging

import numpy as np
from numpy.typing import NDArray

from app.collections.base import CollectionBackend, Pool
from app.embedding import EmbeddingBatch
from app.exceptions import InvalidRequestError
from app.schemas import filters
from app.schemas.collections import CalibratorRef
from app.schemas.search import QueryInfo, SearchHit, SearchRequest, SearchResult
from app.services import limits, own_vectors
from app.services.calibrators import DEFAULT_FIT_K
from app.services.context import Part, query_log_settings
from calibration.drift import query_summary
from calibration.fusion import SearchMode, order_by_mode
from calibration.profile import Profile, Scored

logger = logging.getLogger(__name__)

DEFAULT_K = 10  # hits per search
# Default depth of the dense and BM25 lists a search draws candidates from: the depth
# calibrators are fitted at, so served pools look like the fitted ones.
POOL_DEPTH = DEFAULT_FIT_K


class SearchService(Part):
    """Calibrated search over a collection."""

    async def search(self, name: str, request: SearchRequest) -> list[SearchResult]:
        """Embed the queries; return each one's top-k hits with probabilities.

        A search that finds its collection being loaded (Milvus after a restart)
        waits for the load, bounded (:meth:`Part.after_loads`).
        """
        return await self.after_loads(lambda: self._search(name, request))

    async def _search(self, name: str, request: SearchRequest) -> list[SearchResult]:
        lim = self.settings.limits
        texts = request.texts
        sent = request.own_vectors
        k = request.k if request.k is not None else min(DEFAULT_K, lim.max_k)
        limits.check_value("k", k, lim.max_k)
        n = request.candidates
        if n is None:  # never above max_k, so a small max_k still has a default
            n = min(max(k, POOL_DEPTH), lim.max_k)
        limits.check_value("candidates", n, lim.max_k)
        if n < k:
            raise InvalidRequestError(
                f"candidates ({n}) must be at least k ({k})", field="candidates"
            )
        limits.check_count(
            "vectors" if request.vectors else "queries",
            texts or sent or [],
            lim.max_queries_per_search,
        )
        limits.check_texts("queries" if request.queries else "query", texts, lim)
        where = limits.parse_filter("filter", request.filter, lim)
        if filters.always(where) is True:  # no need to look at any metadata
            where = filters.MATCH_ALL
        collection = self.registry.get_compatible(name)
        own_vectors.check_kind(
            collection, sent is not None, "vectors" if request.vectors else "vector"
        )
        profile = self._profile_for(collection)  # one snapshot for the whole request
        reason = self._own_vectors_note(collection)
        if sent is not None and not texts:
            _check_vector_only(request)
            profile, reason = None, own_vectors.NO_QUERY_TEXT
        if profile is None and (
            request.min_probability is not None
            or request.target_precision is not None
            or request.mode == "hybrid"
        ):
            raise InvalidRequestError(
                "min_probability, target_precision and mode 'hybrid' need a "
                "calibrator; "
                + (
                    reason
                    or f"none is available for model {self.embedder.model_name!r}"
                ),
                field="mode" if request.mode == "hybrid" else "min_probability",
            )
        ref = self._calibrator_ref(
            name, profile, drift=self.drift.verdict(name, profile), reason=reason
        )
        async with self.filter_turn(name, where):
            with self.batcher.lane(wanted=sent is None) as alone:
                batched = (
                    None if alone else await self._query_batch(collection, request)
                )

                def answer() -> tuple[list[SearchResult], list[NDArray[np.float64]]]:
                    # With the batcher idle, the queries' pass runs in this job too:
                    # one hand-off to the pool, not three (each costs a search about
                    # half a millisecond here; docs/performance.md).
                    batch = (
                        self.embedder.embed(texts, "query")
                        if batched is None
                        else batched
                    )
                    pools = collection.search(
                        batch.vectors, texts or [""] * len(batch), n, where
                    )
                    return search_results(batch, pools, ref, profile, request, k)

                results, summaries = await self.pool.run(answer)
        self.drift.observe(name, profile, summaries)
        await self._log_queries(collection, texts)
        return results

    async def _query_batch(
        self, collection: CollectionBackend[Profile], request: SearchRequest
    ) -> EmbeddingBatch:
        """The queries embedded by the server's model, or their own vectors."""
        sent = request.own_vectors
        if sent is None:
            return await self.batcher.embed(request.texts, "query")
        texts: list[str | None] = list(request.texts) or [None] * len(sent)
        counts = await self.pool.run(own_vectors.token_counts, self.embedder, texts)
        fields = (
            ["vector"] if request.vector else [f"vectors.{i}" for i in range(len(sent))]
        )
        return own_vectors.vector_batch(
            fields, sent, int(collection.meta["dim"]), counts
        )

    async def _log_queries(
        self, collection: CollectionBackend[Profile], texts: list[str]
    ) -> None:
        """Record searched texts when the log is on; a failure only gets logged."""
        current = query_log_settings(collection)
        if not current.enabled or not texts:
            return
        try:
            await self.pool.run(
                collection.state.log_queries,
                texts,
                current.retention,
                self.settings.limits.max_logged_query_chars,
            )
        except Exception:  # the search was answered; the log is best effort
            logger.warning(
                "could not log queries of %s", collection.name, exc_info=True
            )


def _check_vector_only(request: SearchRequest) -> None:
    """Refuse (422) a lexical search with no text to match."""
    if request.mode != "dense":
        raise InvalidRequestError(
            f"mode {request.mode!r} matches the query's text: send `query` "
            "(`queries`) beside `vector` (`vectors`)",
            field="mode",
        )


def search_results(
    batch: EmbeddingBatch,
    pools: list[Pool],
    ref: CalibratorRef,
    profile: Profile | None,
    request: SearchRequest,
    k: int,
) -> tuple[list[SearchResult], list[NDArray[np.float64]]]:
    """Score each query's pool, pick its hits by mode, then apply the cuts.

    ``ref`` describes ``profile`` (the same for every query of the request). Also
    returns the drift summary (``calibration.drift.query_summary``) of every query
    that retrieved something and was calibrated.
    """
    results, summaries = [], []
    for i, pool in enumerate(pools):
        result, summary = _result(batch, i, pool, ref, profile, request, k)
        results.append(result)
        if summary is not None:
            summaries.append(summary)
    return results, summaries


def _result(
    batch: EmbeddingBatch,
    i: int,
    pool: Pool,
    ref: CalibratorRef,
    profile: Profile | None,
    request: SearchRequest,
    k: int,
) -> tuple[SearchResult, NDArray[np.float64] | None]:
    """One query's answer: score the whole pool, order it by mode, cut.

    The whole pool is scored once, so a document's probability for a query is the
    same number whichever mode returned it; the mode alone picks and orders the hits,
    and only those become response objects (a pool is ~10 times ``k``).
    With a calibrator, also the query's drift summary, taken from the whole pool.
    """
    norm, n_tokens = float(batch.norms[i]), int(batch.n_tokens[i])
    scores = np.array([h.score for h in pool.hits], dtype=np.float64)
    scored = (
        None
        if profile is None
        else profile.score(
            norm,
            n_tokens,
            scores,
            np.array([h.document.norm for h in pool.hits]),
            np.array([h.document.n_tokens for h in pool.hits], dtype=np.int64),
            pool.lexical,
        )
    )
    probabilities = None if scored is None else scored.probabilities
    out = [
        _hit(pool, j, scored, request.include_text)
        for j in _order(pool, request.mode, scores, probabilities, k)
    ]
    confidence = abstain = band = summary = None
    if probabilities is not None and len(pool.hits):
        summary = query_summary(scores, n_tokens, pool.lexical, probabilities)
    if profile is not None:
        out = _cut(out, request.min_probability, request.target_precision)
        # Confidence of the hits actually returned (after the cut).
        returned = profile.verdict(
            np.array([h.probability or 0.0 for h in out]),
            None
            if scored is None or scored.intervals is None
            else (
                np.array([(h.probability_interval or (0.0, 0.0))[0] for h in out]),
                np.array([(h.probability_interval or (0.0, 0.0))[1] for h in out]),
            ),
        )
        confidence, abstain = returned.confidence, returned.abstain
        band = returned.confidence_interval
    result = SearchResult(
        query=QueryInfo(
            norm=norm, n_tokens=n_tokens, truncated=bool(batch.truncated[i])
        ),
        mode=request.mode,
        hits=out,
        confidence=confidence,
        confidence_interval=band,
        abstain=abstain,
        calibrator=ref,
    )
    return result, summary


def _hit(pool: Pool, j: int, scored: Scored | None, include_text: bool) -> SearchHit:
    """Pool member ``j`` as a hit, with its probability when a calibrator serves."""
    h = pool.hits[j]
    interval = None
    if scored is not None and scored.intervals is not None:
        lo, hi = scored.intervals
        interval = (float(lo[j]), float(hi[j]))
    return SearchHit(
        id=h.document.id,
        score=h.score,
        bm25=float(pool.lexical.bm25[j]),
        probability=None if scored is None else float(scored.probabilities[j]),
        probability_interval=interval,
        norm=h.document.norm,
        n_tokens=h.document.n_tokens,
        metadata=h.document.metadata,
        text=h.document.text if include_text else None,
    )


def _order(
    pool: Pool,
    mode: SearchMode,
    scores: NDArray[np.float64],
    probabilities: NDArray[np.float64] | None,
    k: int,
) -> list[int]:
    """Indices of the (at most ``k``) hits ``mode`` returns, best first.

    The order is ``calibration.fusion.order_by_mode``'s, as in evaluation; ``dense``
    and ``lexical`` return members of their own list only, ``hybrid`` any member.
    """
    position = np.full(len(pool.hits), np.inf)
    position[pool.lexical_order] = np.arange(1, len(pool.lexical_order) + 1)
    order = order_by_mode(
        mode,
        scores,
        pool.n_dense,
        position,
        pool.lexical.bm25,
        probability=probabilities if mode == "hybrid" else None,
    )
    listed = {"dense": pool.n_dense, "lexical": len(pool.lexical_order)}
    return [int(j) for j in order[: min(k, listed.get(mode, len(order)))]]


def _cut(
    hits: list[SearchHit], min_probability: float | None, target_precision: float | None
) -> list[SearchHit]:
    """Drop hits below ``min_probability``, then cut to ``target_precision``.

    The cut keeps the longest prefix whose mean probability (its expected
    precision) is at least ``target_precision``.
    """
    if min_probability is not None:
        hits = [h for h in hits if (h.probability or 0.0) >= min_probability]
    if target_precision is not None:
        probs = np.array([h.probability or 0.0 for h in hits])
        mean = np.cumsum(probs) / np.arange(1, len(probs) + 1)
        ok = np.flatnonzero(mean >= target_precision)
        hits = hits[: int(ok[-1]) + 1] if len(ok) else []
    return hits
