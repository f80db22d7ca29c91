r"""A cross-domain prior for a collection nobody has judged yet (issue 9).

What transfers across collections is the *shape* of relevance in the retrieval evidence
(cosine, list position, query length); what does not is the *level*: the base rate of
relevance among the top hits ranged from 2 % to 59 % across the staged sets and nothing
in one query's score list recovered it. So the prior is a logistic model

.. math:: \operatorname{logit} P(\text{rel}) = c_k + w^\top \tilde\phi(x),

with :math:`\tilde\phi` the standardised transferable features, one shared slope
vector :math:`w`, and a per-domain level :math:`c_k`. :func:`fit_prior` fits it on
several labelled sets, **each set weighted equally** (not each pair), and summarises the
levels as a heavy-tailed distribution :math:`c \sim t_4(\mu, \tau^2)` across domains
and the slopes' spread :math:`\tau_w` across domains (per-set refits).

* With no judgments, :meth:`CrossDomainPrior.predict_proba` predicts at the served
  level :math:`\mu + \delta` and :meth:`CrossDomainPrior.predict_interval` gives the
  interval a new domain's level would fall in (the t quantile, scale widened by
  :math:`\sqrt{1 + 1/K}` for a new draw, times a width multiplier), so a user sees
  "between 0.05 and 0.8" instead of a false 0.3. :func:`lodo_calibrate` chooses
  :math:`\delta` and the multiplier leave-one-dataset-out: the level that minimises
  the held-out Brier score relative to each set's own base rate, and the smallest
  width at which every held-out set is covered.
* With ``n`` judged queries, :class:`PriorCalibrator` fits the collection's level by
  MAP under that t prior and shrinks the slopes toward :math:`w` with prior SD
  :math:`\tau_w \max(1, \sqrt{n / n_0})` (the prior loosens as judgments arrive, as the
  NT family does for its norm terms). Its intervals come from the Laplace posterior, so
  they shrink as judgments arrive.

:func:`coherent_confidence` turns hit probabilities into a query confidence that is
coherent (monotone in ``k``, between the largest hit probability and their sum), and
:func:`norm_lift_verdict` says whether norm terms earned their place by the
one-standard-error rule of :mod:`calibration.selection`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import minimize, minimize_scalar
from scipy.special import expit
from scipy.stats import beta as beta_dist
from scipy.stats import t as student_t
from sklearn.base import BaseEstimator

from calibration._typing import ArrayLike, FloatArray
from calibration._validation import as_float_1d, as_float_2d, as_groups, as_labels
from calibration.exceptions import (
    FORMAT_VERSION,
    InsufficientDataError,
    InvalidInputError,
    NotFittedCalibratorError,
    UnsupportedFormatError,
)
from calibration.features import FEATURES, LEX_RANK, LEXICAL_FEATURES, ORDER_FEATURES
from calibration.fusion import pair_rrf
from calibration.metrics import (
    brier_score,
    clear_nll_gain,
    negative_log_likelihood,
    reliability_curve,
)

__all__ = [
    "AGNOSTIC_FEATURES",
    "FUSION_FEATURES",
    "NORM_FEATURES",
    "PRIOR_FEATURES",
    "CrossDomainPrior",
    "LodoChoice",
    "NormVerdict",
    "PriorCalibrator",
    "coherent_confidence",
    "fit_confidence_weight",
    "fit_prior",
    "interval_coverage",
    "interval_coverages",
    "lodo_calibrate",
    "norm_lift_verdict",
    "t_location_scale",
]

PRIOR_FEATURES: tuple[str, ...] = ("cosine", "rank", "gap", "len_q")
"""Default features of the prior: query-side, so probabilities never reorder hits."""

AGNOSTIC_FEATURES: tuple[str, ...] = (
    "rank",
    "gap",
    "len_q",
    "lex",
    "lex_rel",
    "lex_rank",
)
"""Features of the model-agnostic prior: list position, the gap to the top score,
query length and lexical evidence — no raw cosine, whose scale is the model's."""

NORM_FEATURES: tuple[str, ...] = ("ell_q", "ell_d")
"""Residual-norm columns; add them to ``features`` only where they earn it."""

FUSION_FEATURES: tuple[str, ...] = ("rrf",)
"""Derived, not a column: the pair's reciprocal-rank fusion of its cosine-list and
BM25-list ranks (:func:`calibration.fusion.pair_rrf`). ``log(rank)`` and
``log(lex_rank)`` weigh the top of each list steeply; ``rrf`` is nearly linear in the
ranks and rewards a hit both lists hold, so a prior can order like RRF where that is
what the judgments say. The shipped profiles do not use it: leave one dataset out it
did not order the whole hybrid pool better (``benchmarks/fusion_lodo.py``)."""

