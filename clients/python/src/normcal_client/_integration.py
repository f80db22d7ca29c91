"""What the framework integrations share (LangChain, LlamaIndex)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from normcal_client._async_client import AsyncNormcalClient
from normcal_client._models import RerankResponse, RerankResult, SearchHit, SearchResult
from normcal_client._sync_client import NormcalClient


class Connection:
    """Where the service is, and the clients to reach it (given or short-lived).

    A short-lived client is opened per call and closed after it, so nothing leaks
    when a framework's object is dropped; an ``AsyncClient`` is bound to one event
    loop, another reason not to keep one. Pass ``client`` / ``async_client`` to
    reuse connections; the caller owns and closes those.
    """

    base_url: str
    api_key: str | None
    timeout: float
    client: NormcalClient | None
    async_client: AsyncNormcalClient | None

    @contextmanager
    def _sync(self) -> Iterator[NormcalClient]:
        if self.client is not None:
            yield self.client
            return
        with NormcalClient(
            self.base_url, api_key=self.api_key, timeout=self.timeout
        ) as client:
            yield client

    @asynccontextmanager
    async def _async(self) -> AsyncIterator[AsyncNormcalClient]:
        if self.async_client is not None:
            yield self.async_client
            return
        async with AsyncNormcalClient(
            self.base_url, api_key=self.api_key, timeout=self.timeout
        ) as client:
            yield client


HIT_KEYS = (
    "id",
    "score",
    "probability",
    "norm",
    "n_tokens",
    "rank",
    "confidence",
    "calibrator",
)
"""The keys :func:`hit_metadata` adds to a hit's own metadata."""


def best_first(
    hits: Sequence[SearchHit], score: Callable[[SearchHit], float | None]
) -> list[SearchHit]:
    """``hits`` in descending order of the ``score`` a framework reports for them.

    A dense search lists its hits by cosine, while a framework reports their
    probability, which the calibrator's other evidence (BM25, lengths) can order
    otherwise: documents come in the order of the score they carry. Ties keep the
    service's order; with a hit that has no score (no calibrator), the service's.
    """
    scores = [score(hit) for hit in hits]
    if any(s is None for s in scores):
        return list(hits)
    order = sorted(range(len(hits)), key=lambda i: -float(scores[i] or 0.0))
    return [hits[i] for i in order]


def by_probability(result: SearchResult) -> list[SearchHit]:
    """The hits of ``result`` by descending calibrated probability (:func:`best_first`)."""
    return best_first(result.hits, lambda hit: hit.probability)


def hit_metadata(
    result: SearchResult, hits: Sequence[SearchHit] | None = None
) -> list[dict[str, Any]]:
    """Each hit's metadata with normcal's numbers added (``HIT_KEYS``; they win a clash).

    ``hits``: in the order they are returned (:func:`by_probability` by default);
    ``rank`` is the position there.
    """
    calibrator = result.calibrator.id if result.calibrator is not None else None
    hits = by_probability(result) if hits is None else hits
    return [
        {
            **hit.metadata,
            "id": hit.id,
            "score": hit.score,
            "probability": hit.probability,
            "norm": hit.norm,
            "n_tokens": hit.n_tokens,
            "rank": rank,
            "confidence": result.confidence,
            "calibrator": calibrator,
        }
        for rank, hit in enumerate(hits)
    ]


RERANK_KEYS = (
    "relevance_score",
    "probability",
    "probability_interval",
    "cosine",
    "input_rank",
    "confidence",
    "calibrator",
)
"""The keys :func:`rerank_metadata` adds to a reranked document's metadata."""


def retriever_scores(scores: Sequence[float | None]) -> list[float] | None:
    """The retriever's scores to send: all of them, or none if any is missing.

    The service uses a list's scores only as gaps within the list, so it takes a
    score for every document or for none.
    """
    sent: list[float] = []
    for score in scores:
        if not isinstance(score, int | float) or isinstance(score, bool):
            return None
        if not math.isfinite(score):
            return None
        sent.append(float(score))
    return sent or None


def rerank_documents(
    texts: Sequence[str],
    ids: Sequence[str | None],
    scores: Sequence[float | None],
) -> list[dict[str, Any]]:
    """The candidates as ``POST /v1/rerank`` takes them.

    No metadata: the caller keeps its documents and maps results back by ``index``.
    """
    sent = retriever_scores(scores)
    documents: list[dict[str, Any]] = []
    for i, text in enumerate(texts):
        document: dict[str, Any] = {"text": text}
        if ids[i] is not None:
            document["id"] = ids[i]
        if sent is not None:
            document["score"] = sent[i]
        documents.append(document)
    return documents


def kept_results(
    response: RerankResponse,
    *,
    min_probability: float | None,
    honour_abstain: bool,
) -> list[RerankResult]:
    """The results a reranker returns, most probable first.

    None when the service abstains (and ``honour_abstain``); otherwise those whose
    probability reaches ``min_probability``. Without a probability (no calibrator
    serves) ``min_probability`` cannot be applied, and raises.
    """
    if honour_abstain and response.abstain:
        return []
    if min_probability is None:
        return list(response.results)
    if any(r.probability is None for r in response.results):
        raise ValueError(
            "no calibrator serves this rerank, so there is no probability to "
            "compare with min_probability"
        )
    return [
        r
        for r in response.results
        if r.probability is not None and r.probability >= min_probability
    ]


def rerank_metadata(result: RerankResult, response: RerankResponse) -> dict[str, Any]:
    """The numbers normcal adds to one reranked document (:data:`RERANK_KEYS`)."""
    interval = result.probability_interval
    return {
        "relevance_score": result.relevance_score,
        "probability": result.probability,
        "probability_interval": None if interval is None else list(interval),
        "cosine": result.score,
        "input_rank": result.index,
        "confidence": response.confidence,
        "calibrator": response.calibrator.id,
    }
