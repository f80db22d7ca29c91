r"""Drift: whether served queries still look like the judged ones of a calibrator.

A calibrator's probabilities hold for queries like those it was fitted on. Each query
is summarised by a few numbers of its retrieval result (:data:`DRIFT_FEATURES`,
:func:`query_summary`): the same function summarises the judged queries at fit time
(:func:`reference_from`, stored in the fit report) and every served query
(:class:`ServedWindow`, the last ``size`` of them, counted into the reference's bins).

:func:`compare` then tests each feature and the top hit's positive rate:

* **PSI** per feature over the reference's bins (equal-mass on the judged queries,
  :math:`B = \operatorname{clip}(\lfloor n/5 \rfloor, 2, 10)`), with half a query added
  to every bin of both sides:
  :math:`\mathrm{PSI} = \sum_b (s_b - r_b)\ln(s_b / r_b)`. The usual reading: below
  0.1 stable, 0.1--0.25 moderate, above 0.25 a shift.
* Few judged queries make PSI large by chance alone: with :math:`n` judged and
  :math:`m` served queries from one distribution, PSI is about
  :math:`(1/n + 1/m)\,\chi^2_{B-1}`. A feature **moved** when its PSI is above 0.25
  *and* above that null's :math:`1 - \alpha/T` quantile, :math:`T` the number of tests
  (Bonferroni over the features and the rate; :math:`\alpha` = 0.05 for them all).
* **Positive rate**: the mean probability of the served queries' top hits (the
  precision at 1 the calibrator predicts for them) against the share of judged
  queries whose top hit was relevant. It moved when it falls outside that share's
  Wilson interval at the same :math:`\alpha/T` *and* is at least 0.1 away from it.

Nothing here does I/O; the service keeps the windows (``app.services.drift``).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
from scipy.stats import chi2, norm

from calibration._typing import ArrayLike, FloatArray, IntArray
from calibration._validation import as_float_1d
from calibration.exceptions import InsufficientDataError, InvalidInputError
from calibration.features import LexicalEvidence

__all__ = [
    "DRIFT_FEATURES",
    "FAMILY_ALPHA",
    "MAX_BINS",
    "PSI_MODERATE",
    "PSI_SHIFT",
    "RATE_SHIFT",
    "DriftReference",
    "DriftVerdict",
    "FeatureReference",
    "FeatureShift",
    "RateShift",
    "ServedWindow",
    "compare",
    "psi",
    "psi_critical",
    "query_summary",
    "reference_from",
]

DRIFT_FEATURES: tuple[str, ...] = (
    "top_cosine",
    "top_gap",
    "query_tokens",
    "top_lexical",
    "top_probability",
)
"""What :func:`query_summary` measures of one query, in its order."""
TOP_COSINE, TOP_GAP, QUERY_TOKENS, TOP_LEXICAL, TOP_PROBABILITY = range(
    len(DRIFT_FEATURES)
)
GAP_RANK = 5
"""``top_gap`` is the top cosine minus the cosine at this rank (or the last one)."""
MAX_BINS = 10
"""Bins of a feature's reference (equal-mass on the judged queries)."""
QUERIES_PER_BIN = 5
"""Judged queries per reference bin: ``B = clip(n // 5, 2, MAX_BINS)``."""
MIN_BINS = 2
PSI_MODERATE = 0.1
PSI_SHIFT = 0.25
RATE_SHIFT = 0.1
"""Least distance of the served positive rate from the judged one that counts."""
FAMILY_ALPHA = 0.05
"""Chance that a window of queries like the judged ones is called drifting."""
_SMOOTHING = 0.5  # queries added to every bin of both sides (no log of zero)

Level = Literal["stable", "moderate", "shift"]


def query_summary(
    scores: ArrayLike,
    n_tokens: int,
    lexical: LexicalEvidence | None,
    probabilities: ArrayLike,
) -> FloatArray:
    """The :data:`DRIFT_FEATURES` of one query's retrieval result.

    Parameters
    ----------
    scores : array-like of shape (k,)
        Cosines of the hits (any order; the top hit is the first largest).
    n_tokens : int
        Token count of the query.
    lexical : LexicalEvidence or None
        BM25 evidence of the same hits (``None``: no lexical match).
    probabilities : array-like of shape (k,)
        Calibrated P(relevant) of the same hits.

    Returns
    -------
    ndarray of shape (5,)
        Top cosine; top cosine minus the cosine at rank :data:`GAP_RANK`; token count;
        the top hit's BM25 over the query's IDF mass (its share of a perfect lexical
        match); the top hit's probability.
    """
    s = as_float_1d(scores, "scores")
    p = as_float_1d(probabilities, "probabilities")
    if s.shape[0] == 0 or p.shape != s.shape:
        raise InvalidInputError(
            "a query summary needs one probability per hit, and a hit.", field="scores"
        )
    top = int(np.argmax(s))
    ordered = np.sort(s)[::-1]
    lex = 0.0
    if lexical is not None and lexical.idf_mass > 0:
        lex = float(lexical.bm25[top]) / lexical.idf_mass
    return np.array(
        [
            ordered[0],
            ordered[0] - ordered[min(GAP_RANK, len(ordered)) - 1],
            float(n_tokens),
            lex,
            p[top],
        ],
        dtype=np.float64,
    )