# Within one query rank and gap fall as the cosine rises: with these signs the logit is
# non-decreasing in the cosine, so the prior never reorders a query's hits. Lexical
# evidence can only raise a hit (more of the query's terms, a better BM25 rank), and
# so can a better place in the handing-over retriever's list (order features).
_SIGN: dict[str, int] = {
    "cosine": +1,
    "rank": -1,
    "gap": -1,
    "lex": +1,
    "lex_rel": +1,
    "lex_rank": -1,
    "rrf": +1,
    "in_rank": -1,
    "in_gap": -1,
}
_LOG_COLUMNS = frozenset({"rank", "lex_rank", "in_rank"})
_DOC_SIDE = frozenset(
    {"ell_d", "len_d", *LEXICAL_FEATURES, *ORDER_FEATURES, *FUSION_FEATURES}
)
_SLOPE_PRIOR_SD = 10.0  # weak ridge of the pooled fit (standardised units)
_PER_SET_SD = 1.0  # per-set refits shrink toward the shared slope with this SD
_MIN_SLOPE_SD = 0.05  # floor of the across-domain slope spread
_N_LOOSEN = 30  # below this many judged queries the slope prior keeps its width
LEVEL_DF = 4.0
"""Degrees of freedom of the level distribution: tails heavy enough that one domain
far from the rest (a collection with one relevant passage per query among thousands)
is a plausible draw, not a many-sigma event."""
COVERAGE_ALPHA = 0.05
"""Sampling error allowed for a bin's observed rate by :func:`interval_coverage`."""
OFFSET_GRID = np.round(np.arange(-3.0, 1.0001, 0.125), 3)
"""Served level offsets :func:`lodo_calibrate` tries."""
WIDTH_GRID = np.round(np.arange(0.5, 6.0001, 0.05), 2)
"""Half-width multipliers :func:`lodo_calibrate` tries."""


def _columns(features: Sequence[str]) -> int:
    """Columns of ``X`` a prior over ``features`` reads (``rrf``: up to ``lex_rank``)."""
    last = (LEX_RANK if f in FUSION_FEATURES else FEATURES.index(f) for f in features)
    return max(last) + 1


def _design(X: FloatArray, features: Sequence[str]) -> FloatArray:
    """Raw transferable features; ranks enter as ``log(rank)``, ``rrf`` is derived."""
    cols = []
    for name in features:
        if name in FUSION_FEATURES:
            cols.append(pair_rrf(X))
            continue
        col = X[:, FEATURES.index(name)]
        cols.append(np.log(np.maximum(col, 1.0)) if name in _LOG_COLUMNS else col)
    return np.column_stack(cols)


def _check_features(features: Sequence[str]) -> tuple[str, ...]:
    known = (*FEATURES, *FUSION_FEATURES)
    unknown = [f for f in features if f not in known]
    if unknown or not features:
        raise InvalidInputError(
            f"features must be a non-empty subset of {known}, got {unknown}.",
            field="features",
        )
    return tuple(features)


def _bounds(features: Sequence[str]) -> list[tuple[float | None, float | None]]:
    out: list[tuple[float | None, float | None]] = []
    for name in features:
        sign = _SIGN.get(name, 0)
        out.append(
            (0.0, None) if sign > 0 else (None, 0.0) if sign < 0 else (None, None)
        )
    return out


def _map_logistic(
    Z: FloatArray,
    y: FloatArray,
    weight: FloatArray,
    mean: FloatArray,
    sd: FloatArray,
    bounds: list[tuple[float | None, float | None]],
    level_df: float | None = None,
) -> tuple[FloatArray, FloatArray]:
    r"""MAP of a weighted logistic regression with independent priors.

    :math:`z = Z\theta`, :math:`\theta_j \sim \mathcal N(\text{mean}_j,
    \text{sd}_j^2)`, except the first coordinate (the level) when ``level_df`` is
    set: a Student-t with that many degrees of freedom and scale ``sd[0]``, so a few
    judgments can move a level that sits in the prior's tail. Sign bounds by
    L-BFGS-B. Returns the estimate and its Laplace covariance (the inverse Hessian at
    the optimum, with the t prior's Fisher information for the level).
    """
    prec = 1.0 / np.square(sd)
    gauss = np.ones_like(prec)
    if level_df is not None:
        gauss[0] = 0.0
        nu_s2 = level_df * sd[0] ** 2

    def objective(theta: FloatArray) -> tuple[float, FloatArray]:
        z = Z @ theta
        d = theta - mean
        loss = float(
            weight @ (np.logaddexp(0.0, z) - y * z) + 0.5 * (gauss * prec) @ (d * d)
        )
        grad = Z.T @ (weight * (expit(z) - y)) + gauss * prec * d
        if level_df is not None:
            loss += 0.5 * (level_df + 1.0) * math.log1p(d[0] ** 2 / nu_s2)
            grad[0] += (level_df + 1.0) * d[0] / (nu_s2 + d[0] ** 2)
        return loss, grad

    lower = [-np.inf if lo is None else lo for lo, _ in bounds]
    upper = [np.inf if hi is None else hi for _, hi in bounds]
    x0 = np.clip(mean, lower, upper)
    res = minimize(
        objective,
        x0,
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        options={"maxiter": 1000},
    )
    theta = np.asarray(res.x, dtype=np.float64)
    p = expit(Z @ theta)
    if level_df is not None:
        prec[0] *= (level_df + 1.0) / (level_df + 3.0)
    H = Z.T @ ((weight * p * (1.0 - p))[:, None] * Z) + np.diag(prec)
    return theta, np.linalg.pinv(0.5 * (H + H.T))


