r"""Pair-level calibrators: Platt, isotonic, norm-tempered (NT) and list-aware NT.

Every calibrator follows the scikit-learn estimator contract: a keyword-only
``__init__`` that only stores parameters, ``fit(X, y, groups=None)`` that returns
``self`` and sets ``attr_`` names, and ``predict_proba(X)`` that checks the fitted
state. Unlike scikit-learn classifiers, ``predict_proba`` returns a **1-D** float64
array of :math:`P(\text{relevant})` in [0, 1] (not an ``(n, 2)`` matrix), because the
service attaches one probability to each hit.

All calibrators take the full pair matrix ``X`` with columns in
:data:`calibration.features.FEATURES` order and use the columns they need (Platt and
isotonic also accept a 1-D array of cosines).

Ranking contract: ``reorders_hits`` tells whether the calibrated probability can change
the order of one query's hits relative to the cosine order. Platt and isotonic never
do (isotonic may create ties); NT and NT-list do unless ``query_side_only=True``, and
NT-list with lexical terms (``use_lexical=True``) always does: BM25 evidence is a
property of each document, independent of its cosine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError
from sklearn.isotonic import IsotonicRegression
from sklearn.utils.validation import check_is_fitted

from calibration._typing import ArrayLike, FloatArray, IntArray, Regime
from calibration._validation import as_float_2d, as_groups, as_labels
from calibration.exceptions import (
    ConvergenceError,
    InvalidInputError,
    NotFittedCalibratorError,
)
from calibration.features import (
    COSINE,
    ELL_D,
    ELL_Q,
    GAP,
    LEN_D,
    LEN_Q,
    LEX,
    LEX_RANK,
    LEX_REL,
    LEXICAL_DEPTH,
    RANK,
    query_probe_rho,
    regime_from_rho,
)

_LIST_COLUMNS = LEX_RANK + 1
"""Columns the list-aware families read (``FEATURES`` up to ``lex_rank``)."""

__all__ = [
    "IsotonicCalibrator",
    "ListAwareCalibrator",
    "NormTemperedCalibrator",
    "PlattCalibrator",
    "nt_prior",
]

NT_PARAMS: tuple[str, ...] = (
    "alpha",
    "gamma_q",
    "gamma_d",
    "beta0",
    "beta_q",
    "beta_d",
)
LIST_PARAMS: tuple[str, ...] = ("delta_rank", "delta_gap", "delta_len_q", "delta_len_d")
LEXICAL_PARAMS: tuple[str, ...] = ("delta_lex", "delta_lex_rel", "delta_lex_rank")
_N_TEMP = 3  # alpha, gamma_q, gamma_d multiply the temperature features [1, lq, ld]


def _at(*names: str) -> list[int]:
    """Positions of named parameters in the vector (NT, list, then lexical terms)."""
    order = NT_PARAMS + LIST_PARAMS + LEXICAL_PARAMS
    return [order.index(n) for n in names]


_NORM_TERMS = _at("gamma_q", "gamma_d", "beta_q", "beta_d")
_DOC_SIDE = _at("gamma_d", "beta_d")  # terms that can reorder one query's hits
_LENGTH_SHIFTS = _at("delta_len_q", "delta_len_d")
(_DELTA_RANK,) = _at("delta_rank")
(_DELTA_GAP,) = _at("delta_gap")
(_DELTA_LEN_D,) = _at("delta_len_d")
_LEX_RAISES = _at("delta_lex", "delta_lex_rel")  # more BM25 lowers the threshold
(_LEX_RANK,) = _at("delta_lex_rank")
# exp() of a log-temperature beyond this only happens in line-search probes; capping it
# keeps the objective finite instead of overflowing.
_MAX_LOG_TEMP = 30.0
_WIDTHS = ("auto", "fixed", "tight", "wide", "none")
_REGIMES = ("auto", "confidence", "conflict", "flat")


def _check_fitted(est: BaseEstimator, attr: str) -> None:
    try:
        check_is_fitted(est, attr)
    except NotFittedError as exc:
        raise NotFittedCalibratorError(
            f"This {type(est).__name__} is not fitted yet; call fit(X, y) first."
        ) from exc


def _as_X(X: ArrayLike, min_columns: int) -> FloatArray:
    return as_float_2d(X, "X", min_columns=min_columns)


class _Calibrator(BaseEstimator):  # type: ignore[misc]
    """Shared predict API: ``predict_proba = expit(decision_function)``."""

    _min_columns: ClassVar[int] = 1

    @property
    def reorders_hits(self) -> bool:
        """Whether probabilities can reorder one query's hits vs. the cosine order."""
        return False

    def decision_function(self, X: ArrayLike) -> FloatArray:
        r"""Return the calibrated logit of each pair.

        Parameters
        ----------
        X : array-like of shape (n_pairs, n_features)
            Pair features in ``FEATURES`` order.

        Returns
        -------
        ndarray of shape (n_pairs,)
            :math:`\operatorname{logit} P(\text{relevant})`.
        """
        raise NotImplementedError

    def predict_logit(self, X: ArrayLike) -> FloatArray:
        """Alias of :meth:`decision_function`.

        Parameters
        ----------
        X : array-like of shape (n_pairs, n_features)
            Pair features in ``FEATURES`` order.

        Returns
        -------
        ndarray of shape (n_pairs,)
            Calibrated logits.
        """
        return self.decision_function(X)

    def predict_proba(self, X: ArrayLike) -> FloatArray:
        r"""Return :math:`P(\text{relevant})` of each pair as a 1-D float64 array.

        Parameters
        ----------
        X : array-like of shape (n_pairs, n_features)
            Pair features in ``FEATURES`` order.

        Returns
        -------
        ndarray of shape (n_pairs,)
            Probabilities in [0, 1] (1-D, not scikit-learn's ``(n, 2)``).
        """
        out: FloatArray = expit(self.decision_function(X)).astype(np.float64)
        return out


