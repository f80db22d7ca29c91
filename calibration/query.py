r"""Query-level confidence and a risk-controlled abstain threshold.

Query confidence is :math:`P(\text{at least one relevant hit in the top } k)`, fitted
by logistic regression on per-query features of the hit probabilities
(:data:`QUERY_FEATURES`).

The abstain threshold is chosen by Learn-then-Test (Angelopoulos et al., 2021) with
fixed-sequence testing: candidate thresholds :math:`\lambda_1 > \lambda_2 > \dots` are
tested in order of decreasing confidence; for each, the null
:math:`H_\lambda: R(\lambda) > \alpha` with :math:`R(\lambda)` = P(no relevant hit |
answered, confidence :math:`\ge\lambda`) is tested with the exact binomial p-value
:math:`P(\mathrm{Bin}(n_\lambda, \alpha) \le m_\lambda)` (:math:`n_\lambda` answered,
:math:`m_\lambda` misses), and testing stops at the first non-rejection. Thresholds answering fewer than
:math:`\lceil\log\delta/\log(1-\alpha)\rceil` queries are skipped (they cannot
reject even with no miss). The last
rejected threshold then satisfies :math:`P(R(\hat\lambda) \le \alpha) \ge 1-\delta`
for exchangeable calibration and test queries. Confidences must be held-out
(cross-fitted) for the guarantee to hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import expit, logit
from scipy.stats import binom
from sklearn.base import BaseEstimator, clone
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from calibration._typing import ArrayLike, BoolArray, FloatArray, IntArray
from calibration._validation import as_float_1d, as_float_2d, as_groups, as_labels
from calibration.exceptions import InsufficientDataError, InvalidInputError
from calibration.models import _check_fitted

__all__ = [
    "QUERY_FEATURES",
    "AbstainPolicy",
    "QueryConfidenceModel",
    "cross_fit_query_confidence",
    "fit_abstain_policy",
    "noisy_or",
    "noisy_or_by_query",
    "query_features",
    "query_table",
]

QUERY_FEATURES: tuple[str, ...] = ("logit_max_p", "logit_noisy_or", "spread", "ell_q")
"""Columns of the query feature matrix."""

_P_CLIP = 1e-6


def noisy_or(p: FloatArray) -> float:
    """P(at least one relevant) if the hits were independent: ``1 - prod(1 - p)``."""
    return float(-np.expm1(np.sum(np.log1p(-np.clip(p, 0.0, 1.0 - 1e-12)))))


def noisy_or_by_query(p: FloatArray, groups: IntArray) -> FloatArray:
    """Noisy-OR per query, in sorted group order (as :func:`query_table`)."""
    return np.array([noisy_or(p[groups == g]) for g in np.unique(groups)])


def query_features(probabilities: ArrayLike, ell_q: float = 0.0) -> FloatArray:
    r"""Per-query features from one query's hit probabilities.

    Parameters
    ----------
    probabilities : array-like of shape (k,)
        Calibrated P(relevant) of the query's top-k hits.
    ell_q : float, default=0.0
        Query ell.

    Returns
    -------
    ndarray of shape (4,)
        :math:`\operatorname{logit}\max p`, :math:`\operatorname{logit}(1-\prod(1-p))`
        (noisy-OR), the SD of :math:`p`, and :math:`\ell_q`, in
        :data:`QUERY_FEATURES` order (probabilities clipped to
        :math:`[10^{-6}, 1-10^{-6}]`).
    """
    p = np.clip(as_float_1d(probabilities, "probabilities"), _P_CLIP, 1 - _P_CLIP)
    if p.shape[0] == 0:
        raise InvalidInputError("probabilities is empty.", field="probabilities")
    any_hit = np.clip(noisy_or(p), _P_CLIP, 1 - _P_CLIP)
    return np.array(
        [logit(p.max()), logit(any_hit), float(p.std()), float(ell_q)],
        dtype=np.float64,
    )


def query_table(
    probabilities: ArrayLike,
    groups: ArrayLike,
    ell_q: ArrayLike | None = None,
    y: ArrayLike | None = None,
) -> tuple[FloatArray, FloatArray | None, IntArray]:
    """Aggregate pair-level probabilities (and labels) into one row per query.

    Parameters
    ----------
    probabilities : array-like of shape (n_pairs,)
        Pair probabilities (held-out ones for fitting).
    groups : array-like of shape (n_pairs,)
        Query id of each pair.
    ell_q : array-like of shape (n_pairs,) or None, default=None
        Query ell per pair (column ``ell_q`` of ``X``); zeros if None.
    y : array-like of shape (n_pairs,) or None, default=None
        Pair labels; if given, the per-query outcome "any relevant" is returned.

    Returns
    -------
    Q : ndarray of shape (n_queries, 4)
        Query features, queries ordered by sorted unique id.
    hit : ndarray of shape (n_queries,) or None
        1.0 if the query has at least one relevant hit.
    query_ids : ndarray of shape (n_queries,)
        Code of each row (0..n_queries-1 in sorted-id order).
    """
    p = as_float_1d(probabilities, "probabilities")
    codes = as_groups(groups, p.shape[0])
    lq = np.zeros_like(p) if ell_q is None else as_float_1d(ell_q, "ell_q")
    n_q = int(codes.max()) + 1
    Q = np.empty((n_q, len(QUERY_FEATURES)))
    hit = None if y is None else np.zeros(n_q)
    yv = None if y is None else as_labels(y, p.shape[0], allow_single_class=True)
    for q in range(n_q):
        rows = codes == q
        Q[q] = query_features(p[rows], float(lq[rows][0]))
        if hit is not None and yv is not None:
            hit[q] = float(yv[rows].max())
    return Q, hit, np.arange(n_q, dtype=np.int64)


class QueryConfidenceModel(BaseEstimator):  # type: ignore[misc]
    r"""P(at least one relevant hit in the top k) from query features.

    .. math:: \operatorname{logit} P(\text{hit}) = w_0 + w^\top f(\text{query})

    with :math:`f` from :func:`query_features`, fitted by L2-regularised logistic
    regression (:class:`sklearn.linear_model.LogisticRegression`).

    Parameters
    ----------
    C : float, default=1.0
        Inverse L2 strength.

    Attributes
    ----------
    coef_ : ndarray of shape (4,)
        Weights in :data:`QUERY_FEATURES` order.
    intercept_ : float
        Intercept.
    n_features_in_ : int
        Number of query features.
    """

    def __init__(self, *, C: float = 1.0):
        self.C = C

    def fit(self, Q: ArrayLike, hit: ArrayLike) -> QueryConfidenceModel:
        """Fit on one row per query.

        Parameters
        ----------
        Q : array-like of shape (n_queries, 4)
            Query features (:func:`query_table`).
        hit : array-like of shape (n_queries,)
            1 if the query had a relevant hit in its top k.

        Returns
        -------
        self : QueryConfidenceModel
            Fitted model.
        """
        Qa = as_float_2d(Q, "Q", min_columns=len(QUERY_FEATURES))
        h = as_labels(hit, Qa.shape[0])
        lr = LogisticRegression(C=self.C).fit(Qa, h)
        self.coef_ = np.asarray(lr.coef_[0], dtype=np.float64)
        self.intercept_ = float(lr.intercept_[0])
        self.n_features_in_ = int(Qa.shape[1])
        return self

    def predict_proba(self, Q: ArrayLike) -> FloatArray:
        """Return P(hit) per query as a 1-D float64 array.

        Parameters
        ----------
        Q : array-like of shape (n_queries, 4)
            Query features.

        Returns
        -------
        ndarray of shape (n_queries,)
            Probabilities in [0, 1].
        """
        _check_fitted(self, "coef_")
        Qa = as_float_2d(Q, "Q", min_columns=len(QUERY_FEATURES))
        out: FloatArray = expit(Qa @ self.coef_ + self.intercept_)
        return out


def cross_fit_query_confidence(
    Q: ArrayLike,
    hit: ArrayLike,
    *,
    n_splits: int = 5,
    model: QueryConfidenceModel | None = None,
    random_state: int = 0,
) -> FloatArray:
    """Held-out query confidences by K-fold cross-fitting (one row per query).

    Parameters
    ----------
    Q : array-like of shape (n_queries, 4)
        Query features.
    hit : array-like of shape (n_queries,)
        Outcomes.
    n_splits : int, default=5
        Folds (stratified by outcome).
    model : QueryConfidenceModel or None, default=None
        Template; default ``QueryConfidenceModel()``.
    random_state : int, default=0
        Seed of the fold shuffle.

    Returns
    -------
    ndarray of shape (n_queries,)
        Each query's confidence from a model that did not see it.
    """
    Qa = as_float_2d(Q, "Q", min_columns=len(QUERY_FEATURES))
    h = as_labels(hit, Qa.shape[0])
    n_min = int(min(h.sum(), (1 - h).sum()))
    if n_min < n_splits:
        raise InsufficientDataError(
            f"Cross-fitting with {n_splits} folds needs at least {n_splits} queries "
            f"with and without a relevant hit; the rarer outcome has {n_min}.",
            n_queries=int(Qa.shape[0]),
            required=n_splits,
        )
    tmpl = QueryConfidenceModel() if model is None else model
    out = np.empty(Qa.shape[0])
    skf = StratifiedKFold(n_splits=n_splits, shuffle=True, random_state=random_state)
    for tr, te in skf.split(Qa, h):
        out[te] = clone(tmpl).fit(Qa[tr], h[tr]).predict_proba(Qa[te])
    return out


@dataclass(frozen=True)
class AbstainPolicy:
    r"""A certified abstain threshold: answer iff ``certified`` and confidence >= it.

    Attributes
    ----------
    threshold : float
        Confidence threshold; 1.0 with ``certified=False`` means abstain always.
    target_risk : float
        :math:`\alpha`: tolerated fraction of answered queries without a relevant hit.
    delta : float
        :math:`\delta`: allowed probability that the guarantee fails.
    n_calibration : int
        Queries used to choose the threshold.
    empirical_risk : float
        Miss rate among answered calibration queries (``nan`` if none answered).
    coverage : float
        Fraction of calibration queries answered.
    certified : bool
        Whether some threshold passed the test; if False the policy abstains always.
    method : str
        ``"ltt-binomial"`` (Learn-then-Test, fixed sequence, exact binomial).
    p_value : float
        p-value of the chosen threshold (of the first one tested if none passed).
    """

    threshold: float
    target_risk: float
    delta: float
    n_calibration: int
    empirical_risk: float
    coverage: float
    certified: bool
    method: str
    p_value: float

    def should_abstain(self, confidence: ArrayLike) -> BoolArray:
        """Return True where the service should abstain.

        Parameters
        ----------
        confidence : array-like of shape (n,)
            Query confidences.

        Returns
        -------
        ndarray of bool of shape (n,)
            ``not certified or confidence < threshold``.
        """
        c = as_float_1d(confidence, "confidence")
        if not self.certified:
            return np.ones(c.shape[0], dtype=bool)
        out: BoolArray = c < self.threshold
        return out


def fit_abstain_policy(
    confidence: ArrayLike,
    hit: ArrayLike,
    *,
    target_risk: float = 0.1,
    delta: float = 0.1,
    max_candidates: int = 200,
    min_coverage: float = 0.1,
) -> AbstainPolicy:
    r"""Choose the lowest confidence threshold whose risk is certified <= target.

    See the module docstring for the test. Candidates are the distinct held-out
    confidences (thinned to at most ``max_candidates`` quantiles), tested from the
    most to the least confident.

    Parameters
    ----------
    confidence : array-like of shape (n_queries,)
        Held-out (cross-fitted) query confidences.
    hit : array-like of shape (n_queries,)
        1 if the query had a relevant hit in its top k.
    target_risk : float, default=0.1
        :math:`\alpha` in (0, 1).
    delta : float, default=0.1
        :math:`\delta` in (0, 1).
    max_candidates : int, default=200
        Cap on the number of thresholds tested.
    min_coverage : float, default=0.1
        The sequence starts at the first threshold that answers at least this
        fraction of the queries. Fixed-sequence testing stops at its first failure,
        so starting where a couple of misses among a handful of answered queries
        decide the test would waste the whole budget; the start depends on the
        confidences only, never on labels, so validity is kept.

    Returns
    -------
    AbstainPolicy
        The threshold and its guarantee; ``certified=False`` (abstain always) if no
        threshold passes.
    """
    if not (0 < target_risk < 1 and 0 < delta < 1):
        raise InvalidInputError("target_risk and delta must be in (0, 1).")
    c = as_float_1d(confidence, "confidence")
    h = as_labels(hit, c.shape[0], allow_single_class=True)
    n = c.shape[0]
    cands = np.unique(c)[::-1]
    if cands.shape[0] > max_candidates:
        cands = np.unique(np.quantile(c, np.linspace(0, 1, max_candidates)))[::-1]
    # With fewer answered queries than this even zero misses cannot reject at delta;
    # skipping them depends on the confidences only, never on labels, so the
    # fixed-sequence test stays valid conditionally on the confidences.
    n_min = max(
        math.ceil(math.log(delta) / math.log1p(-target_risk)),
        math.ceil(min_coverage * n),
    )
    best: tuple[float, float, float, float] | None = None
    first_p = 1.0
    i = 0
    for lam in cands:
        answered = c >= lam
        n_ans = int(answered.sum())
        if n_ans < n_min:
            continue
        misses = int(np.sum(answered & (h == 0.0)))
        p_val = float(binom.cdf(misses, n_ans, target_risk))
        if i == 0:
            first_p = p_val
        i += 1
        if p_val > delta:
            break
        best = (float(lam), misses / n_ans, n_ans / n, p_val)
    if best is None:
        return AbstainPolicy(
            threshold=1.0,
            target_risk=target_risk,
            delta=delta,
            n_calibration=n,
            empirical_risk=float("nan"),
            coverage=0.0,
            certified=False,
            method="ltt-binomial",
            p_value=first_p,
        )
    lam, risk, cov, p_val = best
    return AbstainPolicy(
        threshold=lam,
        target_risk=target_risk,
        delta=delta,
        n_calibration=n,
        empirical_risk=risk,
        coverage=cov,
        certified=True,
        method="ltt-binomial",
        p_value=p_val,
    )
