"""Rerank: calibrate the candidate list of a retriever that is not normcal.

A rerank request brings a query and the candidates another retriever returned for it,
in that retriever's order (and, optionally, its scores). The candidates are embedded
by the served model through the batcher (the query as a query, the candidates as one
batch of documents), indexed for BM25 among themselves
(``app.collections.lexical.list_evidence``), and scored by the same profile code as
search (``Profile.score``), the list's own order and score gaps among the features
(``calibration.features``, ``in_rank`` and ``in_gap``). Which profile: the
collection's active calibrator when the request names a collection that has one,
else the shipped default for external lists (``app/profiles/external/``).

With a collection whose query log is on, the request is logged (its query, and its
documents up to ``max_logged_rerank_chars``), so the judging page offers it like a
searched query, and a fit uses its judged documents as the list they came in.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sqlite3
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.collections import lexical
from app.collections.base import CollectionBackend
from app.embedding import EmbeddingBatch
from app.exceptions import InvalidRequestError, LimitExceededError
from app.schemas.collections import CalibratorRef
from app.schemas.rerank import (
    RerankDocument,
    RerankedDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
)
from app.services import limits, own_vectors
from app.services.context import Part, query_log_settings
from app.settings import Limits
from calibration.drift import query_summary
from calibration.external import rank_scores, rerank_order
from calibration.profile import Profile, QueryEvidence, Scored

logger = logging.getLogger(__name__)

_INDEXES = threading.local()  # one in-memory list index per pool thread


class RerankService(Part):
    """Calibrated reranking of other retrievers' candidate lists."""

    async def rerank(self, request: RerankRequest) -> RerankResponse:
        """Embed, score and order the candidates; log the request when asked to."""
        lim = self.settings.limits
        check_documents(request.documents, lim)
        limits.check_value(
            "query", len(request.query), lim.max_text_chars, rule="characters"
        )
        collection = None
        if request.collection is not None:
            collection = self.namespace(request.collection)
        profile, ref = self.serving(collection)
        texts = [d.text for d in request.documents]
        evidence, scored = await self.score(
            collection, profile, request.query, texts, input_scores(request.documents)
        )
        response = respond(
            request, evidence.scores, scored, profile, ref, self.embedder.model_name
        )
        if collection is not None and scored is not None:
            summary = query_summary(
                evidence.scores,
                evidence.n_tokens,
                evidence.lexical,
                scored.probabilities,
            )
            self.drift.observe(collection.name, profile, [summary])
        if collection is not None:
            confidence = None if scored is None else scored.confidence
            await self._log(collection, request, confidence)
        return response

    def namespace(self, name: str) -> CollectionBackend[Profile]:
        """The collection a rerank request names (any whose texts the server embeds)."""
        collection = self.registry.get_compatible(name)
        if own_vectors.is_own(collection):
            raise InvalidRequestError(
                f"collection {name!r} takes the client's own vectors; rerank embeds "
                "with the server's model, which its calibrators do not map",
                field="collection",
            )
        return collection

    def serving(
        self, collection: CollectionBackend[Profile] | None
    ) -> tuple[Profile | None, CalibratorRef]:
        """The profile that scores a list for ``collection`` (None: no collection).

        A collection's fitted calibrator, else the shipped default for external
        lists, else (no such file for this model) the search default.
        """
        fitted = None if collection is None else collection.state.profile
        profile = fitted or self.context.rerank_profile or self.default_profile
        note = None
        if fitted is None and self.context.rerank_profile is None:
            note = self.context.no_rerank_reason
        if collection is None:
            ref = self._calibrator_ref("", profile)
            ref = ref.model_copy(update={"next_step": None})
        else:
            drift = self.drift.verdict(collection.name, profile)
            ref = self._calibrator_ref(collection.name, profile, drift=drift)
        if note is not None and profile is not None:
            ref = ref.model_copy(update={"reason": f"search default ({note})"})
        return profile, ref

    async def score(
        self,
        collection: CollectionBackend[Profile] | None,
        profile: Profile | None,
        query: str,
        texts: list[str],
        scores: NDArray[np.float64],
        labels: NDArray[np.float64] | None = None,
    ) -> tuple[QueryEvidence, Scored | None]:
        """A list's evidence (labelled when ``labels``) and ``profile``'s scores of it.

        The query and the candidates (one batch) go through the batcher, like every
        embedding; BM25 among the candidates and the scoring run in one pool job.
        """
        query_batch, batch = await asyncio.gather(
            self.batcher.embed([query], "query"),
            self.batcher.embed(texts, "document"),
        )
        stemmer = "porter" if collection is None else _stemmer(collection)
        return await self.pool.run(
            scored_evidence,
            profile,
            query,
            texts,
            query_batch,
            batch,
            scores,
            stemmer,
            labels,
        )

    async def _log(
        self,
        collection: CollectionBackend[Profile],
        request: RerankRequest,
        confidence: float | None,
    ) -> None:
        """Log the request when the collection's query log is on (best effort)."""
        current = query_log_settings(collection)
        if not current.enabled:
            return
        kept = logged_documents(
            request.documents, self.settings.limits.max_logged_rerank_chars
        )
        if not kept:  # not even the first document fits: nothing to judge
            return
        try:
            await self.pool.run(
                collection.state.log_rerank,
                request.query,
                json.dumps(kept, ensure_ascii=False),
                confidence,
                current.retention,
                self.settings.limits.max_logged_query_chars,
            )
        except Exception:  # the request was answered; the log is best effort
            logger.warning(
                "could not log a rerank request of %s", collection.name, exc_info=True
            )