# --------------------------------------------------------------------------- MAP engine


@dataclass(frozen=True)
class _MapResult:
    theta: FloatArray
    cov: FloatArray
    converged: bool
    message: str


def _log_temp_and_logit(
    theta: FloatArray, s: FloatArray, V: FloatArray, C: FloatArray
) -> tuple[FloatArray, FloatArray]:
    nt = V.shape[1]
    a = np.exp(np.clip(V @ theta[:nt], -_MAX_LOG_TEMP, _MAX_LOG_TEMP))
    z = a * (s - C @ theta[nt:])
    return a, z


def _fit_map(
    s: FloatArray,
    V: FloatArray,
    C: FloatArray,
    y: FloatArray,
    mu: FloatArray,
    sd: FloatArray,
    free: np.ndarray[Any, np.dtype[np.bool_]],
    lower: FloatArray,
    upper: FloatArray,
) -> _MapResult:
    r"""MAP fit of :math:`z = e^{V t}(s - C b)` under independent Gaussian priors.

    Minimises :math:`\sum_i \log(1+e^{z_i}) - y_i z_i
    + \tfrac12\sum_j ((\theta_j-\mu_j)/\sigma_j)^2` over the free entries of
    :math:`\theta=(t, b)` with L-BFGS-B and the analytic gradient; fixed entries stay at
    their prior mean. The posterior covariance is the inverse of the exact Hessian at
    the optimum (Laplace); fixed entries get zero variance.
    """
    nt = V.shape[1]
    prec = np.where(np.isinf(sd), 0.0, 1.0 / np.square(np.where(np.isinf(sd), 1.0, sd)))
    idx = np.flatnonzero(free)
    base = mu.copy()

    def unpack(x: FloatArray) -> FloatArray:
        th = base.copy()
        th[idx] = x
        return th

    def objective(x: FloatArray) -> tuple[float, FloatArray]:
        th = unpack(x)
        a, z = _log_temp_and_logit(th, s, V, C)
        e = expit(z) - y
        d = th - mu
        nll = float(np.sum(np.logaddexp(0.0, z) - y * z) + 0.5 * np.sum(prec * d * d))
        g = np.concatenate([V.T @ (e * z), -(C.T @ (e * a))]) + prec * d
        return nll, g[idx]

    x0 = np.clip(mu[idx], lower[idx], upper[idx])
    # L-BFGS-B treats infinite bounds as "unbounded".
    bounds = list(zip(lower[idx].tolist(), upper[idx].tolist(), strict=True))
    res = minimize(
        objective,
        x0,
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        options={"maxiter": 2000, "maxcor": 20},
    )
    theta = unpack(np.asarray(res.x, dtype=np.float64))
    if not np.all(np.isfinite(theta)):
        raise ConvergenceError(
            "The calibrator fit diverged; the labels may be perfectly separable by "
            "the cosine. Use a model with a prior (nt) or add judgments.",
            optimizer_message=str(res.message),
        )
    a, z = _log_temp_and_logit(theta, s, V, C)
    p = expit(z)
    h = p * (1.0 - p)
    e = p - y
    J = np.hstack([z[:, None] * V, -a[:, None] * C])
    H = J.T @ (h[:, None] * J)
    H[:nt, :nt] += V.T @ ((e * z)[:, None] * V)
    cross = -(V.T @ ((e * a)[:, None] * C))
    H[:nt, nt:] += cross
    H[nt:, :nt] += cross.T
    H += np.diag(prec)
    Hf = H[np.ix_(idx, idx)]
    Hf = 0.5 * (Hf + Hf.T)
    try:
        cov_f = np.linalg.inv(Hf)
        if np.any(np.diag(cov_f) < 0):
            raise np.linalg.LinAlgError
    except np.linalg.LinAlgError:
        # At a bound or in a flat direction the Hessian may be singular or
        # indefinite; the pseudo-inverse still gives usable, honest-looking sds.
        cov_f = np.linalg.pinv(Hf)
    cov = np.zeros((mu.shape[0], mu.shape[0]))
    cov[np.ix_(idx, idx)] = cov_f
    return _MapResult(
        theta=theta,
        cov=cov,
        converged=bool(res.success),
        message=str(res.message),
    )