# ----------------------------------------------------------------------------- the prior


@dataclass(frozen=True)
class CrossDomainPrior:
    r"""Shared shape and across-domain level distribution (see the module docstring).

    Attributes
    ----------
    features : tuple of str
        Columns of ``FEATURES`` used (``rank`` and ``lex_rank`` as logs).
    center, scale : tuple of float
        Standardisation of the raw features (set-weighted mean and SD).
    slope : tuple of float
        Shared slopes :math:`w` on the standardised features.
    slope_sd : tuple of float
        Across-domain SD :math:`\tau_w` of per-set slopes (floored at 0.05).
    level_mean, level_sd : float
        Mean :math:`\mu` and SD :math:`\tau` of the per-domain levels.
    levels : tuple of float
        Fitted level of each training set (in ``domains`` order).
    domains : tuple of str
        Names of the training sets.
    coverage : float
        Nominal coverage of the intervals (0.8: 10th to 90th percentile).
    level_df : float or None
        Degrees of freedom of the Student-t the levels follow (``level_mean`` its
        location, ``level_sd`` its scale); ``None``: a normal (profiles before the
        heavy-tailed prior), whose interval takes the t quantile with ``K - 1``.
    width : float
        Multiplier of the interval's half-width, chosen by :func:`lodo_calibrate` so
        that leave-one-dataset-out coverage reaches ``coverage`` on every held-out set.
    point_offset : float
        Where a new domain's level is served, relative to ``level_mean``: chosen by
        :func:`lodo_calibrate` to minimise the held-out Brier score relative to a
        constant at each set's own base rate. Negative when over-stating a sparse
        collection's level costs more than under-stating a dense one's (it does).
    """

    features: tuple[str, ...]
    center: tuple[float, ...]
    scale: tuple[float, ...]
    slope: tuple[float, ...]
    slope_sd: tuple[float, ...]
    level_mean: float
    level_sd: float
    levels: tuple[float, ...]
    domains: tuple[str, ...]
    coverage: float = 0.8
    level_df: float | None = None
    width: float = 1.0
    point_offset: float = 0.0

    @property
    def n_domains(self) -> int:
        """Number of training domains :math:`K`."""
        return len(self.levels)

    @property
    def predictive_level_sd(self) -> float:
        r"""SD of a *new* domain's level: :math:`\tau\sqrt{1 + 1/K}`."""
        return self.level_sd * math.sqrt(1.0 + 1.0 / self.n_domains)

    @property
    def quantile(self) -> float:
        """Half-width multiplier: ``width`` times the level distribution's quantile."""
        df = self.n_domains - 1 if self.level_df is None else self.level_df
        return self.width * _t_quantile(0.5 + self.coverage / 2.0, float(df))

    @property
    def reorders_hits(self) -> bool:
        """Whether document-side features can reorder a query's hits."""
        return bool(_DOC_SIDE & set(self.features))

    def standardise(self, X: ArrayLike) -> FloatArray:
        """``[1, (phi(X) - center) / scale]``: the design of the level and slopes."""
        Xa = as_float_2d(X, "X", min_columns=_columns(self.features))
        Z = (_design(Xa, self.features) - np.array(self.center)) / np.array(self.scale)
        return np.column_stack([np.ones(Xa.shape[0]), Z])

    def prior_mean_sd(self, n_queries: int = 0) -> tuple[FloatArray, FloatArray]:
        """Prior mean and SD of ``[level, slopes]`` for a fit on ``n_queries``."""
        loosen = max(1.0, math.sqrt(n_queries / _N_LOOSEN))
        mean = np.array([self.level_mean + self.point_offset, *self.slope])
        sd = np.array([self.predictive_level_sd, *(s * loosen for s in self.slope_sd)])
        return mean, sd

    def predict_proba(self, X: ArrayLike) -> FloatArray:
        """Zero-label probability of each pair at the mean level."""
        mean, _ = self.prior_mean_sd()
        out: FloatArray = expit(self.standardise(X) @ mean)
        return out

    def predict_interval(self, X: ArrayLike) -> tuple[FloatArray, FloatArray]:
        """Zero-label ``(lo, hi)`` per pair from the across-domain spread."""
        mean, sd = self.prior_mean_sd()
        return _interval(self.standardise(X), mean, np.diag(sd**2), self.quantile)

    # -- persistence (calibration.io's versioned style) ------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Strict-JSON payload ``{"format_version", "class", "fields"}``."""
        fields = {
            "features": list(self.features),
            "center": list(self.center),
            "scale": list(self.scale),
            "slope": list(self.slope),
            "slope_sd": list(self.slope_sd),
            "level_mean": self.level_mean,
            "level_sd": self.level_sd,
            "levels": list(self.levels),
            "domains": list(self.domains),
            "coverage": self.coverage,
            "width": self.width,
            "point_offset": self.point_offset,
        }
        if self.level_df is not None:
            fields["level_df"] = self.level_df
        return {
            "format_version": FORMAT_VERSION,
            "class": "CrossDomainPrior",
            "fields": fields,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CrossDomainPrior:
        """Inverse of :meth:`to_dict`; floats round-trip bit for bit through JSON."""
        if data.get("format_version") != FORMAT_VERSION or data.get("class") != (
            "CrossDomainPrior"
        ):
            raise UnsupportedFormatError(
                f"Not a CrossDomainPrior payload of format_version {FORMAT_VERSION}.",
                format_version=data.get("format_version"),
                class_name=data.get("class"),
            )
        try:
            f = data["fields"]
            level_df, width = f.get("level_df"), float(f.get("width", 1.0))
            offset = float(f.get("point_offset", 0.0))
            if level_df is not None and not 0.5 <= float(level_df) <= 1e6:
                raise ValueError("level_df must be in [0.5, 1e6]")
            if not 1e-3 <= width <= 1e3:
                raise ValueError("width must be in [0.001, 1000]")
            if not -20.0 <= offset <= 20.0:
                raise ValueError("point_offset must be in [-20, 20]")
            return cls(
                features=_check_features([str(v) for v in f["features"]]),
                center=tuple(float(v) for v in f["center"]),
                scale=tuple(float(v) for v in f["scale"]),
                slope=tuple(float(v) for v in f["slope"]),
                slope_sd=tuple(float(v) for v in f["slope_sd"]),
                level_mean=float(f["level_mean"]),
                level_sd=float(f["level_sd"]),
                levels=tuple(float(v) for v in f["levels"]),
                domains=tuple(str(v) for v in f["domains"]),
                coverage=float(f["coverage"]),
                level_df=None if level_df is None else float(level_df),
                width=width,
                point_offset=offset,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UnsupportedFormatError(
                f"Malformed CrossDomainPrior payload: {exc}",
                class_name="CrossDomainPrior",
            ) from exc


def _interval(
    Z: FloatArray, mean: FloatArray, cov: FloatArray, q: float
) -> tuple[FloatArray, FloatArray]:
    z = Z @ mean
    half = q * np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", Z, cov, Z), 0.0))
    return expit(z - half), expit(z + half)


def fit_prior(
    sets: Mapping[str, tuple[ArrayLike, ArrayLike]],
    *,
    features: Sequence[str] = PRIOR_FEATURES,
    coverage: float = 0.8,
    level_df: float | None = LEVEL_DF,
    width: float = 1.0,
    point_offset: float = 0.0,
) -> CrossDomainPrior:
    r"""Fit the cross-domain prior on labelled sets, each set weighted equally.

    1. Standardise the features by their set-weighted mean and SD.
    2. Fit one logistic model with a level per set and shared slopes, every pair of
       set :math:`k` weighted :math:`\bar N / N_k` (so each set counts equally whatever
       its size), slopes under a weak :math:`\mathcal N(0, 10^2)` ridge and the sign
       constraints that keep hit order.
    3. The levels follow a Student-t with ``level_df`` degrees of freedom: its
       location and scale are fitted to the per-set levels by maximum likelihood
       (:func:`t_location_scale`), so one domain with an extreme level neither drags
       the centre nor hides in a normal's thin tails (``None``: their mean and SD).
       The slopes' SD across per-set refits (each shrunk toward the shared slope with
       SD 1) is :math:`\tau_w`.

    Parameters
    ----------
    sets : mapping of name to (X, y)
        Pair features in ``FEATURES`` order and binary labels of each domain; at least
        three domains with both classes.
    features : sequence of str, default=PRIOR_FEATURES
        Columns to use.
    coverage : float, default=0.8
        Nominal coverage of the intervals.
    level_df : float or None, default=LEVEL_DF
        Degrees of freedom of the level distribution (``None``: normal).
    width, point_offset : float, default=1.0 and 0.0
        Interval half-width multiplier and served level offset
        (:func:`lodo_calibrate` chooses them).

    Returns
    -------
    CrossDomainPrior
    """
    feats = _check_features(features)
    if len(sets) < 3:
        raise InsufficientDataError(
            f"A cross-domain prior needs at least 3 domains, got {len(sets)}.",
            n_queries=len(sets),
            required=3,
        )
    if not 0.0 < coverage < 1.0:
        raise InvalidInputError("coverage must be in (0, 1).", field="coverage")
    names = list(sets)
    raw, ys = [], []
    for name in names:
        X, y = sets[name]
        Xa = as_float_2d(X, "X", min_columns=_columns(feats))
        raw.append(_design(Xa, feats))
        ys.append(as_labels(y, Xa.shape[0]))
    center = np.mean([r.mean(axis=0) for r in raw], axis=0)
    spread = np.mean([((r - center) ** 2).mean(axis=0) for r in raw], axis=0)
    scale = np.where(spread > 0, np.sqrt(spread), 1.0)
    Zs = [(r - center) / scale for r in raw]
    p = len(feats)
    levels, slope = _pooled_fit(Zs, ys, _bounds(feats))
    per_set: list[FloatArray] = []
    for level, Zk, yk in zip(levels, Zs, ys, strict=True):
        mean = np.concatenate([[level], slope])
        sd = np.concatenate([[_SLOPE_PRIOR_SD], np.full(p, _PER_SET_SD)])
        design = np.column_stack([np.ones(len(Zk)), Zk])
        th, _ = _map_logistic(
            design, yk, np.ones(len(yk)), mean, sd, [(None, None), *_bounds(feats)]
        )
        per_set.append(th[1:])
    slope_sd = np.maximum(np.std(per_set, axis=0, ddof=1), _MIN_SLOPE_SD)
    if level_df is None:
        location, spread_ = float(levels.mean()), float(levels.std(ddof=1))
    else:
        location, spread_ = t_location_scale(levels, level_df)
    return CrossDomainPrior(
        features=feats,
        center=tuple(float(v) for v in center),
        scale=tuple(float(v) for v in scale),
        slope=tuple(float(v) for v in slope),
        slope_sd=tuple(float(v) for v in slope_sd),
        level_mean=location,
        level_sd=spread_,
        levels=tuple(float(v) for v in levels),
        domains=tuple(str(n) for n in names),
        coverage=float(coverage),
        level_df=level_df,
        width=float(width),
        point_offset=float(point_offset),
    )


def _pooled_fit(
    Zs: Sequence[FloatArray],
    ys: Sequence[FloatArray],
    bounds: list[tuple[float | None, float | None]],
) -> tuple[FloatArray, FloatArray]:
    r"""MAP levels and shared slopes of the pooled fit (step 2 of :func:`fit_prior`).

    :math:`z = c_{k(i)} + Z_i w`, every pair of domain :math:`k` weighted
    :math:`\bar N / N_k`, all coefficients under :math:`\mathcal N(0, 10^2)`, slopes
    sign-bounded. The design's level columns are indicators: the logit is a lookup
    plus one product with the slopes, not a product with ``K`` mostly-zero columns.
    """
    K = len(Zs)
    Z = np.vstack(Zs)
    y = np.concatenate(ys)
    at = np.repeat(np.arange(K), [len(v) for v in ys])
    n_bar = np.mean([len(v) for v in ys])
    w = np.concatenate([np.full(len(v), n_bar / len(v)) for v in ys])
    prec = 1.0 / _SLOPE_PRIOR_SD**2

    def objective(theta: FloatArray) -> tuple[float, FloatArray]:
        z = theta[:K][at] + Z @ theta[K:]
        loss = float(w @ (np.logaddexp(0.0, z) - y * z) + 0.5 * prec * theta @ theta)
        r = w * (expit(z) - y)
        grad = np.concatenate([np.bincount(at, r, minlength=K), Z.T @ r])
        return loss, grad + prec * theta

    res = minimize(
        objective,
        np.zeros(K + Z.shape[1]),
        jac=True,
        method="L-BFGS-B",
        bounds=[(None, None)] * K + bounds,
        options={"maxiter": 1000},
    )
    theta = np.asarray(res.x, dtype=np.float64)
    return theta[:K], theta[K:]


def t_location_scale(values: ArrayLike, df: float) -> tuple[float, float]:
    r"""Maximum-likelihood location and scale of a Student-t with ``df`` dof.

    The EM iteration of Lange, Little and Taylor (1989): weights
    :math:`(\nu + 1) / (\nu + r^2)` on standardised residuals ``r``; the scale's sum
    is divided by ``n - 1`` (as ``ddof=1`` for a normal) so three levels do not give a
    scale of almost nothing.
    """
    v = as_float_1d(values, "values")
    location, scale = float(np.median(v)), float(v.std(ddof=1)) or 1.0
    for _ in range(200):
        r2 = ((v - location) / scale) ** 2
        w = (df + 1.0) / (df + r2)
        new_location = float(w @ v / w.sum())
        new_scale = math.sqrt(float(w @ (v - new_location) ** 2) / (len(v) - 1))
        done = abs(new_location - location) + abs(new_scale - scale) < 1e-10
        location, scale = new_location, max(new_scale, 1e-6)
        if done:
            break
    return location, scale


@dataclass(frozen=True)
class LodoChoice:
    """The served level and interval width, chosen leave-one-dataset-out.

    Attributes
    ----------
    point_offset : float
        Offset of the served level from the level distribution's location.
    width : float
        Interval half-width multiplier.
    brier_ratio : dict of str to float
        Each held-out set's Brier score at ``point_offset`` over that of a constant
        at its own base rate (1.0: as good as knowing the base rate).
    need : dict of str to float
        The smallest multiplier at which each held-out set is covered.
    """

    point_offset: float
    width: float
    brier_ratio: dict[str, float]
    need: dict[str, float]


def lodo_calibrate(
    sets: Mapping[str, tuple[ArrayLike, ArrayLike]],
    *,
    features: Sequence[str] = PRIOR_FEATURES,
    coverage: float = 0.8,
    level_df: float | None = LEVEL_DF,
    dataset_of: Mapping[str, str] | None = None,
) -> LodoChoice:
    """Choose the served level and the interval width out of domain, by construction.

    Each set is scored with no judgments by a prior fitted on the *other* sets
    (``dataset_of`` maps a set to its dataset when one dataset enters under several
    embedding models: all of them are then held out together).

    1. **Level**: the offset from the level location (on :data:`OFFSET_GRID`) with
       the smallest mean, over held-out sets, of the Brier score divided by that of a
       constant at the set's own base rate; ties go to the offset nearest 0.
    2. **Width**: each set needs the smallest half-width multiplier (on
       :data:`WIDTH_GRID`) at which :func:`interval_coverage` of the intervals
       around that level reaches ``coverage``; the width is the largest need, so
       every held-out set is covered at the nominal rate.
    """
    held: dict[str, CrossDomainPrior] = {}
    ratio = np.zeros((len(sets), len(OFFSET_GRID)))
    dataset = dataset_of or {n: n for n in sets}
    without: dict[str, CrossDomainPrior] = {}  # one fit per held-out dataset
    for i, name in enumerate(sets):
        if dataset[name] not in without:
            others = {n: xy for n, xy in sets.items() if dataset[n] != dataset[name]}
            without[dataset[name]] = fit_prior(
                others, features=features, level_df=level_df
            )
        held[name] = without[dataset[name]]
        X, y = sets[name]
        yv = as_labels(y, np.shape(y)[0])
        constant = float(yv.mean() * (1.0 - yv.mean()))
        for j, offset in enumerate(OFFSET_GRID):
            shifted = dataclasses.replace(held[name], point_offset=float(offset))
            ratio[i, j] = brier_score(yv, shifted.predict_proba(X)) / constant
    mean_ratio = ratio.mean(axis=0)
    best = np.flatnonzero(mean_ratio <= mean_ratio.min() + 1e-12)
    j = int(best[np.argmin(np.abs(OFFSET_GRID[best]))])
    offset = float(OFFSET_GRID[j])
    need: dict[str, float] = {}
    for name, prior in held.items():
        X, y = sets[name]
        served = dataclasses.replace(prior, point_offset=offset)
        p = served.predict_proba(X)
        need[name] = float(WIDTH_GRID[-1])
        for w in WIDTH_GRID:
            lo, hi = dataclasses.replace(served, width=float(w)).predict_interval(X)
            if interval_coverage(y, p, lo, hi) >= coverage:
                need[name] = float(w)
                break
    return LodoChoice(
        point_offset=offset,
        width=max(need.values()),
        brier_ratio={n: float(r) for n, r in zip(sets, ratio[:, j], strict=True)},
        need=need,
    )


# ------------------------------------------------------------------ few-label estimator


class PriorCalibrator(BaseEstimator):  # type: ignore[misc]
    r"""Few-label calibrator that borrows the shape from a :class:`CrossDomainPrior`.

    MAP fit of :math:`\operatorname{logit} P = c + w^\top\tilde\phi(x)` with
    :math:`c \sim \mathcal N(\mu, \tau^2(1 + 1/K))` (the prior's level distribution)
    and :math:`w \sim \mathcal N(w_0, \tau_w^2 \max(1, n/30))` for ``n`` judged
    queries. Intervals come from the Laplace posterior, so they shrink with ``n``.

    Parameters
    ----------
    prior : dict or None, default=None
        :meth:`CrossDomainPrior.to_dict` payload (plain JSON, so the estimator
        persists with ``calibration.io`` like the other families). Required by ``fit``.

    Attributes
    ----------
    coef_ : ndarray of shape (1 + n_features,)
        ``[level, slopes]`` on the prior's standardised features.
    covariance_ : ndarray
        Laplace posterior covariance of ``coef_``.
    level_sd_ : float
        Posterior SD of the level.
    n_queries_ : int
        Judged queries seen by ``fit``.
    n_features_in_ : int
        Columns of ``X`` seen by ``fit``.
    """

    def __init__(self, *, prior: dict[str, Any] | None = None):
        self.prior = prior

    @property
    def prior_(self) -> CrossDomainPrior:
        """The prior as an object.

        Decoded once per ``prior`` dict (a served search asks for it several times):
        a new dict given to ``set_params`` is decoded again.
        """
        if self.prior is None:
            raise InvalidInputError(
                "PriorCalibrator needs a cross-domain prior.", field="prior"
            )
        decoded = self.__dict__.get("_decoded_prior")
        if decoded is None or decoded[0] is not self.prior:
            decoded = (self.prior, CrossDomainPrior.from_dict(self.prior))
            self.__dict__["_decoded_prior"] = decoded
        prior: CrossDomainPrior = decoded[1]
        return prior

    @property
    def reorders_hits(self) -> bool:
        """Whether probabilities can reorder a query's hits."""
        return self.prior_.reorders_hits

    def fit(
        self, X: ArrayLike, y: ArrayLike, groups: ArrayLike | None = None
    ) -> PriorCalibrator:
        """Fit the level (and shrunk slopes) by MAP; single-class labels are fine.

        Parameters
        ----------
        X : array-like of shape (n_pairs, 12)
            Pair features in ``FEATURES`` order.
        y : array-like of shape (n_pairs,)
            Binary labels.
        groups : array-like of shape (n_pairs,) or None
            Query id of each pair (``None``: one query per pair).

        Returns
        -------
        self : PriorCalibrator
        """
        prior = self.prior_
        Z = prior.standardise(X)
        yv = as_labels(y, Z.shape[0], allow_single_class=True)
        n_queries = int(as_groups(groups, Z.shape[0]).max()) + 1
        mean, sd = prior.prior_mean_sd(n_queries)
        theta, cov = _map_logistic(
            Z,
            yv,
            np.ones(len(yv)),
            mean,
            sd,
            [(None, None), *_bounds(prior.features)],
            prior.level_df,
        )
        self.coef_ = theta
        self.covariance_ = cov
        self.level_sd_ = float(np.sqrt(cov[0, 0]))
        self.n_queries_ = n_queries
        self.n_features_in_ = len(FEATURES)
        return self

    @classmethod
    def at_prior(cls, prior: CrossDomainPrior) -> PriorCalibrator:
        """The calibrator before any judgment: the prior's mean and spread.

        Its ``predict_proba`` and ``predict_interval`` are the prior's zero-label ones;
        the shipped default profile serves it.
        """
        est = cls(prior=prior.to_dict())
        mean, sd = prior.prior_mean_sd()
        est.coef_ = mean
        est.covariance_ = np.diag(sd**2)
        est.level_sd_ = float(sd[0])
        est.n_queries_ = 0
        est.n_features_in_ = len(FEATURES)
        return est

    def _check(self) -> None:
        if not hasattr(self, "coef_"):
            raise NotFittedCalibratorError(
                "This PriorCalibrator is not fitted yet; call fit(X, y) first."
            )

    def decision_function(self, X: ArrayLike) -> FloatArray:
        """Calibrated logit of each pair."""
        self._check()
        out: FloatArray = self.prior_.standardise(X) @ self.coef_
        return out

    def predict_proba(self, X: ArrayLike) -> FloatArray:
        """P(relevant) of each pair, 1-D float64 in [0, 1]."""
        out: FloatArray = expit(self.decision_function(X)).astype(np.float64)
        return out

    def predict_interval(self, X: ArrayLike) -> tuple[FloatArray, FloatArray]:
        """``(lo, hi)`` per pair at the prior's nominal coverage (posterior)."""
        self._check()
        prior = self.prior_
        return _interval(
            prior.standardise(X), self.coef_, self.covariance_, prior.quantile
        )


# ------------------------------------------------------------------ interval coverage


def interval_coverage(
    y: ArrayLike,
    p: ArrayLike,
    lo: ArrayLike,
    hi: ArrayLike,
    *,
    n_bins: int = 15,
    alpha: float = COVERAGE_ALPHA,
) -> float:
    """Share of equal-mass probability bins whose rate is consistent with the interval.

    Bins are those of :func:`calibration.reliability_curve` (``strategy="quantile"``)
    on ``p``. A bin of ``n`` pairs with ``k`` relevant is covered when its exact
    (Clopper-Pearson) ``1 - alpha`` interval for the rate meets ``[mean(lo),
    mean(hi)]``: the observed rate is a sample, and a bin of 150 pairs whose true
    rate is 0.3% shows 0 relevant more often than not, which an interval that never
    reaches exactly 0 would otherwise "miss". ``alpha=0`` asks for the observed rate
    itself inside the interval.
    """
    lo_v, hi_v = as_float_1d(lo, "lo"), as_float_1d(hi, "hi")
    covered = interval_coverages(
        y, p, lo_v[:, None], hi_v[:, None], n_bins=n_bins, alpha=alpha
    )
    return float(covered[0])


def interval_coverages(
    y: ArrayLike,
    p: ArrayLike,
    lo: ArrayLike,
    hi: ArrayLike,
    *,
    n_bins: int = 15,
    alpha: float = COVERAGE_ALPHA,
) -> FloatArray:
    """:func:`interval_coverage` of several intervals around the same ``p`` at once.

    ``lo`` and ``hi`` of shape ``(n, m)``: column ``j`` is one set of intervals (a
    width tried, say); the bins, which depend on ``p`` only, are made once.
    """
    pv = as_float_1d(p, "p")
    yv = as_labels(y, pv.shape[0], allow_single_class=True)
    lo_m, hi_m = as_float_2d(lo, "lo"), as_float_2d(hi, "hi")
    curve = reliability_curve(yv, pv, n_bins=n_bins, strategy="quantile")
    ids = np.searchsorted(curve.bin_edges[1:-1], pv)
    counts = np.bincount(ids, minlength=n_bins)
    nz = counts > 0
    n = counts[nz]
    k = np.bincount(ids, weights=yv, minlength=n_bins)[nz]
    member = np.zeros((n_bins, pv.shape[0]))
    member[ids, np.arange(pv.shape[0])] = 1.0
    mean_lo = (member @ lo_m)[nz] / n[:, None]
    mean_hi = (member @ hi_m)[nz] / n[:, None]
    with np.errstate(invalid="ignore"):
        rate_lo = np.where(k > 0, beta_dist.ppf(alpha / 2, k, n - k + 1), 0.0)
        rate_hi = np.where(k < n, beta_dist.ppf(1 - alpha / 2, k + 1, n - k), 1.0)
    if alpha == 0:
        rate_lo = rate_hi = k / n
    met = (mean_lo <= rate_hi[:, None]) & (rate_lo[:, None] <= mean_hi)
    out: FloatArray = met.mean(axis=0)
    return out


# ------------------------------------------------------------------- query confidence


def coherent_confidence(p: ArrayLike, weight: float) -> float:
    r"""P(at least one relevant among the returned hits), coherently.

    :math:`(1 - \omega)\max_i p_i + \omega\,(1 - \prod_i (1 - p_i))`. Both ends are
    non-decreasing as hits are added, at least :math:`\max_i p_i`, and at most
    :math:`\min(1, \sum_i p_i)` (union bound), so every blend is too. ``weight``
    :math:`\omega \in [0, 1]` is fitted by :func:`fit_confidence_weight`: 0 when the
    hits' relevance is fully dependent, 1 when independent. 0 for no hits.
    """
    pv = np.clip(as_float_1d(p, "p"), 0.0, 1.0)
    if not 0.0 <= weight <= 1.0:
        raise InvalidInputError("weight must be in [0, 1].", field="weight")
    if pv.size == 0:
        return 0.0
    top = float(pv.max())
    noisy_or = float(-np.expm1(np.sum(np.log1p(-np.minimum(pv, 1.0 - 1e-16)))))
    noisy_or = max(noisy_or, top)  # rounding of the product must not break the bound
    return min(top + weight * (noisy_or - top), 1.0)


def fit_confidence_weight(p: ArrayLike, groups: ArrayLike, hit: ArrayLike) -> float:
    """Weight of :func:`coherent_confidence` minimising the query-level NLL.

    Parameters
    ----------
    p : array-like of shape (n_pairs,)
        *Held-out* hit probabilities (out-of-fold), so the weight is not fitted to the
        training fit's optimism.
    groups : array-like of shape (n_pairs,)
        Query id of each pair.
    hit : array-like of shape (n_queries,)
        Whether each query (in sorted group order) has a relevant hit.
    """
    pv = as_float_1d(p, "p")
    codes = as_groups(groups, pv.shape[0])
    n_q = int(codes.max()) + 1
    hits = as_labels(hit, n_q, allow_single_class=True)
    lists = [pv[codes == q] for q in range(n_q)]

    def nll(weight: float) -> float:
        c = np.array([coherent_confidence(lst, weight) for lst in lists])
        return negative_log_likelihood(hits, np.clip(c, 1e-6, 1.0 - 1e-6))

    res = minimize_scalar(nll, bounds=(0.0, 1.0), method="bounded")
    return float(res.x)


# ------------------------------------------------------------------------- norm lift


@dataclass(frozen=True)
class NormVerdict:
    """Whether norm terms earned their place (issue 9 item 6).

    Attributes
    ----------
    kept : bool
        True only when the held-out NLL gain over the norm-free counterpart exceeds one
        standard error of the paired per-query difference.
    verdict : str
        ``"kept"`` or ``"no measurable gain"``.
    nll_with, nll_without : float
        Held-out NLL per pair with and without the norm terms.
    n_queries : int
        Independent units of the comparison.
    """

    kept: bool
    verdict: str
    nll_with: float
    nll_without: float
    n_queries: int


def norm_lift_verdict(
    y: ArrayLike, p_with: ArrayLike, p_without: ArrayLike, groups: ArrayLike
) -> NormVerdict:
    """Decide "kept" vs "no measurable gain" from held-out probabilities.

    Uses the one-standard-error rule ``auto`` applies against Platt
    (:func:`calibration.metrics.clear_nll_gain`): pairs of one query are correlated,
    queries are the units.
    """
    pw, pwo = as_float_1d(p_with, "p_with"), as_float_1d(p_without, "p_without")
    yv = as_labels(y, pw.shape[0], allow_single_class=True)
    codes = as_groups(groups, pw.shape[0])
    kept = clear_nll_gain(pw, pwo, yv, codes)
    return NormVerdict(
        kept=kept,
        verdict="kept" if kept else "no measurable gain",
        nll_with=negative_log_likelihood(yv, pw),
        nll_without=negative_log_likelihood(yv, pwo),
        n_queries=int(codes.max()) + 1,
    )


@functools.lru_cache(maxsize=64)
def _t_quantile(probability: float, df: float) -> float:
    """Student's t quantile, memoised: scipy's takes ~0.16 ms a call, several a search."""
    return float(student_t.ppf(probability, df=df))
