"""Candidate pools of hybrid retrieval, the same for search, fitting and evaluation.

A hybrid pool is the dense top-``n`` (in cosine order) followed by the BM25 top-``n``
that the dense list does not already hold (in BM25 order). Since the dense top-``n``
are the ``n`` best cosines of the whole (filtered) collection, ranking the pool by
cosine keeps every dense member's true dense rank; lexical-only members come after.
Probabilities then decide the order (``calibration.profile``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

import numpy as np

from calibration._typing import FloatArray
from calibration.features import LEXICAL_DEPTH

__all__ = ["candidate_pool", "lexical_ranks"]

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