# ----------------------------------------------------------------------------- Platt


class PlattCalibrator(_Calibrator):
    r"""Platt scaling on the cosine in temperature form.

    .. math:: \operatorname{logit} P(\text{rel} \mid s) = a\,(s - b), \quad a > 0

    Fitted by maximum likelihood over :math:`(\log a, b)` with L-BFGS and an
    essentially flat prior (SD 10 on both) that only keeps the fit finite when the
    labels are separable. :math:`a > 0` makes the map increasing in the cosine.

    Parameters
    ----------
    prior_sd : float, default=10.0
        SD of the weak Gaussian prior on :math:`\log a` and :math:`b`.

    Attributes
    ----------
    a_ : float
        Inverse temperature :math:`a`.
    b_ : float
        Threshold :math:`b` (the cosine where :math:`P = 0.5`).
    a_sd_ : float
        Laplace posterior SD of :math:`a` (delta method from :math:`\log a`).
    b_sd_ : float
        Laplace posterior SD of :math:`b`.
    converged_ : bool
        Whether L-BFGS reported success.
    n_features_in_ : int
        Number of columns of ``X`` seen in ``fit``.

    References
    ----------
    Platt, J. (1999). Probabilistic outputs for support vector machines.
    Guo, C. et al. (2017). On calibration of modern neural networks.
    """

    def __init__(self, *, prior_sd: float = 10.0):
        self.prior_sd = prior_sd

    def fit(
        self, X: ArrayLike, y: ArrayLike, groups: ArrayLike | None = None
    ) -> PlattCalibrator:
        """Fit :math:`a, b` by (almost) maximum likelihood.

        Parameters
        ----------
        X : array-like of shape (n_pairs, n_features) or (n_pairs,)
            Pair features; only column 0 (cosine) is used.
        y : array-like of shape (n_pairs,)
            Binary relevance labels.
        groups : array-like of shape (n_pairs,) or None, default=None
            Query id of each pair (accepted for API symmetry; unused).

        Returns
        -------
        self : PlattCalibrator
            Fitted calibrator.
        """
        Xa = _as_X(X, 1)
        yv = as_labels(y, Xa.shape[0])
        as_groups(groups, Xa.shape[0])
        s = Xa[:, COSINE]
        a0, b0 = _platt_start(s, yv)
        ones = np.ones((s.shape[0], 1))
        res = _fit_map(
            s,
            ones,
            ones,
            yv,
            mu=np.array([np.log(a0), b0]),
            sd=np.full(2, float(self.prior_sd)),
            free=np.ones(2, dtype=bool),
            lower=np.full(2, -np.inf),
            upper=np.full(2, np.inf),
        )
        self.a_ = float(np.exp(res.theta[0]))
        self.b_ = float(res.theta[1])
        self.a_sd_ = float(self.a_ * np.sqrt(max(res.cov[0, 0], 0.0)))
        self.b_sd_ = float(np.sqrt(max(res.cov[1, 1], 0.0)))
        self.converged_ = res.converged
        self.n_features_in_ = int(Xa.shape[1])
        return self

    def decision_function(self, X: ArrayLike) -> FloatArray:
        """Return :math:`a(s - b)` for each pair.

        Parameters
        ----------
        X : array-like of shape (n_pairs, n_features) or (n_pairs,)
            Pair features; column 0 is the cosine.

        Returns
        -------
        ndarray of shape (n_pairs,)
            Calibrated logits.
        """
        _check_fitted(self, "a_")
        s = _as_X(X, 1)[:, COSINE]
        out: FloatArray = self.a_ * (s - self.b_)
        return out


def _platt_start(s: FloatArray, y: FloatArray) -> tuple[float, float]:
    """Start with logit +-2 over one cosine SD, centred on the base-rate cut."""
    spread = float(np.std(s))
    a0 = 2.0 / spread if spread > 1e-6 else 20.0
    b0 = float(np.quantile(s, 1.0 - float(np.mean(y))))
    return a0, b0


