"""Document frequencies of query terms, for a backend that can only count them by searching.

Milvus has no term statistics: a term's document frequency is the length of a BM25
search's hit list (``app.collections.milvus``). :class:`TermCounts` keeps them per
collection and bounds what one search may cost:

* at most ``per_query`` uncached terms of each query are counted
  (``NORMCAL_MILVUS_TERM_LOOKUPS``); a term past the bound is left uncounted for this
  search (the caller treats it as rare: the largest IDF, so a ``lex`` feature
  normalised by the IDF mass is understated, never above its ceiling) and counted by
  a later search that has room for it;
* every term a search needs is counted in one call (``count`` gets them all);
* no lock is held while counting, so a search never waits behind another's counts;
  counts taken while a write of this process happened (:meth:`forget`) are used
  once but not kept;
* cached counts expire after ``ttl`` seconds (other replicas' writes), and at most
  :data:`CAPACITY` terms are kept (past it the cache starts again).

:data:`LOOKUPS` tallies what was counted and what was left past the bound, for
``/metrics``. Pure logic: no backend is imported here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

CAPACITY = 100_000  # terms one collection's cache keeps
TOTAL = ""  # the key of the number of documents in a count
Count = Callable[[list[str]], dict[str, int]]
"""Document frequencies of terms (and of :data:`TOTAL`: the documents), in one call."""


@dataclass
class Lookups:
    """Terms counted, and terms left uncounted past the bound, since the start."""

    counted: int = 0
    past_bound: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, counted: int, past_bound: int) -> None:
        """Tally one search's lookups."""
        with self._lock:
            self.counted += counted
            self.past_bound += past_bound


LOOKUPS = Lookups()


class TermCounts:
    """One collection's cached document frequencies (see the module docstring)."""

    def __init__(self, count: Count, *, per_query: int, ttl: float) -> None:
        self._count = count
        self._per_query = per_query
        self._ttl = ttl
        self._lock = threading.Lock()
        self._known: dict[str, int] = {}
        self._since = time.monotonic()
        self._generation = 0  # moves at every forget: counts taken across it are stale

    def forget(self) -> None:
        """Drop every count: this process just changed the documents."""
        with self._lock:
            self._known.clear()
            self._since = time.monotonic()
            self._generation += 1

    def frequencies(self, queries: Sequence[Sequence[str]]) -> dict[str, int]:
        """Known document frequencies of the terms of ``queries``, and :data:`TOTAL`.

        A term past its query's bound is absent.
        """
        with self._lock:
            if time.monotonic() - self._since > self._ttl:
                self._known.clear()
                self._since = time.monotonic()
                self._generation += 1
            asked = {TOTAL, *(t for terms in queries for t in terms)}
            known = {t: self._known[t] for t in asked if t in self._known}
            generation = self._generation
        wanted: dict[str, None] = {} if TOTAL in known else {TOTAL: None}
        past = 0
        for terms in queries:
            new = [
                t for t in dict.fromkeys(terms) if t not in known and t not in wanted
            ]
            wanted.update(dict.fromkeys(new[: self._per_query]))
            past += max(0, len(new) - self._per_query)
        counted = self._count(list(wanted)) if wanted else {}
        LOOKUPS.add(len([t for t in wanted if t != TOTAL]), past)
        with self._lock:
            if self._generation == generation:
                if len(self._known) + len(counted) > CAPACITY:
                    self._known.clear()
                self._known.update(counted)
        return {**known, **counted}
