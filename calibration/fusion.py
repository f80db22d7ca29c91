"""Candidate pools of hybrid retrieval, the same for search, fitting and evaluation.

A hybrid pool is the dense top-``n`` (in cosine order) followed by the BM25 top-``n``
that the dense list does not already hold (in BM25 order). Since the dense top-``n``
are the ``n`` best cosines of the whole (filtered) collection, ranking the pool by
cosine keeps every dense member's true dense rank; lexical-only members come after.
:func:`hybrid_pool` builds it for both storage backends and for evaluation.
Probabilities then decide the order (``calibration.profile``).
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from calibration._typing import FloatArray
from calibration.features import LEXICAL_DEPTH

__all__ = ["HybridPool", "candidate_pool", "hybrid_pool", "lexical_ranks"]

T = TypeVar("T", bound=Hashable)


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