# -------------------------------------------------------------------------- isotonic


class IsotonicCalibrator(_Calibrator):
    r"""Isotonic regression of relevance on the cosine, clipped away from 0 and 1.

    Wraps :class:`sklearn.isotonic.IsotonicRegression` with ``increasing=True`` and
    ``out_of_bounds="clip"``; predictions interpolate the stored thresholds linearly
    (``np.interp``), so they are identical after a JSON round trip.

    .. math:: P(\text{rel}\mid s) = \operatorname{clip}(m(s), \epsilon, 1-\epsilon),
        \quad m \text{ non-decreasing}

    Parameters
    ----------
    eps : float, default=1e-4
        Clip :math:`\epsilon` that keeps log-loss finite on unseen data.

    Attributes
    ----------
    x_thresholds_ : ndarray of shape (n_thresholds,)
        Cosine knots of the fitted step function.
    y_thresholds_ : ndarray of shape (n_thresholds,)
        Probabilities at the knots.
    n_features_in_ : int
        Number of columns of ``X`` seen in ``fit``.

    References
    ----------
    Zadrozny, B. and Elkan, C. (2002). Transforming classifier scores into accurate
    multiclass probability estimates.
    """

    def __init__(self, *, eps: float = 1e-4):
        self.eps = eps

    def fit(
        self, X: ArrayLike, y: ArrayLike, groups: ArrayLike | None = None
    ) -> IsotonicCalibrator:
        """Fit the monotone map on the cosine column.

        Parameters
        ----------
        X : array-like of shape (n_pairs, n_features) or (n_pairs,)
            Pair features; only column 0 (cosine) is used.
        y : array-like of shape (n_pairs,)
            Binary relevance labels.
        groups : array-like of shape (n_pairs,) or None, default=None
            Unused; accepted for API symmetry.

        Returns
        -------
        self : IsotonicCalibrator
            Fitted calibrator.
        """
        if not 0.0 < self.eps < 0.5:
            raise InvalidInputError("eps must be in (0, 0.5).", field="eps")
        Xa = _as_X(X, 1)
        yv = as_labels(y, Xa.shape[0])
        as_groups(groups, Xa.shape[0])
        iso = IsotonicRegression(
            y_min=self.eps, y_max=1.0 - self.eps, increasing=True, out_of_bounds="clip"
        ).fit(Xa[:, COSINE], yv)
        self.x_thresholds_ = np.asarray(iso.X_thresholds_, dtype=np.float64)
        self.y_thresholds_ = np.clip(
            np.asarray(iso.y_thresholds_, dtype=np.float64), self.eps, 1.0 - self.eps
        )
        self.n_features_in_ = int(Xa.shape[1])
        return self

    def predict_proba(self, X: ArrayLike) -> FloatArray:
        r"""Return the isotonic probability of each pair (1-D float64).

        Parameters
        ----------
        X : array-like of shape (n_pairs, n_features) or (n_pairs,)
            Pair features; column 0 is the cosine.

        Returns
        -------
        ndarray of shape (n_pairs,)
            Probabilities in :math:`[\epsilon, 1-\epsilon]`.
        """
        _check_fitted(self, "x_thresholds_")
        s = _as_X(X, 1)[:, COSINE]
        out: FloatArray = np.interp(s, self.x_thresholds_, self.y_thresholds_)
        return out

    def decision_function(self, X: ArrayLike) -> FloatArray:
        r"""Return the logit of :meth:`predict_proba`.

        Parameters
        ----------
        X : array-like of shape (n_pairs, n_features) or (n_pairs,)
            Pair features; column 0 is the cosine.

        Returns
        -------
        ndarray of shape (n_pairs,)
            :math:`\log(p/(1-p))`.
        """
        p = self.predict_proba(X)
        out: FloatArray = np.log(p) - np.log1p(-p)
        return out


# -------------------------------------------------------------------------------- NT


