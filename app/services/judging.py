"""The judging loop: the query log's settings, queued queries, the next query to judge."""

from __future__ import annotations

import json
import threading

import numpy as np

from app.collections.base import CollectionBackend
from app.exceptions import InvalidRequestError, NotFoundError
from app.schemas.calibrators import FeedbackDeleted
from app.schemas.collections import CalibratorRef
from app.schemas.judging import (
    JudgingHit,
    JudgingNext,
    JudgingProgress,
    QueryLogInfo,
    QueryLogSettings,
)
from app.schemas.search import SearchRequest, SearchResult
from app.services import limits, next_query, own_vectors
from app.services.context import Context, Part, query_log_settings
from app.services.rerank import RerankService
from app.services.search import POOL_DEPTH, search_results
from app.services.suggestions import (
    MAX_SUGGESTIONS,
    SAMPLE_WINDOWS,
    WINDOW,
    Suggestion,
    suggest,
)
from calibration.external import rank_scores, rerank_order
from calibration.profile import Profile


class JudgingService(Part):
    """The query log and the judging queue of a collection."""

    def __init__(self, context: Context) -> None:
        super().__init__(context)
        # Serialises the count-then-queue of uploads (the queue's cap).
        self._queue_lock = threading.Lock()
        self._rerank = RerankService(context)  # logged rerank requests are scored so

    def query_log(self, name: str) -> QueryLogInfo:
        """The collection's query log settings and size (off unless enabled)."""
        collection = self.registry.get(name)
        current = query_log_settings(collection)
        return QueryLogInfo(
            **current.model_dump(), entries=collection.state.query_log_size()
        )

    def set_query_log(self, name: str, body: QueryLogSettings) -> QueryLogInfo:
        """Turn the query log on or off and set its retention (applied at once).

        Turning it off stops recording; the logged queries stay judging candidates.
        """
        retention_limit = self.settings.limits.max_query_log_retention
        limits.check_value("retention", body.retention, retention_limit)
        collection = self.registry.get(name)
        collection.set_meta(query_log=body.model_dump())
        entries = collection.state.trim_query_log(body.retention)
        return QueryLogInfo(**body.model_dump(), entries=entries)

    def add_judging_queries(self, name: str, queries: list[str]) -> int:
        """Queue queries to judge ahead of logged ones; returns how many were new.

        At most ``max_judging_queue`` uploaded queries wait to be judged (neither
        judged nor skipped) per collection: an upload that could pass it is refused
        whole (422, nothing queued). Each distinct query sent counts, queued already
        or not. Blocking: the router runs it in a worker thread.
        """
        lim = self.settings.limits
        limits.check_count("queries", queries, lim.max_judging_queries)
        limits.check_texts("queries", queries, lim)
        collection = self.registry.get(name)
        sent = len(set(queries))
        with self._queue_lock:
            source, _, remaining = collection.state.judging_candidates(0)
            waiting = remaining if source == "uploaded" else 0
            limits.check_value(
                "queries",
                waiting + sent,
                lim.max_judging_queue,
                rule=f"{sent} sent plus {waiting} waiting to be judged; "
                "limits.max_judging_queue (judge or skip some first)",
            )
            return collection.state.add_judging_queries(queries)

    def skip_judging(self, name: str, query: str) -> None:
        """Never offer ``query`` for judging again (404 if it is not a candidate)."""
        if not self.registry.get(name).state.skip_judging(query):
            raise NotFoundError("judging query", query)

    def unskip_judging(self, name: str, query: str) -> None:
        """Offer a skipped ``query`` again (404 if it was not skipped): the page's undo."""
        if not self.registry.get(name).state.unskip_judging(query):
            raise NotFoundError("skipped judging query", query)

    def take_back(self, name: str, query: str, document_id: str) -> FeedbackDeleted:
        """Delete one (query, document) judgment: the judging page's undo."""
        deleted = self.registry.get(name).state.delete_judgments(query, document_id)
        return FeedbackDeleted(deleted=deleted)

    def suggestions(self, name: str, n: int) -> list[Suggestion]:
        """Keyword queries drawn from the collection's documents (``app.services.suggestions``).

        Blocking (reads a sample of documents): the router runs it in a worker thread.
        Queries already queued to judge or judged are not suggested again.
        """
        limits.check_value("n", n, MAX_SUGGESTIONS)
        collection = self.registry.get(name)
        total = collection.counts()[0]
        sample: dict[str, str] = {}
        for window in range(SAMPLE_WINDOWS):
            after = window * total // SAMPLE_WINDOWS
            for doc in collection.page(after, WINDOW):
                sample.setdefault(doc.id, doc.text)
        state = collection.state
        _, pending, _ = state.judging_candidates(self.settings.limits.max_judging_queue)
        judged = {q for q, _, _ in state.judgments()}
        return suggest(list(sample.items()), n, exclude=[*pending, *judged])

    async def next_to_judge(
        self, name: str, k: int, query: str | None = None
    ) -> JudgingNext:
        """The next query to judge with its top ``k`` hits (see ``app.services.next_query``).

        ``query`` asks for that query instead, whatever its state (the page's text
        box: the user typed it and judges it now).
        """
        limits.check_value("k", k, self.settings.limits.max_k)
        if query is not None:
            limits.check_value(
                "query",
                len(query),
                self.settings.limits.max_text_chars,
                rule="characters; limits.max_text_chars",
            )
        collection = self.registry.get_compatible(name)
        if own_vectors.is_own(collection):
            raise InvalidRequestError(
                f"collection {name!r} takes the client's own vectors, which the "
                "judging loop cannot make for its queries: POST judgments to "
                ".../feedback and fit with `query_vectors` (docs/api.md)",
                field="name",
            )
        source, candidates, remaining = collection.state.judging_candidates(
            next_query.CANDIDATE_POOL
        )
        if query is not None:
            source, candidates = "uploaded", [query]
        judged, relevant, skipped = collection.state.judging_counts()
        progress = JudgingProgress(
            judged_queries=judged,
            relevant_queries=relevant,
            target=next_query.FIT_MIN_QUERIES,
            remaining=remaining,
            skipped=skipped,
            can_fit=judged >= next_query.FIT_MIN_QUERIES and relevant > 0,
        )
        profile = self._profile_for(collection)
        if not candidates:
            return JudgingNext(
                query=None,
                source="none",
                confidence=None,
                hits=[],
                calibrator=self._calibrator_ref(name, profile),
                progress=progress,
            )
        # A logged rerank request is judged on its own documents, ordered by the
        # calibrator that serves the collection's rerank requests; its confidence
        # when logged places it among the confidence bins.
        lists = await self.pool.run(collection.state.rerank_lists, candidates)
        searched = [q for q in candidates if q not in lists]
        levels: dict[str, float] = {
            q: 0.5 if confidence is None else confidence
            for q, (_, confidence) in lists.items()
        }
        results: dict[str, SearchResult] = {}
        if searched:
            request = SearchRequest(queries=searched, k=k, include_text=True)
            batch = await self.batcher.embed(searched, "query")
            pools = await self.pool.run(
                collection.search, batch.vectors, searched, max(k, POOL_DEPTH)
            )
            found, _ = await self.pool.run(
                search_results,
                batch,
                pools,
                self._calibrator_ref(name, profile),
                profile,
                request,
                k,
            )
            for one, result in zip(searched, found, strict=True):
                results[one] = result
                levels[one] = (
                    result.confidence
                    if result.confidence is not None
                    else (result.hits[0].score if result.hits else 0.0)
                )  # no calibrator: the top cosine
        chosen = candidates[
            next_query.pick([levels[q] for q in candidates], turn=judged + skipped)
        ]
        ref: CalibratorRef | None
        if chosen in lists:
            confidence, hits, ref = await self._list_hits(
                collection, chosen, lists[chosen][0], k
            )
        else:
            result = results[chosen]
            confidence, ref = result.confidence, result.calibrator
            hits = [
                JudgingHit(
                    id=h.id, text=h.text or "", score=h.score, probability=h.probability
                )
                for h in result.hits
            ]
        logged = source != "uploaded"
        return JudgingNext(
            query=chosen,
            source="log" if logged else "uploaded",
            truncated=logged and collection.state.truncated_in_log(chosen),
            confidence=confidence,
            hits=hits,
            rerank=chosen in lists,
            calibrator=ref,
            progress=progress,
        )

    async def _list_hits(
        self, collection: CollectionBackend[Profile], query: str, logged: str, k: int
    ) -> tuple[float | None, list[JudgingHit], CalibratorRef]:
        """The top ``k`` of a logged rerank request, scored as rerank scores it now."""
        documents = json.loads(logged)
        texts = [str(d["text"]) for d in documents]
        scores = [d.get("score") for d in documents]
        given = (
            np.array(scores, dtype=np.float64)
            if all(s is not None for s in scores)
            else rank_scores(len(texts))
        )
        profile, ref = self._rerank.serving(collection)
        evidence, scored = await self._rerank.score(
            collection, profile, query, texts, given
        )
        p = None if scored is None else scored.probabilities
        order = rerank_order(evidence.scores if p is None else p)[:k]
        hits = [
            JudgingHit(
                id=str(documents[i]["id"]),
                text=texts[i],
                score=float(evidence.scores[i]),
                probability=None if p is None else float(p[i]),
            )
            for i in order
        ]
        confidence = None
        if scored is not None and profile is not None:
            confidence = profile.verdict(scored.probabilities[order]).confidence
        return confidence, hits, ref
