"""The one place a search's candidate pool is assembled, whichever backend read it.

Both backends read a dense list and a BM25 list, then hand them here with what they
read of the members: :func:`calibration.fusion.hybrid_pool` decides the members and
their list positions (as ``normcal eval`` does, ``app.cli.beir``), and
:func:`pool_of` puts the documents, cosines and BM25 evidence beside them.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from app.collections.base import Hit, Pool, StoredDocument
from calibration.features import LexicalEvidence
from calibration.fusion import HybridPool

K = TypeVar("K", bound=Hashable)


def pool_of(
    shape: HybridPool[K],
    documents: Mapping[K, StoredDocument],
    cosine: Mapping[K, float],
    bm25: NDArray[np.float64],
    *,
    idf_mass: float,
    top: float,
) -> Pool:
    """The pool of ``shape``'s members: ``bm25`` is theirs, in member order.

    ``documents`` and ``cosine`` hold at least every member; ``idf_mass`` and ``top``
    (the best BM25 of the query's list) complete the query's lexical evidence.
    """
    return Pool(
        hits=[Hit(documents[m], cosine[m]) for m in shape.members],
        n_dense=shape.n_dense,
        lexical_order=shape.lexical_order,
        lexical=LexicalEvidence(
            bm25=bm25, rank=shape.lexical_rank, idf_mass=idf_mass, top=top
        ),
    )
