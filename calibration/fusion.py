"""Candidate pools of hybrid retrieval and their orders, the same everywhere.

A hybrid pool is the dense top-``n`` (in cosine order) followed by the BM25 top-``n``
that the dense list does not already hold (in BM25 order). Since the dense top-``n``
are the ``n`` best cosines of the whole (filtered) collection, ranking the pool by
cosine keeps every dense member's true dense rank; lexical-only members come after.
:func:`hybrid_pool` builds it for both storage backends and for evaluation.

A :data:`SearchMode` orders a pool (:func:`order_by_mode`): search serves ``dense``,
``lexical`` and ``hybrid`` (by calibrated probability, ``calibration.profile``);
evaluation compares them with ``rrf`` and ``blend``.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeAlias, TypeVar

import numpy as np

from calibration._typing import FloatArray, IntArray
from calibration.features import LEX_RANK, LEXICAL_DEPTH, RANK

__all__ = [
    "RRF_K",
    "SERVED_MODES",
    "HybridPool",
    "SearchMode",
    "candidate_pool",
    "hybrid_pool",
    "lexical_ranks",
    "order_by_mode",
    "pair_rrf",
]

T = TypeVar("T", bound=Hashable)

SearchMode: TypeAlias = Literal["dense", "lexical", "hybrid", "rrf", "blend"]
SERVED_MODES: tuple[SearchMode, ...] = ("dense", "lexical", "hybrid")
RRF_K = 60


def candidate_pool(dense: Sequence[T], lexical: Sequence[T], n: int) -> list[T]:
    """Dense top-``n``, then the lexical top-``n`` not already in it."""
    pool = list(dense[:n])
    seen = set(pool)
    pool += [d for d in lexical[:n] if d not in seen]
    return pool


def lexical_ranks(items: Sequence[T], lexical: Sequence[T]) -> FloatArray:
    """1-based rank of each item in the ``lexical`` list (``LEXICAL_DEPTH + 1`` if absent).

    ``lexical`` is the query's BM25 list of depth :data:`LEXICAL_DEPTH`; only that
    depth counts, so the feature means the same at any ``k``.
    """
    where = {d: r for r, d in enumerate(lexical[:LEXICAL_DEPTH], start=1)}
    return np.array(
        [float(where.get(d, LEXICAL_DEPTH + 1)) for d in items], dtype=np.float64
    )


@dataclass(frozen=True)
class HybridPool(Generic[T]):
    """The members of one query's hybrid pool and where each list put them.

    ``members``: the pool in order (dense members first); ``n_dense``: how many of
    them came from the dense list; ``lexical_order``: indices into ``members`` of the
    BM25 top-``n``, best first; ``lexical_rank``: each member's BM25-list rank
    (:func:`lexical_ranks`, to depth :data:`LEXICAL_DEPTH`).
    """

    members: list[T]
    n_dense: int
    lexical_order: list[int]
    lexical_rank: FloatArray


def hybrid_pool(
    dense: Sequence[T],
    lexical: Sequence[T],
    n: int,
    kept: Container[T] | None = None,
) -> HybridPool[T]:
    """The hybrid pool of depth ``n`` of a dense and a BM25 list (best first).

    ``lexical`` runs to depth :data:`LEXICAL_DEPTH` at least, for the ranks. With
    ``kept``, members not in it are left out (a document deleted since the lists
    were read, one another filter refuses), and so are their list positions.
    """
    members = candidate_pool(dense, lexical, n)
    if kept is not None:
        members = [m for m in members if m in kept]
    in_dense = set(dense[:n])
    at = {m: i for i, m in enumerate(members)}
    return HybridPool(
        members=members,
        n_dense=sum(1 for m in members if m in in_dense),
        lexical_order=[at[m] for m in lexical[:n] if m in at],
        lexical_rank=lexical_ranks(members, lexical),
    )


def _rrf(dense_rank: FloatArray, lexical_rank: FloatArray) -> FloatArray:
    """``sum 1 / (60 + rank)`` over the two lists (rank ``inf``: absent, no term)."""
    return np.asarray(1.0 / (RRF_K + dense_rank) + 1.0 / (RRF_K + lexical_rank))


def _minmax(v: FloatArray) -> FloatArray:
    span = float(v.max() - v.min()) if v.size else 0.0
    return (v - v.min()) / span if span > 0 else np.zeros_like(v)


def order_by_mode(
    mode: SearchMode,
    cosine: FloatArray,
    n_dense: int,
    lexical_position: FloatArray,
    bm25: FloatArray,
    *,
    probability: FloatArray | None = None,
    weight: float = 0.5,
) -> IntArray:
    """Indices of a pool's members in ``mode``'s order, best first.

    The pool's first ``n_dense`` members are the dense list in order (their dense
    rank; the others have none); ``lexical_position`` is each member's position in
    the BM25 list (``inf`` if absent). ``dense``: dense rank, then cosine.
    ``lexical``: BM25-list position, then BM25, then cosine. ``rrf``:
    ``sum 1 / (60 + rank)`` over the two lists (absent: no term). ``blend``:
    ``weight * minmax(cosine) + (1 - weight) * minmax(BM25)`` within the pool.
    ``hybrid``: ``probability``. Ties fall back to the dense order, then cosine.
    """
    n = len(cosine)
    cos = np.asarray(cosine, dtype=np.float64)
    position = np.arange(1, n + 1, dtype=np.float64)
    dense_rank = np.where(position <= n_dense, position, np.inf)
    lex_rank = np.asarray(lexical_position, dtype=np.float64)
    if mode == "dense":
        return np.lexsort((-cos, dense_rank))
    if mode == "lexical":
        return np.lexsort((dense_rank, -cos, -np.asarray(bm25, float), lex_rank))
    if mode == "rrf":
        score = _rrf(dense_rank, lex_rank)
    elif mode == "blend":
        score = weight * _minmax(cos) + (1.0 - weight) * _minmax(
            np.asarray(bm25, float)
        )
    elif mode == "hybrid" and probability is not None:
        score = np.asarray(probability, dtype=np.float64)
    else:
        raise ValueError(f"unknown mode {mode!r} (or no probabilities)")
    return np.lexsort((-cos, dense_rank, -score))


def pair_rrf(X: FloatArray) -> FloatArray:
    """The ``rrf`` score of judged pairs from their features (``FEATURES`` columns).

    ``sum 1 / (60 + rank)`` over the pair's cosine-list rank and its BM25-list rank
    (no term beyond :data:`LEXICAL_DEPTH`): the plain fusion of the evidence a
    calibrated map sees, to compare its order with.
    """
    lex = X[:, LEX_RANK]
    return _rrf(X[:, RANK], np.where(lex <= LEXICAL_DEPTH, lex, np.inf))
