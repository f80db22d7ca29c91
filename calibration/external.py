"""Candidate lists of other retrievers (``POST /v1/rerank``): order and evaluation.

A rerank request hands normcal a list another retriever made, in that retriever's
order. Its features are those of any hit list (:func:`calibration.features.
pair_features`): normcal's cosine, norms and lengths, BM25 among the candidates
themselves, and the list's own evidence — the position each candidate was handed
over at (``in_rank``) and, when the caller sent scores, each score's gap to the top
relative to the list (``in_gap``); without scores, the rank-linear gaps of
:func:`rank_scores` stand in. The shipped default for such lists is a cross-domain
prior (:mod:`calibration.prior`) fitted on lists of simulated retrievers
(``scripts/fit_rerank_profile.py``), whose weight of the input order is raised by
:func:`favour_input_order` until a strong retriever's order is not lost.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from calibration._typing import ArrayLike, FloatArray, IntArray
from calibration._validation import as_float_1d
from calibration.exceptions import InvalidInputError
from calibration.prior import CrossDomainPrior

__all__ = ["favour_input_order", "ndcg_of_order", "rank_scores", "rerank_order"]


def favour_input_order(prior: CrossDomainPrior, weight: float) -> CrossDomainPrior:
    """``prior`` with the slope of the input rank steepened by ``weight``.

    The slope is that of the standardised ``log(in_rank)`` (non-positive: a better
    place can only raise a candidate); ``weight >= 0`` is subtracted from it, so
    the returned order moves toward the input order, and equals it for a weight
    large enough. A prior fitted on retrievers of every strength weighs the input
    order as an average retriever deserves; this weight, chosen on held-out
    retrievers (``benchmarks/external_transfer.py``), is what keeps the order of a
    retriever better than that average. It is also the slope's prior mean for a
    namespace's fit, which judged lists move.
    """
    if "in_rank" not in prior.features:
        raise InvalidInputError("the prior has no in_rank feature", field="features")
    if not weight >= 0.0:
        raise InvalidInputError("weight must be >= 0", field="weight")
    at = prior.features.index("in_rank")
    slope = list(prior.slope)
    slope[at] -= float(weight)
    return dataclasses.replace(prior, slope=tuple(slope))


def rerank_order(probability: ArrayLike) -> IntArray:
    """Indices of a list by descending probability, ties in the list's own order."""
    p = as_float_1d(probability, "probability")
    out: IntArray = np.argsort(-p, kind="stable").astype(np.int64)
    return out


def rank_scores(k: int) -> FloatArray:
    """Scores standing in for those of a list of ``k`` handed over without any.

    ``k, k - 1, …, 1``: their relative gaps (``in_gap``) are rank-linear,
    ``(i - 1) / (k - 1)``.
    """
    out: FloatArray = np.arange(k, 0, -1, dtype=np.float64)
    return out


def ndcg_of_order(
    gains: ArrayLike, order: Sequence[int] | IntArray, ideal: ArrayLike, k: int = 10
) -> float:
    """nDCG@k of the list's items taken in ``order``.

    ``gains`` are the graded relevances of the list's items (list order), ``ideal``
    every judged relevance of the query (retrieved or not): the ideal DCG is theirs,
    as in :func:`calibration.evaluation.ndcg_at_k`. ``nan`` when nothing is relevant.
    """
    g = np.maximum(as_float_1d(gains, "gains"), 0.0)
    best = np.sort(np.maximum(as_float_1d(ideal, "ideal"), 0.0))[::-1][:k]
    best = best[best > 0]
    if best.size == 0:
        return float("nan")
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    taken = g[np.asarray(order, dtype=np.int64)[:k]]
    dcg = float(taken @ discount[: taken.size])
    return dcg / float(best @ discount[: best.size])
