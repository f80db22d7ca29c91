"""FAISS index over a collection's unit vectors: derived state, rebuilt from SQLite.

Inner product on unit vectors is cosine similarity. ``flat`` (exact, ``IndexFlatIP``)
supports removal directly; ``hnsw`` cannot remove vectors, so removed ids become
tombstones that an ``IDSelector`` excludes until the next rebuild.
"""

from __future__ import annotations

import importlib
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

# faiss ships SWIG-generated stubs that do not describe its Python wrappers
# (``remove_ids`` takes an array, ``SearchParameters`` takes ``sel=``): treat it as Any.
faiss: Any = importlib.import_module("faiss")

IndexType = Literal["flat", "hnsw"]


def limit_threads(threads: int) -> None:
    """OpenMP threads of FAISS calls from the calling thread; 0 leaves one per core.

    OpenMP keeps the count per calling thread, so the CPU pool runs this in each of
    its threads (``NORMCAL_EMBED_THREADS``): one search of one query is faster on one
    thread (the scan is memory-bound) and does not oversubscribe the cores the other
    pool threads use.
    """
    if threads > 0:
        faiss.omp_set_num_threads(threads)


class VectorIndex:
    """Cosine top-k search keyed by the store's ``seq`` ids.

    Not thread-safe: the owning collection serialises writers against readers.
    """

    def __init__(
        self,
        dim: int,
        *,
        kind: IndexType = "flat",
        hnsw_m: int = 32,
        ef_search: int = 128,
    ) -> None:
        self.dim = dim
        self.kind = kind
        self._hnsw_m = hnsw_m
        self._ef_search = ef_search
        if kind == "flat":
            inner: Any = faiss.IndexFlatIP(dim)
        else:
            inner = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
            inner.hnsw.efSearch = ef_search
        self._index = faiss.IndexIDMap2(inner)
        self._tombstones: set[int] = set()

    def emptied(self) -> VectorIndex:
        """A new, empty index of the same kind and parameters."""
        return VectorIndex(
            self.dim, kind=self.kind, hnsw_m=self._hnsw_m, ef_search=self._ef_search
        )

    @property
    def size(self) -> int:
        """Number of live vectors."""
        return int(self._index.ntotal) - len(self._tombstones)

    def add(self, seqs: NDArray[np.int64], vectors: NDArray[np.float32]) -> None:
        """Add vectors under the given ids (ids must not be present)."""
        if len(seqs):
            self._index.add_with_ids(
                np.ascontiguousarray(vectors, dtype=np.float32),
                np.ascontiguousarray(seqs, dtype=np.int64),
            )

    def remove(self, seqs: list[int]) -> None:
        """Remove ids (absent ids are ignored)."""
        if not seqs:
            return
        if self.kind == "flat":
            self._index.remove_ids(np.asarray(seqs, dtype=np.int64))
        else:
            self._tombstones.update(seqs)

    def search(
        self,
        queries: NDArray[np.float32],
        k: int,
        allowed: NDArray[np.int64] | None = None,
    ) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
        """Return ``(cosines, seqs)`` of shape ``(n_queries, k)``, best first.

        Slots past the number of matching vectors hold seq ``-1``. ``allowed``
        restricts the search to those ids (a metadata filter).
        """
        n = queries.shape[0]
        if self.size == 0 or k == 0 or (allowed is not None and len(allowed) == 0):
            return np.zeros((n, k), np.float32), np.full((n, k), -1, np.int64)
        # SWIG selectors do not own their parts: keep every part referenced here.
        parts = self._selector_parts(allowed)
        selector = parts[-1] if parts else None
        if self.kind == "flat":
            params: Any = faiss.SearchParameters(sel=selector)
        else:
            params = faiss.SearchParametersHNSW(sel=selector, efSearch=self._ef_search)
        scores, ids = self._index.search(
            np.ascontiguousarray(queries, dtype=np.float32), k, params=params
        )
        scores = np.where(ids >= 0, scores, np.float32(0.0))
        return scores.astype(np.float32), ids.astype(np.int64)

    def _selector_parts(self, allowed: NDArray[np.int64] | None) -> list[Any]:
        """Selectors to combine; the last one is the selector to search with."""
        parts: list[Any] = []
        if allowed is not None:
            parts.append(faiss.IDSelectorBatch(np.ascontiguousarray(allowed, np.int64)))
        if self._tombstones:
            dead = faiss.IDSelectorBatch(np.fromiter(self._tombstones, np.int64))
            parts += [dead, faiss.IDSelectorNot(dead)]
            if allowed is not None:
                parts.append(faiss.IDSelectorAnd(parts[0], parts[-1]))
        return parts