def nt_prior(
    a_platt: float,
    b_platt: float,
    regime: Regime,
    width: str,
) -> tuple[FloatArray, FloatArray]:
    r"""Prior means and SDs of the six NT parameters (:data:`NT_PARAMS` order).

    Theory.md §4.3-4.4 and §4.6:

    * :math:`\alpha \sim \mathcal N(\log a_{\rm Platt}, 2^2)`,
      :math:`\beta_0 \sim \mathcal N(b_{\rm Platt}, 0.5^2)`;
    * :math:`\gamma \sim \mathcal N(\gamma_0, \sigma_\gamma^2)`,
      :math:`\beta_{q,d} \sim \mathcal N(0, \sigma_\beta^2)` with
      :math:`\gamma_0 = 0.5` in the confidence regime and 0 otherwise;
    * ``"tight"`` and ``"fixed"``: :math:`(\sigma_\gamma, \sigma_\beta) = (0.3, 0.1)`,
      or (0.15, 0.05) in the flat regime; ``"wide"``: (1.0, 0.5), or (0.3, 0.1) in
      the flat regime; ``"none"``: every SD infinite (maximum likelihood).

    Parameters
    ----------
    a_platt, b_platt : float
        Platt fit on the same labels.
    regime : {"confidence", "conflict", "flat"}
        Sign-probe regime.
    width : {"fixed", "tight", "wide", "none"}
        Prior width (``"fixed"`` has the tight SDs; the caller pins the centre).

    Returns
    -------
    mean, sd : ndarray of shape (6,)
        Prior means and SDs in :data:`NT_PARAMS` order.
    """
    g0 = 0.5 if regime == "confidence" else 0.0
    if width == "wide":
        gsd, bsd = (0.3, 0.1) if regime == "flat" else (1.0, 0.5)
    else:
        gsd, bsd = (0.15, 0.05) if regime == "flat" else (0.3, 0.1)
    mean = np.array([np.log(a_platt), g0, g0, b_platt, 0.0, 0.0])
    sd = np.array([2.0, gsd, gsd, 0.5, bsd, bsd])
    if width == "none":
        sd = np.full(6, np.inf)
    return mean, sd