@dataclass(frozen=True)
class FeatureReference:
    """One feature's distribution over the judged queries.

    Attributes
    ----------
    name : str
        One of :data:`DRIFT_FEATURES`.
    edges : ndarray of shape (B - 1,)
        Inner bin edges, increasing; a value ``v`` falls in bin
        ``bisect_right(edges, v)``.
    counts : ndarray of shape (B,)
        Judged queries per bin.
    """

    name: str
    edges: FloatArray
    counts: IntArray


@dataclass(frozen=True)
class DriftReference:
    """The judged queries of a fit, summarised for drift (module docstring).

    Attributes
    ----------
    n_queries : int
        Judged queries that retrieved something.
    features : tuple of FeatureReference
        One per feature, in :data:`DRIFT_FEATURES` order.
    top_relevant : int
        Judged queries whose top hit (by cosine) was relevant.
    """

    n_queries: int
    features: tuple[FeatureReference, ...]
    top_relevant: int


def reference_from(summaries: ArrayLike, top_relevant: ArrayLike) -> DriftReference:
    """Bin the judged queries' summaries into a :class:`DriftReference`.

    Parameters
    ----------
    summaries : array-like of shape (n, 5)
        :func:`query_summary` of each judged query.
    top_relevant : array-like of shape (n,)
        True where the query's top hit was judged relevant.

    Returns
    -------
    DriftReference
        Equal-mass bins per feature (fewer where values tie).
    """
    S = np.asarray(summaries, dtype=np.float64)
    hit = np.asarray(top_relevant, dtype=bool)
    if S.ndim != 2 or S.shape[1] != len(DRIFT_FEATURES) or hit.shape != S.shape[:1]:
        raise InvalidInputError(
            f"summaries must be (n, {len(DRIFT_FEATURES)}) with one flag per row.",
            field="summaries",
        )
    if S.shape[0] == 0:
        raise InsufficientDataError("no judged query to summarise.", n_queries=0)
    if not np.all(np.isfinite(S)):
        raise InvalidInputError("summaries must be finite.", field="summaries")
    n = S.shape[0]
    n_bins = min(max(n // QUERIES_PER_BIN, MIN_BINS), MAX_BINS)
    levels = np.linspace(0.0, 1.0, n_bins + 1)[1:-1]
    features = []
    for j, name in enumerate(DRIFT_FEATURES):
        edges = np.unique(np.quantile(S[:, j], levels))
        bins = np.searchsorted(edges, S[:, j], side="right")
        counts = np.bincount(bins, minlength=len(edges) + 1).astype(np.int64)
        features.append(FeatureReference(name, edges.astype(np.float64), counts))
    return DriftReference(n, tuple(features), int(hit.sum()))


class ServedWindow:
    """The last ``size`` served queries, counted into a reference's bins.

    ``add`` is O(features) and allocates nothing: each query's bin indices sit in a
    ring, and the per-bin counts are updated as queries enter and leave it. Not
    thread-safe (the service holds a lock).

    Attributes
    ----------
    n : int
        Queries in the window (at most ``size``).
    seen : int
        Queries added since the window was made.
    """

    def __init__(self, reference: DriftReference, size: int) -> None:
        if size < 1:
            raise InvalidInputError("a window holds at least one query.", field="size")
        self.reference = reference
        self.size = size
        self._columns = [DRIFT_FEATURES.index(f.name) for f in reference.features]
        self._edges = [f.edges.tolist() for f in reference.features]
        self._rows = np.arange(len(self._columns))
        self._bins = np.zeros((size, len(self._columns)), dtype=np.uint8)
        self._top_p = np.zeros(size)
        self._counts = np.zeros((len(self._columns), MAX_BINS), dtype=np.int64)
        self._next = 0
        self.n = 0
        self.seen = 0

    def add(self, summary: FloatArray) -> None:
        """Count one :func:`query_summary` in (the oldest one out when full)."""
        row = [
            bisect_right(edges, float(summary[c]))
            for c, edges in zip(self._columns, self._edges, strict=True)
        ]
        slot = self._next
        if self.n == self.size:
            self._counts[self._rows, self._bins[slot]] -= 1
        else:
            self.n += 1
        self._bins[slot] = row
        self._counts[self._rows, row] += 1
        self._top_p[slot] = float(summary[TOP_PROBABILITY])
        self._next = (slot + 1) % self.size
        self.seen += 1

    def counts(self) -> list[IntArray]:
        """Served queries per bin of each reference feature."""
        return [
            self._counts[i, : len(edges) + 1].copy()
            for i, edges in enumerate(self._edges)
        ]

    def predicted_rate(self) -> float:
        """Mean probability of the top hits in the window (nan when empty)."""
        return float(self._top_p[: self.n].mean()) if self.n else math.nan


@dataclass(frozen=True)
class FeatureShift:
    """How far one feature of the served queries is from the judged ones."""

    feature: str
    psi: float
    level: Level
    critical: float
    """The PSI the two sample sizes alone exceed with probability alpha/T."""
    moved: bool


@dataclass(frozen=True)
class RateShift:
    """The predicted precision at 1 of served queries against the judged one."""

    predicted: float
    judged: float
    low: float
    high: float
    moved: bool


@dataclass(frozen=True)
class DriftVerdict:
    """The result of :func:`compare`."""

    n_served: int
    features: tuple[FeatureShift, ...]
    positive_rate: RateShift

    @property
    def moved(self) -> list[str]:
        """Names of what moved (features, then ``positive_rate``)."""
        out = [f.feature for f in self.features if f.moved]
        return out + (["positive_rate"] if self.positive_rate.moved else [])

    @property
    def drifting(self) -> bool:
        """Whether anything moved."""
        return bool(self.moved)


def psi(reference: ArrayLike, served: ArrayLike) -> float:
    """Population stability index of two count vectors over the same bins.

    Half a query is added to every bin of both sides, so empty bins stay finite.
    """
    r = np.asarray(reference, dtype=np.float64) + _SMOOTHING
    s = np.asarray(served, dtype=np.float64) + _SMOOTHING
    if r.shape != s.shape or r.ndim != 1:
        raise InvalidInputError("both sides need the same bins.", field="served")
    r /= r.sum()
    s /= s.sum()
    return float(np.sum((s - r) * np.log(s / r)))


def psi_critical(n_reference: int, n_served: int, n_bins: int, alpha: float) -> float:
    r"""The PSI two samples of one distribution exceed with probability ``alpha``.

    :math:`(1/n + 1/m)\,\chi^2_{B-1}(1-\alpha)`: PSI is the symmetrised KL divergence,
    which for small differences is the two-sample chi-square statistic over
    :math:`n m / (n + m)`.
    """
    if min(n_reference, n_served) < 1 or n_bins < 2 or not 0 < alpha < 1:
        raise InvalidInputError(
            "need samples on both sides, two bins, alpha in (0, 1)."
        )
    return (1.0 / n_reference + 1.0 / n_served) * _chi2_quantile(
        1.0 - alpha, n_bins - 1
    )


@lru_cache(maxsize=64)
def _chi2_quantile(q: float, df: int) -> float:
    return float(chi2.ppf(q, df))


@lru_cache(maxsize=64)
def _normal_quantile(q: float) -> float:
    return float(norm.ppf(q))


def _level(value: float) -> Level:
    if value < PSI_MODERATE:
        return "stable"
    return "moderate" if value <= PSI_SHIFT else "shift"


def _wilson(k: int, n: int, z: float) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def compare(
    reference: DriftReference,
    counts: Sequence[IntArray],
    predicted_rate: float,
    *,
    alpha: float = FAMILY_ALPHA,
) -> DriftVerdict:
    """Test served queries against the judged ones (module docstring).

    Parameters
    ----------
    reference : DriftReference
        The judged queries.
    counts : sequence of ndarray
        Served queries per bin of each reference feature
        (:meth:`ServedWindow.counts`); all sum to the number served.
    predicted_rate : float
        Mean probability of the served queries' top hits.
    alpha : float, default=0.05
        Chance that served queries like the judged ones are called drifting.

    Returns
    -------
    DriftVerdict
        Every feature's PSI, level, critical value and whether it moved, and the
        positive rate's.
    """
    if len(counts) != len(reference.features):
        raise InvalidInputError("one count vector per feature.", field="counts")
    n_served = int(np.sum(counts[0])) if counts else 0
    tests = len(reference.features) + 1
    shifts = []
    for feature, served in zip(reference.features, counts, strict=True):
        value = psi(feature.counts, served)
        critical = psi_critical(
            reference.n_queries, n_served, len(feature.counts), alpha / tests
        )
        shifts.append(
            FeatureShift(
                feature=feature.name,
                psi=value,
                level=_level(value),
                critical=critical,
                moved=value > PSI_SHIFT and value > critical,
            )
        )
    judged = reference.top_relevant / reference.n_queries
    low, high = _wilson(
        reference.top_relevant,
        reference.n_queries,
        _normal_quantile(1.0 - alpha / tests / 2),
    )
    outside = not low <= predicted_rate <= high
    rate = RateShift(
        predicted=predicted_rate,
        judged=judged,
        low=low,
        high=high,
        moved=outside and abs(predicted_rate - judged) >= RATE_SHIFT,
    )
    return DriftVerdict(n_served, tuple(shifts), rate)
