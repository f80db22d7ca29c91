r"""Calibration and discrimination metrics for binary relevance.

All functions take ``y_true`` (0/1) and ``y_prob`` (P(relevant) in [0, 1]) of equal
length and return plain floats or frozen dataclasses; no flag changes a return type.

* ECE: :math:`\sum_b \frac{n_b}{n}\,|\bar y_b - \bar p_b|`.
* Brier: :math:`\frac1n\sum_i (p_i - y_i)^2`.
* NLL: :math:`-\frac1n\sum_i y_i\log p_i + (1-y_i)\log(1-p_i)`, with :math:`p`
  clipped to :math:`[\epsilon, 1-\epsilon]`.
* AUROC: area under the ROC curve (scikit-learn), ``nan`` for a single class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import roc_auc_score

from calibration._typing import ArrayLike, BinStrategy, FloatArray, IntArray
from calibration._validation import as_float_1d
from calibration.exceptions import InvalidInputError

__all__ = [
    "BINNING",
    "Binning",
    "ReliabilityCurve",
    "TercileReliability",
    "auroc",
    "brier_score",
    "clear_nll_gain",
    "expected_calibration_error",
    "negative_log_likelihood",
    "paired_ndcg_gain",
    "paired_nll_gain",
    "per_query_ndcg",
    "reliability_by_tercile",
    "reliability_curve",
]

NLL_EPS = 1e-15


@dataclass(frozen=True)
class Binning:
    """A binning protocol of reliability curves and ECE.

    Every reported ECE and reliability diagram uses :data:`BINNING`, so numbers from
    the fit report, ``normcal eval`` and the report page are comparable.
    """

    n_bins: int
    strategy: BinStrategy

    @property
    def label(self) -> str:
        """Human-readable name, e.g. ``"15 equal-mass bins"``."""
        kind = "equal-mass" if self.strategy == "quantile" else "equal-width"
        return f"{self.n_bins} {kind} bins"

    def curve(self, y_true: ArrayLike, y_prob: ArrayLike) -> ReliabilityCurve:
        """:func:`reliability_curve` with this protocol."""
        return reliability_curve(
            y_true, y_prob, n_bins=self.n_bins, strategy=self.strategy
        )

    def ece(self, y_true: ArrayLike, y_prob: ArrayLike) -> float:
        """:func:`expected_calibration_error` with this protocol."""
        return self.curve(y_true, y_prob).ece

    def noise_floor(self, y_prob: ArrayLike) -> float:
        r"""Expected ECE of a *perfectly calibrated* predictor with these probabilities.

        Analytic (no simulation): in a bin of :math:`n_b` pairs with mean
        :math:`\bar p_b`, the observed rate's error is about normal with SD
        :math:`\sqrt{\bar p_b(1-\bar p_b)/n_b}`, whose absolute value has mean
        :math:`\sqrt{2/\pi}` times that. A measured ECE near this floor is as good as
        the data can show; cheap enough for model selection.
        """
        p = as_float_1d(y_prob, "y_prob")
        curve = self.curve(np.zeros_like(p), p)
        m, n = curve.mean_predicted, curve.counts.astype(np.float64)
        sd = np.sqrt(np.clip(m * (1.0 - m), 0.0, None) / n)
        return float(np.sum(n * math.sqrt(2.0 / math.pi) * sd) / n.sum())


BINNING = Binning(n_bins=15, strategy="quantile")
"""The protocol of theory.md §4.7: 15 equal-mass (quantile) bins."""


def _check(y_true: ArrayLike, y_prob: ArrayLike) -> tuple[FloatArray, FloatArray]:
    y = as_float_1d(y_true, "y_true")
    p = as_float_1d(y_prob, "y_prob")
    if y.shape != p.shape:
        raise InvalidInputError(
            f"y_true ({y.shape[0]}) and y_prob ({p.shape[0]}) differ in length.",
            field="y_prob",
        )
    if y.shape[0] == 0:
        raise InvalidInputError("y_true is empty.", field="y_true")
    if not np.all((y == 0.0) | (y == 1.0)):
        raise InvalidInputError("y_true must contain only 0 and 1.", field="y_true")
    if np.any(p < 0.0) or np.any(p > 1.0):
        raise InvalidInputError("y_prob has values outside [0, 1].", field="y_prob")
    return y, p


@dataclass(frozen=True)
class ReliabilityCurve:
    """Reliability diagram data; empty bins are dropped.

    Attributes
    ----------
    mean_predicted : ndarray of shape (n_nonempty,)
        Mean predicted probability per bin.
    observed_frequency : ndarray of shape (n_nonempty,)
        Fraction of positives per bin.
    counts : ndarray of shape (n_nonempty,)
        Number of pairs per bin.
    bin_edges : ndarray of shape (n_bins + 1,)
        Edges used (uniform on [0, 1] or quantiles of ``y_prob``).
    strategy : {"uniform", "quantile"}
        Binning strategy.
    """

    mean_predicted: FloatArray
    observed_frequency: FloatArray
    counts: IntArray
    bin_edges: FloatArray
    strategy: BinStrategy

    @property
    def ece(self) -> float:
        """Expected calibration error of these bins."""
        n = float(self.counts.sum())
        gaps = np.abs(self.observed_frequency - self.mean_predicted)
        return float(np.sum(self.counts * gaps) / n)


def reliability_curve(
    y_true: ArrayLike,
    y_prob: ArrayLike,
    *,
    n_bins: int = BINNING.n_bins,
    strategy: BinStrategy = "uniform",
) -> ReliabilityCurve:
    """Bin predictions and compare mean prediction with observed frequency.

    Binning matches :func:`sklearn.calibration.calibration_curve`: ``"uniform"``
    uses equal-width bins on [0, 1], ``"quantile"`` equal-mass bins with edges at
    the quantiles of ``y_prob``; a value on an inner edge falls in the lower bin.

    Parameters
    ----------
    y_true : array-like of shape (n,)
        Binary labels.
    y_prob : array-like of shape (n,)
        Predicted probabilities.
    n_bins : int, default=15
        Number of bins.
    strategy : {"uniform", "quantile"}, default="uniform"
        Equal-width or equal-mass bins.

    Returns
    -------
    ReliabilityCurve
        Per non-empty bin: mean prediction, frequency and count.
    """
    y, p = _check(y_true, y_prob)
    if n_bins < 1:
        raise InvalidInputError("n_bins must be >= 1.", field="n_bins")
    if strategy == "quantile":
        edges = np.percentile(p, np.linspace(0.0, 100.0, n_bins + 1))
    elif strategy == "uniform":
        edges = np.linspace(0.0, 1.0, n_bins + 1)
    else:
        raise InvalidInputError(
            "strategy must be 'uniform' or 'quantile'.", field="strategy"
        )
    ids = np.searchsorted(edges[1:-1], p)
    sums = np.bincount(ids, weights=p, minlength=n_bins)
    trues = np.bincount(ids, weights=y, minlength=n_bins)
    counts = np.bincount(ids, minlength=n_bins)
    nz = counts > 0
    return ReliabilityCurve(
        mean_predicted=sums[nz] / counts[nz],
        observed_frequency=trues[nz] / counts[nz],
        counts=counts[nz].astype(np.int64),
        bin_edges=np.asarray(edges, dtype=np.float64),
        strategy=strategy,
    )


def expected_calibration_error(
    y_true: ArrayLike,
    y_prob: ArrayLike,
    *,
    n_bins: int = BINNING.n_bins,
    strategy: BinStrategy = "uniform",
) -> float:
    r"""Compute the ECE :math:`\sum_b \frac{n_b}{n}|\bar y_b - \bar p_b|`.

    Parameters
    ----------
    y_true : array-like of shape (n,)
        Binary labels.
    y_prob : array-like of shape (n,)
        Predicted probabilities.
    n_bins : int, default=15
        Number of bins.
    strategy : {"uniform", "quantile"}, default="uniform"
        ``"uniform"`` for equal-width bins, ``"quantile"`` for equal-mass bins
        (:data:`BINNING` is the protocol of theory.md §4.7).

    Returns
    -------
    float
        ECE in [0, 1].
    """
    return reliability_curve(y_true, y_prob, n_bins=n_bins, strategy=strategy).ece


def brier_score(y_true: ArrayLike, y_prob: ArrayLike) -> float:
    r"""Brier score :math:`\frac1n\sum_i (p_i - y_i)^2`.

    Parameters
    ----------
    y_true : array-like of shape (n,)
        Binary labels.
    y_prob : array-like of shape (n,)
        Predicted probabilities.

    Returns
    -------
    float
        Mean squared error of the probabilities.
    """
    y, p = _check(y_true, y_prob)
    return float(np.mean((p - y) ** 2))


def negative_log_likelihood(
    y_true: ArrayLike, y_prob: ArrayLike, *, eps: float = NLL_EPS
) -> float:
    r"""Mean negative log-likelihood with :math:`p` clipped to :math:`[\epsilon,1-\epsilon]`.

    Parameters
    ----------
    y_true : array-like of shape (n,)
        Binary labels.
    y_prob : array-like of shape (n,)
        Predicted probabilities.
    eps : float, default=1e-15
        Clip that keeps a confident mistake finite.

    Returns
    -------
    float
        :math:`-\frac1n\sum_i y_i\log p_i + (1-y_i)\log(1-p_i)` (nats per pair).
    """
    y, p = _check(y_true, y_prob)
    p = np.clip(p, eps, 1.0 - eps)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def auroc(y_true: ArrayLike, y_prob: ArrayLike) -> float:
    """Area under the ROC curve; ``nan`` when only one class is present.

    Parameters
    ----------
    y_true : array-like of shape (n,)
        Binary labels.
    y_prob : array-like of shape (n,)
        Scores or probabilities.

    Returns
    -------
    float
        AUROC in [0, 1], or ``nan``.
    """
    y, p = _check(y_true, y_prob)
    if y.min() == y.max():
        return float("nan")
    return float(roc_auc_score(y, p))


@dataclass(frozen=True)
class TercileReliability:
    r"""Reliability split by tercile of query :math:`\ell` (theory.md §4.7).

    If norms matter, a norm-free calibrator is over-confident in one tercile and
    under-confident in another; a good norm-aware one removes the difference.

    Attributes
    ----------
    edges : ndarray of shape (4,)
        Tercile edges of the query ell (min, 1/3, 2/3, max).
    curves : tuple of ReliabilityCurve
        One curve per tercile (low, middle, high).
    ece : tuple of float
        ECE per tercile (``nan`` for an empty tercile).
    mean_gap : tuple of float
        Mean of (predicted - observed) per tercile: > 0 over-confident about
        relevance, < 0 under-confident.
    counts : tuple of int
        Pairs per tercile.
    """

    edges: FloatArray
    curves: tuple[ReliabilityCurve | None, ...]
    ece: tuple[float, ...]
    mean_gap: tuple[float, ...]
    counts: tuple[int, ...]


def reliability_by_tercile(
    y_true: ArrayLike,
    y_prob: ArrayLike,
    ell_q: ArrayLike,
    *,
    n_bins: int = 10,
    strategy: BinStrategy = "quantile",
) -> TercileReliability:
    r"""Reliability curves within terciles of the query :math:`\ell`.

    Parameters
    ----------
    y_true : array-like of shape (n,)
        Binary labels.
    y_prob : array-like of shape (n,)
        Predicted probabilities.
    ell_q : array-like of shape (n,)
        Query ell of each pair (column ``ell_q`` of ``X``).
    n_bins : int, default=10
        Bins per tercile.
    strategy : {"uniform", "quantile"}, default="quantile"
        Binning strategy within a tercile.

    Returns
    -------
    TercileReliability
        Curves, ECE and signed mean gap per tercile.
    """
    y, p = _check(y_true, y_prob)
    lq = as_float_1d(ell_q, "ell_q")
    if lq.shape != y.shape:
        raise InvalidInputError("ell_q must have one value per pair.", field="ell_q")
    edges = np.quantile(lq, [0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0])
    # Ties (e.g. unit norms, ell == 0 everywhere) would empty the upper terciles;
    # assign by rank instead so each tercile gets a third of the pairs.
    ranks = np.argsort(np.argsort(lq, kind="stable"), kind="stable")
    which = np.minimum((3 * ranks) // y.shape[0], 2)
    curves: list[ReliabilityCurve | None] = []
    eces: list[float] = []
    gaps: list[float] = []
    counts: list[int] = []
    for t in range(3):
        m = which == t
        counts.append(int(m.sum()))
        if not m.any():
            curves.append(None)
            eces.append(float("nan"))
            gaps.append(float("nan"))
            continue
        c = reliability_curve(y[m], p[m], n_bins=n_bins, strategy=strategy)
        curves.append(c)
        eces.append(c.ece)
        gaps.append(float(np.mean(p[m]) - np.mean(y[m])))
    return TercileReliability(
        edges=np.asarray(edges, dtype=np.float64),
        curves=tuple(curves),
        ece=tuple(eces),
        mean_gap=tuple(gaps),
        counts=tuple(counts),
    )


def paired_nll_gain(
    p_new: FloatArray, p_base: FloatArray, y: FloatArray, codes: IntArray
) -> tuple[float, float]:
    """OOF NLL gain of ``p_new`` over ``p_base`` and its standard error, nats per pair.

    Paired per query: pairs of one query are correlated, so the standard error is that
    of the sum of per-query differences of summed log loss (queries are the
    independent units), divided like the gain by the number of pairs. Infinite with
    a single query.
    """

    def loss(p: FloatArray) -> FloatArray:
        p = np.clip(p, 1e-15, 1.0 - 1e-15)
        return -(y * np.log(p) + (1.0 - y) * np.log1p(-p))

    per_query = np.bincount(codes, weights=loss(p_base) - loss(p_new))
    n_q, n = per_query.shape[0], y.shape[0]
    gain = float(per_query.sum())
    se = float(np.sqrt(n_q) * per_query.std(ddof=1)) if n_q > 1 else float("inf")
    return gain / n, se / n


def clear_nll_gain(
    p_new: FloatArray, p_base: FloatArray, y: FloatArray, codes: IntArray
) -> bool:
    """Whether ``p_new`` beats ``p_base`` in OOF NLL by more than one standard error.

    The one-standard-error rule of cross-validation (Breiman et al., 1984), applied to
    the paired per-query difference of summed log loss (:func:`paired_nll_gain`).
    """
    gain, se = paired_nll_gain(p_new, p_base, y, codes)
    return gain > se


def per_query_ndcg(
    y: FloatArray, p: FloatArray, codes: IntArray, tie: FloatArray, k: int = 10
) -> FloatArray:
    """nDCG@k of each query's judged pairs ordered by ``p`` (binary gains).

    Ties in ``p`` fall back to ``tie`` (descending; the cosine, as search orders
    them). A query whose pairs are all relevant or all irrelevant says nothing about
    an order: NaN.
    """
    n_q = int(codes.max()) + 1 if codes.size else 0
    out = np.full(n_q, np.nan)
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    for q in range(n_q):
        rows = np.flatnonzero(codes == q)
        labels = y[rows]
        n_pos = int(labels.sum())
        if n_pos == 0 or n_pos == len(rows):
            continue
        top = np.lexsort((-tie[rows], -p[rows]))[:k]
        dcg = float(labels[top] @ discount[: len(top)])
        out[q] = dcg / float(discount[: min(k, n_pos)].sum())
    return out


def paired_ndcg_gain(
    p_new: FloatArray,
    p_base: FloatArray,
    y: FloatArray,
    codes: IntArray,
    tie: FloatArray,
    k: int = 10,
) -> tuple[float, float]:
    """Mean per-query nDCG@k gain of ordering by ``p_new`` over ``p_base``, and its SE.

    Over the queries with both classes among their pairs (:func:`per_query_ndcg`);
    queries are the independent units. ``(0, inf)`` with fewer than two of them.
    """
    diff = per_query_ndcg(y, p_new, codes, tie, k) - per_query_ndcg(
        y, p_base, codes, tie, k
    )
    diff = diff[~np.isnan(diff)]
    if diff.size < 2:
        return 0.0, float("inf")
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(diff.size))