class _NTBase(_Calibrator):
    """Shared fitting of the NT family with optional list/length threshold terms."""

    _min_columns: ClassVar[int] = 3
    _list_terms: ClassVar[bool] = False

    # Parameters declared by subclasses' __init__.
    regime: str
    probe_rho: float | None
    prior_width: str
    query_side_only: bool
    min_queries: int

    @property
    def reorders_hits(self) -> bool:
        """True unless ``query_side_only`` pins the document-side terms."""
        return not self.query_side_only

    def _shift_params(self) -> tuple[str, ...]:
        """Names of the threshold shifts after the NT parameters (none for NT)."""
        return ()

    def _design(self, Xa: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        n = Xa.shape[0]
        one = np.ones(n)
        lq, ld = Xa[:, ELL_Q], Xa[:, ELL_D]
        V = np.column_stack([one, lq, ld])
        cols = [one, lq, ld]
        shifts = self._shift_params()
        if shifts:
            cols += [
                np.log(np.maximum(Xa[:, RANK], 1.0)),
                Xa[:, GAP],
                Xa[:, LEN_Q],
                Xa[:, LEN_D],
            ]
        if len(shifts) > len(LIST_PARAMS):
            # log(lex_rank / (depth + 1)) is 0 for "not in the BM25 list", like lex
            # and lex_rel without a match: no lexical evidence shifts nothing.
            cols += [
                Xa[:, LEX],
                Xa[:, LEX_REL],
                np.log(np.maximum(Xa[:, LEX_RANK], 1.0) / (LEXICAL_DEPTH + 1)),
            ]
        return Xa[:, COSINE], V, np.column_stack(cols)

    def _resolve_regime(self, Xa: FloatArray, codes: IntArray, grouped: bool) -> None:
        if self.regime not in _REGIMES:
            raise InvalidInputError(
                f"regime must be one of {_REGIMES}, got {self.regime!r}.",
                field="regime",
            )
        rho: float | None = None
        if self.probe_rho is not None:
            rho = float(self.probe_rho)
        elif self.regime == "auto" and grouped:
            rho = query_probe_rho(Xa, codes)
        self.probe_rho_ = rho
        if self.regime != "auto":
            self.regime_: Regime = self.regime  # type: ignore[assignment]
        elif rho is not None:
            self.regime_ = regime_from_rho(rho)
        else:
            # No probe and no query ids: assume nothing about the sign.
            self.regime_ = "flat"

    def _extra_free(self, free: np.ndarray[Any, np.dtype[np.bool_]]) -> None:
        """Let subclasses pin list terms."""

    def _extra_bounds(self, lower: FloatArray, upper: FloatArray) -> None:
        """Let subclasses bound list terms."""

    def fit(self, X: ArrayLike, y: ArrayLike, groups: ArrayLike | None = None) -> Any:
        """Fit by MAP with the theory prior (see the class docstring).

        Parameters
        ----------
        X : array-like of shape (n_pairs, n_features)
            Pair features in ``FEATURES`` order.
        y : array-like of shape (n_pairs,)
            Binary relevance labels.
        groups : array-like of shape (n_pairs,) or None, default=None
            Query id of each pair. The label budget (fixed centre below
            ``min_queries``) counts distinct groups; ``None`` counts every pair as
            its own query.

        Returns
        -------
        self
            Fitted calibrator.
        """
        if self.prior_width not in _WIDTHS:
            raise InvalidInputError(
                f"prior_width must be one of {_WIDTHS}, got {self.prior_width!r}.",
                field="prior_width",
            )
        need = _LIST_COLUMNS if self._list_terms else self._min_columns
        Xa = _as_X(X, need)
        yv = as_labels(y, Xa.shape[0])
        codes = as_groups(groups, Xa.shape[0])
        n_queries = int(codes.max()) + 1
        self._resolve_regime(Xa, codes, groups is not None)

        platt = PlattCalibrator().fit(Xa, yv)
        mean6, sd6 = nt_prior(platt.a_, platt.b_, self.regime_, self.prior_width)
        width = self.prior_width
        if width == "auto":
            width = "fixed" if n_queries < self.min_queries else "tight"
        self.prior_width_ = width

        shifts = self._shift_params()
        n_list = len(shifts)
        # List/length/lexical shifts are in cosine units; N(0, 1) is weak at that scale.
        list_sd = np.inf if width == "none" else 1.0
        mu = np.concatenate([mean6, np.zeros(n_list)])
        sd = np.concatenate([sd6, np.full(n_list, list_sd)])
        free = np.ones(mu.shape[0], dtype=bool)
        if width == "fixed":
            free[_NORM_TERMS] = False
        if self.query_side_only:
            mu[_DOC_SIDE] = 0.0
            free[_DOC_SIDE] = False
        self._extra_free(free)
        lower = np.full(mu.shape[0], -np.inf)
        upper = np.full(mu.shape[0], np.inf)
        self._extra_bounds(lower, upper)

        # NT_PARAMS order is already temperature terms (V) then threshold terms (C).
        s, V, C = self._design(Xa)
        res = _fit_map(s, V, C, yv, mu, sd, free, lower, upper)
        theta = res.theta
        sds = np.sqrt(np.clip(np.diag(res.cov), 0.0, None))
        for j, name in enumerate(NT_PARAMS + shifts):
            setattr(self, f"{name}_", float(theta[j]))
            setattr(self, f"{name}_sd_", float(sds[j]))
        self.coef_ = theta
        self.covariance_ = res.cov
        self.prior_mean_ = mu
        self.prior_sd_ = sd
        self.free_ = free
        self.n_queries_ = n_queries
        self.platt_a_ = platt.a_
        self.platt_b_ = platt.b_
        self.converged_ = res.converged
        self.n_features_in_ = int(Xa.shape[1])
        return self

    def decision_function(self, X: ArrayLike) -> FloatArray:
        r"""Return the NT logit of each pair (formula in the class docstring).

        Parameters
        ----------
        X : array-like of shape (n_pairs, n_features)
            Pair features in ``FEATURES`` order.

        Returns
        -------
        ndarray of shape (n_pairs,)
            Calibrated logits.
        """
        _check_fitted(self, "coef_")
        need = _LIST_COLUMNS if self._list_terms else self._min_columns
        s, V, C = self._design(_as_X(X, need))
        _, z = _log_temp_and_logit(self.coef_, s, V, C)
        return z

    def temperature(self, X: ArrayLike) -> FloatArray:
        r"""Return the inverse temperature :math:`e^{\alpha+\gamma_q\ell_q+\gamma_d\ell_d}`.

        Parameters
        ----------
        X : array-like of shape (n_pairs, n_features)
            Pair features in ``FEATURES`` order.

        Returns
        -------
        ndarray of shape (n_pairs,)
            Slope of the logit in the cosine.
        """
        _check_fitted(self, "coef_")
        need = _LIST_COLUMNS if self._list_terms else self._min_columns
        _, V, _ = self._design(_as_X(X, need))
        out: FloatArray = np.exp(np.clip(V @ self.coef_[:_N_TEMP], -30.0, 30.0))
        return out

    def norm_terms(self) -> dict[str, tuple[float, float]]:
        """Return the fitted norm terms as ``{name: (estimate, posterior sd)}``.

        Returns
        -------
        dict
            ``gamma_q, gamma_d, beta_q, beta_d``; an sd of 0 marks a term pinned at
            its prior centre (not fitted).
        """
        _check_fitted(self, "coef_")
        return {
            n: (float(getattr(self, f"{n}_")), float(getattr(self, f"{n}_sd_")))
            for n in (NT_PARAMS[i] for i in _NORM_TERMS)
        }


class NormTemperedCalibrator(_NTBase):
    r"""Norm-tempered (NT) calibrator of theory.md §4.3.

    .. math::

        \operatorname{logit} P(\text{rel} \mid s, \ell_q, \ell_d) =
        e^{\alpha + \gamma_q\ell_q + \gamma_d\ell_d}\,
        (s - \beta_0 - \beta_q\ell_q - \beta_d\ell_d)

    It is increasing in the cosine :math:`s` for any norms. Uses columns ``cosine``,
    ``ell_q``, ``ell_d`` (the first three of ``FEATURES``).

    Fitting is MAP with independent Gaussian priors (:func:`nt_prior`): first a Platt
    fit gives :math:`(a, b)`, which centre the priors of :math:`\alpha=\log a` and
    :math:`\beta_0`; the sign-probe regime sets :math:`\gamma_0`. The label budget
    counts distinct queries (``groups``):

    * fewer than ``min_queries`` (default 30): :math:`\gamma, \beta_{q,d}` fixed at
      the prior centre, only :math:`\alpha, \beta_0` fitted (``prior_width_="fixed"``);
    * otherwise full MAP with the tight prior (``"tight"``); ``prior_width="wide"``
      widens it (sensible from about 200 queries; model selection tries it).

    Posterior SDs come from the Laplace approximation (inverse Hessian at the MAP).

    Parameters
    ----------
    regime : {"auto", "confidence", "conflict", "flat"}, default="auto"
        Prior regime. ``"auto"`` maps ``probe_rho`` with
        :func:`~calibration.features.regime_from_rho`; if ``probe_rho`` is None and
        ``groups`` are given, the probe is computed at fit time from ``X`` itself
        (Spearman of the query ell and the mean of its top-10 cosines; label-free);
        with neither, the cautious ``"flat"`` regime is used.
    probe_rho : float or None, default=None
        Sign-probe correlation measured on unlabelled data (preferred source).
    prior_width : {"auto", "fixed", "tight", "wide", "none"}, default="auto"
        ``"auto"`` applies the label-budget rule above; ``"none"`` is flat
        (maximum likelihood), for comparison only.
    query_side_only : bool, default=False
        Pin :math:`\gamma_d = \beta_d = 0`, so the logit is monotone in :math:`s`
        within a query and never reorders its hits.
    min_queries : int, default=30
        Label budget below which the norm terms stay at the prior centre.

    Attributes
    ----------
    alpha_, gamma_q_, gamma_d_, beta0_, beta_q_, beta_d_ : float
        MAP estimates.
    alpha_sd_, gamma_q_sd_, gamma_d_sd_, beta0_sd_, beta_q_sd_, beta_d_sd_ : float
        Laplace posterior SDs (0 for pinned terms).
    coef_ : ndarray of shape (6,)
        The estimates in the order above.
    covariance_ : ndarray of shape (6, 6)
        Laplace posterior covariance.
    prior_mean_, prior_sd_ : ndarray of shape (6,)
        Prior used.
    free_ : ndarray of bool of shape (6,)
        Which parameters were fitted.
    regime_ : {"confidence", "conflict", "flat"}
        Regime used.
    probe_rho_ : float or None
        Probe value used, if any.
    prior_width_ : {"fixed", "tight", "wide", "none"}
        Width used after the label-budget rule.
    n_queries_ : int
        Distinct labelled queries.
    platt_a_, platt_b_ : float
        The Platt fit that centres the prior.
    converged_ : bool
        Whether L-BFGS reported success.
    """

    def __init__(
        self,
        *,
        regime: str = "auto",
        probe_rho: float | None = None,
        prior_width: str = "auto",
        query_side_only: bool = False,
        min_queries: int = 30,
    ):
        self.regime = regime
        self.probe_rho = probe_rho
        self.prior_width = prior_width
        self.query_side_only = query_side_only
        self.min_queries = min_queries


class ListAwareCalibrator(_NTBase):
    r"""NT with result-list, length and lexical terms in the threshold ("nt-list").

    .. math::

        \operatorname{logit} P = e^{\alpha + \gamma_q\ell_q + \gamma_d\ell_d}\,
        \big(s - \beta_0 - \beta_q\ell_q - \beta_d\ell_d
        - \delta_r \log(\text{rank}) - \delta_g\,\text{gap}
        - \delta_{lq}\,\text{len}_q - \delta_{ld}\,\text{len}_d
        - [\delta_x\,\text{lex} + \delta_{xr}\,\text{lex\_rel}
        + \delta_{xk}\log\tfrac{\text{lex\_rank}}{D + 1}]\big)

    The list, length and lexical shifts are in cosine units with a weak
    :math:`\mathcal N(0, 1)` prior; the norm terms use exactly the prior and
    label-budget logic of :class:`NormTemperedCalibrator`. Uses the columns of
    ``FEATURES``.

    The bracketed lexical terms (``use_lexical=True``; :math:`D` =
    :data:`~calibration.features.LEXICAL_DEPTH`) are 0 for a hit without lexical
    evidence (no match, not in the BM25 list), so ``lexical=None`` scores as the
    lexical-free model would. Their signs are bounded the way the cross-domain prior
    bounds them: :math:`\delta_x, \delta_{xr} \le 0` and :math:`\delta_{xk} \ge 0`,
    so more BM25 and a better BM25 rank can only raise a hit's probability.

    With ``query_side_only=True`` the document norm and length terms
    (:math:`\gamma_d, \beta_d, \delta_{ld}`) are pinned at 0 and the optimiser keeps
    :math:`\delta_r \ge 0`, :math:`\delta_g \ge -1`; within a query rank falls and
    gap falls as :math:`s` rises, so without lexical terms the logit is then
    non-decreasing in :math:`s` and never reorders hits. Lexical evidence belongs to
    each document whatever its cosine, so a model with ``use_lexical=True`` always
    may reorder hits (``reorders_hits`` is True); model selection never serves one
    when reordering is disallowed.

    Parameters
    ----------
    use_norms : bool, default=True
        Fit the norm terms; ``False`` pins all four at 0 (a norm-free list model).
    use_length : bool, default=True
        Fit the length shifts :math:`\delta_{lq}, \delta_{ld}`.
    use_lexical : bool, default=False
        Add the three lexical shifts (``False``: the model and parameter vector of
        estimators stored before lexical evidence existed).
    regime, probe_rho, prior_width, query_side_only, min_queries
        As in :class:`NormTemperedCalibrator`.

    Attributes
    ----------
    delta_rank_, delta_gap_, delta_len_q_, delta_len_d_ : float
        List and length threshold shifts (cosine units), with ``*_sd_``.
    delta_lex_, delta_lex_rel_, delta_lex_rank_ : float
        Lexical threshold shifts with ``*_sd_`` (only with ``use_lexical=True``).
    alpha_, gamma_q_, gamma_d_, beta0_, beta_q_, beta_d_ : float
        As in :class:`NormTemperedCalibrator`, with ``*_sd_``.
    coef_ : ndarray of shape (10,) or (13,)
        All estimates (NT order, then rank, gap, len_q, len_d, then lex, lex_rel,
        lex_rank with ``use_lexical``).
    """

    _list_terms: ClassVar[bool] = True

    def __init__(
        self,
        *,
        use_norms: bool = True,
        use_length: bool = True,
        use_lexical: bool = False,
        regime: str = "auto",
        probe_rho: float | None = None,
        prior_width: str = "auto",
        query_side_only: bool = False,
        min_queries: int = 30,
    ):
        self.use_norms = use_norms
        self.use_length = use_length
        self.use_lexical = use_lexical
        self.regime = regime
        self.probe_rho = probe_rho
        self.prior_width = prior_width
        self.query_side_only = query_side_only
        self.min_queries = min_queries

    @property
    def reorders_hits(self) -> bool:
        """True with lexical terms or without ``query_side_only``."""
        return bool(self.use_lexical) or not self.query_side_only

    def _shift_params(self) -> tuple[str, ...]:
        return LIST_PARAMS + (LEXICAL_PARAMS if self.use_lexical else ())

    def _resolve_regime(self, Xa: FloatArray, codes: IntArray, grouped: bool) -> None:
        super()._resolve_regime(Xa, codes, grouped)
        if not self.use_norms:
            self.regime_ = "flat"

    def _extra_free(self, free: np.ndarray[Any, np.dtype[np.bool_]]) -> None:
        if not self.use_norms:
            free[_NORM_TERMS] = False
        if not self.use_length:
            free[_LENGTH_SHIFTS] = False
        if self.query_side_only:
            free[_DELTA_LEN_D] = False

    def _extra_bounds(self, lower: FloatArray, upper: FloatArray) -> None:
        if self.query_side_only:  # hits keep their cosine order
            lower[_DELTA_RANK] = 0.0
            lower[_DELTA_GAP] = -1.0
        if self.use_lexical:  # lexical evidence can only raise a hit
            upper[_LEX_RAISES] = 0.0
            lower[_LEX_RANK] = 0.0

    def fit(
        self, X: ArrayLike, y: ArrayLike, groups: ArrayLike | None = None
    ) -> ListAwareCalibrator:
        """Fit by MAP; see :class:`NormTemperedCalibrator` for the prior logic.

        Parameters
        ----------
        X : array-like of shape (n_pairs, 12)
            Pair features in ``FEATURES`` order.
        y : array-like of shape (n_pairs,)
            Binary relevance labels.
        groups : array-like of shape (n_pairs,) or None, default=None
            Query id of each pair.

        Returns
        -------
        self : ListAwareCalibrator
            Fitted calibrator.
        """
        super().fit(X, y, groups)
        return self