def judging_id(text: str, given: str | None) -> str:
    """The id judgments name a rerank document by: the caller's, else its text's hash."""
    if given is not None:
        return given
    return "text:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def logged_documents(
    documents: Sequence[RerankDocument], max_chars: int
) -> list[dict[str, Any]]:
    """The documents a logged request keeps: the first whose texts fit ``max_chars``.

    Each as ``{"text", "id", "score"}`` (``id`` the judging id); metadata is not kept.
    """
    kept, used = [], 0
    for doc in documents:
        used += len(doc.text)
        if used > max_chars:
            break
        kept.append(
            {"text": doc.text, "id": judging_id(doc.text, doc.id), "score": doc.score}
        )
    return kept


def check_documents(documents: Sequence[RerankDocument], lim: Limits) -> None:
    """The declared limits of a rerank request's documents (422 naming the field).

    The number of documents, each text's and all texts' characters, each id's
    characters and metadata, and scores given for every document or none.
    """
    limits.check_count("documents", documents, lim.max_rerank_documents)
    total = 0
    for i, doc in enumerate(documents):
        if len(doc.text) > lim.max_rerank_document_chars:
            raise LimitExceededError(
                f"documents.{i}.text", lim.max_rerank_document_chars, len(doc.text)
            )
        total += len(doc.text)
        if doc.id is not None and len(doc.id) > lim.max_id_chars:
            raise LimitExceededError(f"documents.{i}.id", lim.max_id_chars, len(doc.id))
        if doc.metadata is not None:
            limits.check_metadata(f"documents.{i}.metadata", doc.metadata, lim)
    limits.check_value(
        "documents",
        total,
        lim.max_rerank_total_chars,
        rule="characters of all the documents' texts; limits.max_rerank_total_chars",
    )
    given = [d.score is not None for d in documents]
    if any(given) and not all(given):
        missing = next(i for i, scored in enumerate(given) if not scored)
        raise InvalidRequestError(
            "give a score for every document or for none (the scores are read "
            "relative to each other)",
            field=f"documents.{missing}.score",
        )


def input_scores(documents: Sequence[RerankDocument]) -> NDArray[np.float64]:
    """The caller's scores in list order, or rank-linear ones when it sent none."""
    if documents[0].score is None:
        return rank_scores(len(documents))
    return np.array([d.score for d in documents], dtype=np.float64)


def _stemmer(collection: CollectionBackend[Profile]) -> lexical.Stemmer:
    stemmer = collection.meta.get("stemmer", "porter")
    return "none" if stemmer == "none" else "porter"


def list_index(stemmer: lexical.Stemmer) -> sqlite3.Connection:
    """The in-memory index of candidate lists with ``stemmer`` of this thread."""
    indexes: dict[str, sqlite3.Connection] = getattr(_INDEXES, "by_stemmer", {})
    _INDEXES.by_stemmer = indexes
    if stemmer not in indexes:
        indexes[stemmer] = lexical.list_index(stemmer)
    return indexes[stemmer]


def scored_evidence(
    profile: Profile | None,
    query: str,
    texts: list[str],
    query_batch: EmbeddingBatch,
    batch: EmbeddingBatch,
    scores: NDArray[np.float64],
    stemmer: lexical.Stemmer,
    labels: NDArray[np.float64] | None = None,
) -> tuple[QueryEvidence, Scored | None]:
    """One list's evidence and ``profile``'s scores of it (blocking).

    The features are those of any hit list (``Profile.score``): the candidates in
    the caller's order with the caller's scores, BM25 among the candidates.
    """
    evidence = QueryEvidence(
        norm=float(query_batch.norms[0]),
        n_tokens=int(query_batch.n_tokens[0]),
        scores=(batch.vectors @ query_batch.vectors[0]).astype(np.float64),
        doc_norms=batch.norms,
        doc_tokens=batch.n_tokens,
        labels=labels,
        lexical=lexical.list_evidence(list_index(stemmer), query, texts),
        input_scores=scores,
    )
    if profile is None:
        return evidence, None
    scored = profile.score(
        evidence.norm,
        evidence.n_tokens,
        evidence.scores,
        evidence.doc_norms,
        evidence.doc_tokens,
        evidence.lexical,
        evidence.input_scores,
    )
    return evidence, scored


def respond(
    request: RerankRequest,
    cosine: NDArray[np.float64],
    scored: Scored | None,
    profile: Profile | None,
    ref: CalibratorRef,
    model: str,
) -> RerankResponse:
    """The response: results by probability (ties in request order), cut to top_n.

    The confidence is that of the results returned, as in search.
    """
    n = len(request.documents)
    top_n = n if request.top_n is None else min(request.top_n, n)
    p = None if scored is None else scored.probabilities
    order = rerank_order(cosine if p is None else p)[:top_n]
    results = []
    for i in order:
        doc = request.documents[i]
        interval = None
        if scored is not None and scored.intervals is not None:
            interval = (float(scored.intervals[0][i]), float(scored.intervals[1][i]))
        results.append(
            RerankResult(
                index=int(i),
                id=doc.id,
                relevance_score=float(cosine[i] if p is None else p[i]),
                probability=None if p is None else float(p[i]),
                probability_interval=interval,
                score=float(cosine[i]),
                document=RerankedDocument(
                    text=doc.text, id=doc.id, metadata=doc.metadata
                )
                if request.return_documents
                else None,
            )
        )
    confidence = band = abstain = None
    if scored is not None and profile is not None:
        returned = profile.verdict(
            scored.probabilities[order],
            None
            if scored.intervals is None
            else (scored.intervals[0][order], scored.intervals[1][order]),
        )
        confidence, abstain = returned.confidence, returned.abstain
        band = returned.confidence_interval
    return RerankResponse(
        results=results,
        confidence=confidence,
        confidence_interval=band,
        abstain=abstain,
        calibrator=ref,
        model=model,
    )
