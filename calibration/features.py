r"""Feature construction: length-residualised log-norms and result-list features.

The service builds one pair feature matrix ``X`` per set of (query, hit) pairs, with the
columns in :data:`FEATURES` order, and hands it to whichever calibrator is active. Every
pair-level calibrator takes this full matrix and uses the columns it needs.

Columns of ``X``
----------------
``cosine``
    Cosine similarity :math:`s` of query and hit.
``ell_q``, ``ell_d``
    Length-residualised, standardised, clipped log-norm of the query / document
    (:meth:`NormReference.transform`), 0 for unit-norm models.
``rank``
    1-based position of the hit in the query's list sorted by descending cosine.
``gap``
    Top cosine of the query minus this hit's cosine (:math:`\\ge 0`).
``len_q``, ``len_d``
    Log token count centred on the reference median of that side
    (:meth:`NormReference.length_feature`).
``lex``
    BM25 of the hit over the query's IDF mass (:class:`LexicalEvidence`): the share of
    a perfect lexical match the hit reaches, comparable across queries.
``lex_rel``
    BM25 of the hit over the query's best BM25 in the collection (0..1).
``lex_rank``
    1-based rank of the hit in the query's BM25 list of depth :data:`LEXICAL_DEPTH`,
    ``LEXICAL_DEPTH + 1`` when it is not in that list.
``in_rank``
    1-based position of the hit in the list as it was handed over: the candidate
    pool's order in search (dense hits by cosine, then lexical-only ones), the
    caller's retriever's order in a rerank request (:mod:`calibration.external`).
``in_gap``
    The list's own score gap to its top, relative to the list:
    :math:`(\max s - s_i) / (\max s - \min s)` in [0, 1] (0 when all are equal).
    The scores are the caller's retriever's (any scale: only gaps within the list
    count), or normcal's cosines when the list is normcal's own.

Without lexical evidence (``lexical=None``) the lexical columns say "no lexical match":
0, 0 and ``LEXICAL_DEPTH + 1``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import spearmanr
from sklearn.base import BaseEstimator
from sklearn.linear_model import HuberRegressor

from calibration._typing import ArrayLike, FloatArray, IntArray, Regime
from calibration._validation import as_float_1d
from calibration.exceptions import (
    InsufficientDataError,
    InvalidInputError,
    NotFittedCalibratorError,
)

__all__ = [
    "FEATURES",
    "LEXICAL_DEPTH",
    "LEXICAL_FEATURES",
    "ORDER_FEATURES",
    "LexicalEvidence",
    "ListFeatures",
    "NormReference",
    "lexical_columns",
    "list_features",
    "pair_features",
    "regime_from_rho",
    "relative_gaps",
    "sign_probe",
    "stack_pair_features",
]

FEATURES: tuple[str, ...] = (
    "cosine",
    "ell_q",
    "ell_d",
    "rank",
    "gap",
    "len_q",
    "len_d",
    "lex",
    "lex_rel",
    "lex_rank",
    "in_rank",
    "in_gap",
)
"""Column order of the pair feature matrix ``X``."""

(
    COSINE,
    ELL_Q,
    ELL_D,
    RANK,
    GAP,
    LEN_Q,
    LEN_D,
    LEX,
    LEX_REL,
    LEX_RANK,
    IN_RANK,
    IN_GAP,
) = range(len(FEATURES))
ORDER_FEATURES: tuple[str, ...] = ("in_rank", "in_gap")
"""The columns of the list's own order (the handing-over retriever's evidence)."""
LEXICAL_FEATURES: tuple[str, ...] = ("lex", "lex_rel", "lex_rank")
LEXICAL_DEPTH = 100
"""Depth of the BM25 list that ``lex_rank`` is measured in (fit, eval and search alike)."""

# 1.4826 turns a median absolute deviation into a Gaussian-consistent SD.
_MAD_TO_SD = 1.4826
_UNIT_NORM_TOL = 1e-3
_MIN_REFERENCE = 5
# Below this spread of log n_tokens the regression slope is not identified.
_MIN_LOG_LEN_SPREAD = 1e-6
_MIN_RESIDUAL_SD = 1e-9


class NormReference(BaseEstimator):  # type: ignore[misc]
    r"""Reference for one side (query or document) of one embedding model.

    Fitted on *unlabelled* raw norms :math:`r` and token counts :math:`n` of a sample
    of texts of that side. It removes the mechanical effect of text length on the
    norm and expresses what is left in units of its typical spread.

    .. math::

        e &= \log r - (c_0 + c_1 \log n) - \operatorname{med}(\cdot) \\
        \ell &= \operatorname{clip}\big(e / (k \cdot \mathrm{SD}_{\rm rob}(e)),
            -c, c\big)

    with :math:`(c_0, c_1)` a Huber regression of :math:`\log r` on :math:`\log n`,
    :math:`\mathrm{SD}_{\rm rob} = 1.4826\,\mathrm{MAD}` and :math:`k` = ``scale``.
    With the defaults (:math:`k=2`, :math:`c=1.5`) :math:`\ell = \pm 1` is two robust
    SDs and the clip sits at three, so the prior widths of theory.md §4.3 read as
    "per typical spread" for every model (ARCHITECTURE.md, "Evidence so far").

    Parameters
    ----------
    clip : float, default=1.5
        Clip :math:`c` of :math:`\ell`, in units of ``scale`` robust SDs.
    scale : float, default=2.0
        Number :math:`k` of robust SDs that make one unit of :math:`\ell`.
    length_clip : float, default=3.0
        Clip of the centred log-length feature (log units).

    Attributes
    ----------
    unit_norm_ : bool
        True when the sample is unit-norm (:math:`\max|r-1| < 10^{-3}`) or the
        residual has no spread; :meth:`transform` then returns zeros.
    intercept_ : float
        :math:`c_0` (including the median re-centring of the residual).
    slope_ : float
        :math:`c_1`, the log-norm change per unit log token count (0 when the token
        counts of the sample are all equal).
    residual_sd_ : float
        Robust SD of the residual :math:`e` (log units).
    log_len_median_ : float
        Median of :math:`\log n` on the sample; centre of :meth:`length_feature`.
    n_samples_ : int
        Size of the reference sample.
    """

    def __init__(
        self, *, clip: float = 1.5, scale: float = 2.0, length_clip: float = 3.0
    ):
        self.clip = clip
        self.scale = scale
        self.length_clip = length_clip

    def fit(self, norms: ArrayLike, n_tokens: ArrayLike) -> NormReference:
        """Fit the length model on an unlabelled sample of one side.

        Parameters
        ----------
        norms : array-like of shape (n_samples,)
            Raw (pre-normalisation) embedding norms, all > 0.
        n_tokens : array-like of shape (n_samples,)
            Token counts of the same texts, all >= 1.

        Returns
        -------
        self : NormReference
            Fitted reference.

        Raises
        ------
        InvalidInputError
            On shape mismatch, non-finite, non-positive norms or token counts < 1.
        InsufficientDataError
            With fewer than 5 samples.
        """
        if not (self.clip > 0 and self.scale > 0 and self.length_clip > 0):
            raise InvalidInputError("clip, scale and length_clip must be positive.")
        r, n = _check_norms(norms, n_tokens)
        if r.shape[0] < _MIN_REFERENCE:
            raise InsufficientDataError(
                f"A norm reference needs at least {_MIN_REFERENCE} texts, got "
                f"{r.shape[0]}.",
                n_pairs=int(r.shape[0]),
                required=_MIN_REFERENCE,
            )
        log_r, log_n = np.log(r), np.log(n)
        self.n_samples_ = int(r.shape[0])
        self.log_len_median_ = float(np.median(log_n))
        self.unit_norm_ = bool(np.max(np.abs(r - 1.0)) < _UNIT_NORM_TOL)
        slope = 0.0
        # With (almost) equal token counts the slope is not identified: median only.
        if float(np.ptp(log_n)) > _MIN_LOG_LEN_SPREAD and not self.unit_norm_:
            huber = HuberRegressor(alpha=0.0, max_iter=500)
            # HuberRegressor is scale-equivariant only after centring; centre log n so
            # its intercept is not fitted far from the data.
            huber.fit((log_n - self.log_len_median_).reshape(-1, 1), log_r)
            slope = float(huber.coef_[0])
        resid = log_r - slope * (log_n - self.log_len_median_)
        centre = float(np.median(resid))
        resid -= centre
        sd = _MAD_TO_SD * float(np.median(np.abs(resid)))
        self.slope_ = slope
        self.intercept_ = centre - slope * self.log_len_median_
        self.residual_sd_ = sd
        if sd < _MIN_RESIDUAL_SD:
            self.unit_norm_ = True
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "residual_sd_"):
            raise NotFittedCalibratorError(
                "This NormReference is not fitted yet; call fit(norms, n_tokens) first."
            )

    def residual(self, norms: ArrayLike, n_tokens: ArrayLike) -> FloatArray:
        r"""Return the unscaled residual :math:`e = \log r - c_0 - c_1 \log n`.

        Parameters
        ----------
        norms : array-like of shape (n,)
            Raw norms.
        n_tokens : array-like of shape (n,)
            Token counts.

        Returns
        -------
        residual : ndarray of shape (n,)
            Residual log-norm in log units (zeros for unit-norm references).
        """
        self._check_fitted()
        r, n = _check_norms(norms, n_tokens)
        if self.unit_norm_:
            return np.zeros_like(r)
        out: FloatArray = np.log(r) - self.intercept_ - self.slope_ * np.log(n)
        return out

    def transform(self, norms: ArrayLike, n_tokens: ArrayLike) -> FloatArray:
        r"""Return :math:`\ell`, the clipped standardised residual log-norm.

        Parameters
        ----------
        norms : array-like of shape (n,)
            Raw norms (> 0).
        n_tokens : array-like of shape (n,)
            Token counts (>= 1).

        Returns
        -------
        ell : ndarray of shape (n,)
            :math:`\operatorname{clip}(e/(k\,\mathrm{SD}), -c, c)`; zeros when
            ``unit_norm_``.
        """
        e = self.residual(norms, n_tokens)
        if self.unit_norm_:
            return e
        out: FloatArray = np.clip(
            e / (self.scale * self.residual_sd_), -self.clip, self.clip
        )
        return out

    def length_feature(self, n_tokens: ArrayLike) -> FloatArray:
        r"""Return the centred log-length :math:`\operatorname{clip}(\log n - \operatorname{med}\log n, \pm 3)`.

        Parameters
        ----------
        n_tokens : array-like of shape (n,)
            Token counts (>= 1).

        Returns
        -------
        len : ndarray of shape (n,)
            Centred log token count (log units), clipped to ``length_clip``.
        """
        self._check_fitted()
        n = as_float_1d(n_tokens, "n_tokens")
        if np.any(n < 1):
            raise InvalidInputError("n_tokens must be >= 1.", field="n_tokens")
        out: FloatArray = np.clip(
            np.log(n) - self.log_len_median_, -self.length_clip, self.length_clip
        )
        return out


def _check_norms(
    norms: ArrayLike, n_tokens: ArrayLike
) -> tuple[FloatArray, FloatArray]:
    r = as_float_1d(norms, "norms")
    n = as_float_1d(n_tokens, "n_tokens")
    if r.shape != n.shape:
        raise InvalidInputError(
            f"norms ({r.shape[0]}) and n_tokens ({n.shape[0]}) differ in length.",
            field="n_tokens",
        )
    if np.any(r <= 0):
        raise InvalidInputError("norms must be > 0.", field="norms")
    if np.any(n < 1):
        raise InvalidInputError("n_tokens must be >= 1.", field="n_tokens")
    return r, n


@dataclass(frozen=True)
class ListFeatures:
    """Result-list features of one query's hits.

    Attributes
    ----------
    rank : ndarray of shape (k,)
        1-based rank of each hit by descending cosine (ties broken by input order).
    gap : ndarray of shape (k,)
        ``top - score`` for each hit.
    top : float
        Highest cosine.
    mean : float
        Mean cosine of the k hits.
    std : float
        Population SD of the k cosines (0 for one hit).
    margin : float
        Top cosine minus the second (0 for one hit).
    """

    rank: FloatArray
    gap: FloatArray
    top: float
    mean: float
    std: float
    margin: float


def list_features(scores: ArrayLike) -> ListFeatures:
    """Compute rank, gap to the top and score-spread statistics of one hit list.

    Parameters
    ----------
    scores : array-like of shape (k,)
        Cosines of one query's hits, in any order (usually descending).

    Returns
    -------
    ListFeatures
        Per-hit ``rank`` and ``gap`` aligned with ``scores``, plus list statistics.
    """
    s = as_float_1d(scores, "scores")
    if s.shape[0] == 0:
        raise InvalidInputError("scores is empty.", field="scores")
    order = np.argsort(-s, kind="stable")
    rank = np.empty_like(s)
    rank[order] = np.arange(1, s.shape[0] + 1, dtype=np.float64)
    top = float(s[order[0]])
    margin = float(top - s[order[1]]) if s.shape[0] > 1 else 0.0
    return ListFeatures(
        rank=rank,
        gap=top - s,
        top=top,
        mean=float(s.mean()),
        std=float(s.std()),
        margin=margin,
    )


@dataclass(frozen=True)
class LexicalEvidence:
    """BM25 evidence of one query's hits (from the collection's lexical index).

    Attributes
    ----------
    bm25 : ndarray of shape (k,)
        BM25 of each hit (larger is better, 0 when it contains no query term).
    rank : ndarray of shape (k,)
        1-based rank of each hit in the query's BM25 list of depth
        :data:`LEXICAL_DEPTH`; ``LEXICAL_DEPTH + 1`` (or more) when it is not in it.
    idf_mass : float
        Sum of the BM25 IDFs of the query's terms (0 when it has none).
    top : float
        BM25 of the query's best match in the collection (0 when nothing matches).
    """

    bm25: FloatArray
    rank: FloatArray
    idf_mass: float
    top: float


def lexical_columns(lexical: LexicalEvidence | None, k: int) -> FloatArray:
    """The ``lex``, ``lex_rel``, ``lex_rank`` columns of ``k`` hits (see the module doc)."""
    out = np.zeros((k, len(LEXICAL_FEATURES)))
    out[:, 2] = LEXICAL_DEPTH + 1
    if lexical is None:
        return out
    bm25 = as_float_1d(lexical.bm25, "bm25")
    rank = as_float_1d(lexical.rank, "lexical rank")
    if bm25.shape[0] != k or rank.shape[0] != k:
        raise InvalidInputError(
            f"lexical evidence must have one value per hit ({k}).", field="lexical"
        )
    if np.any(bm25 < 0) or np.any(rank < 1):
        raise InvalidInputError("bm25 must be >= 0 and ranks >= 1.", field="lexical")
    if lexical.idf_mass > 0:
        out[:, 0] = bm25 / lexical.idf_mass
    if lexical.top > 0:
        out[:, 1] = np.minimum(bm25 / lexical.top, 1.0)
    out[:, 2] = np.minimum(rank, LEXICAL_DEPTH + 1)
    return out


def pair_features(
    scores: ArrayLike,
    ell_q: float,
    ell_d: ArrayLike,
    len_q: float = 0.0,
    len_d: ArrayLike | None = None,
    lexical: LexicalEvidence | None = None,
    input_scores: ArrayLike | None = None,
) -> FloatArray:
    r"""Build the pair feature matrix of one query's hit list.

    Parameters
    ----------
    scores : array-like of shape (k,)
        Cosines of the query's hits (the list the service returns, usually sorted
        descending; rank and gap are computed from the values, not the order).
    ell_q : float
        Query :math:`\\ell` from the query-side :class:`NormReference`.
    ell_d : array-like of shape (k,)
        Document :math:`\\ell` of each hit.
    len_q : float, default=0.0
        Query centred log-length (:meth:`NormReference.length_feature`).
    len_d : array-like of shape (k,) or None, default=None
        Document centred log-lengths; ``None`` means zeros.
    lexical : LexicalEvidence or None, default=None
        BM25 evidence of the hits; ``None`` means no lexical match.
    input_scores : array-like of shape (k,) or None, default=None
        The scores of the retriever that handed the list over, in list order, for
        ``in_gap`` (:func:`relative_gaps`); ``None``: the list is normcal's own and
        its cosines are those scores.

    Returns
    -------
    X : ndarray of shape (k, 12)
        Columns in :data:`FEATURES` order; rows in list order (``in_rank``).
    """
    lf = list_features(scores)
    k = lf.rank.shape[0]
    ld = as_float_1d(ell_d, "ell_d")
    lnd = np.zeros(k) if len_d is None else as_float_1d(len_d, "len_d")
    if ld.shape[0] != k or lnd.shape[0] != k:
        raise InvalidInputError(
            f"ell_d and len_d must have one value per hit ({k}).", field="ell_d"
        )
    if not (math.isfinite(float(ell_q)) and math.isfinite(float(len_q))):
        raise InvalidInputError("ell_q and len_q must be finite.", field="ell_q")
    X = np.empty((k, len(FEATURES)), dtype=np.float64)
    X[:, COSINE] = as_float_1d(scores, "scores")
    X[:, ELL_Q] = float(ell_q)
    X[:, ELL_D] = ld
    X[:, RANK] = lf.rank
    X[:, GAP] = lf.gap
    X[:, LEN_Q] = float(len_q)
    X[:, LEN_D] = lnd
    X[:, LEX : LEX_RANK + 1] = lexical_columns(lexical, k)
    X[:, IN_RANK] = np.arange(1, k + 1, dtype=np.float64)
    gaps = relative_gaps(scores if input_scores is None else input_scores)
    if gaps.shape[0] != k:
        raise InvalidInputError(
            f"input_scores must have one value per hit ({k}).", field="input_scores"
        )
    X[:, IN_GAP] = gaps
    return X


def relative_gaps(scores: ArrayLike) -> FloatArray:
    r"""Each score's gap to the list's top, relative to the list's range.

    :math:`(\max s - s_i) / (\max s - \min s)`: 0 for the top, 1 for the bottom,
    the same for any increasing affine map of the scores (their scale is the
    retriever's, unknown), all 0 when the scores are equal.
    """
    s = as_float_1d(scores, "input_scores")
    if s.shape[0] == 0:
        return s
    span = float(s.max() - s.min())
    if span <= 0.0:
        return np.zeros_like(s)
    out: FloatArray = (s.max() - s) / span
    return out


def stack_pair_features(
    scores: Sequence[ArrayLike],
    ell_q: ArrayLike,
    ell_d: Sequence[ArrayLike],
    len_q: ArrayLike | None = None,
    len_d: Sequence[ArrayLike] | None = None,
    lexical: Sequence[LexicalEvidence | None] | None = None,
    input_scores: Sequence[ArrayLike | None] | None = None,
) -> tuple[FloatArray, IntArray]:
    r"""Stack the pair matrices of many queries.

    Parameters
    ----------
    scores : sequence of array-like, one of shape (k_i,) per query
        Hit cosines of each query.
    ell_q : array-like of shape (n_queries,)
        Query :math:`\\ell`.
    ell_d : sequence of array-like, one of shape (k_i,) per query
        Document :math:`\\ell` of each query's hits.
    len_q : array-like of shape (n_queries,) or None, default=None
        Query centred log-lengths (zeros if ``None``).
    len_d : sequence of array-like or None, default=None
        Document centred log-lengths per query (zeros if ``None``).
    lexical : sequence of LexicalEvidence or None, default=None
        BM25 evidence per query (no lexical match if ``None``).
    input_scores : sequence of array-like or None, default=None
        The handing-over retriever's scores per query (see :func:`pair_features`;
        ``None``, or ``None`` for a query: its cosines).

    Returns
    -------
    X : ndarray of shape (sum k_i, 12)
        Stacked pair features, queries in input order.
    groups : ndarray of shape (sum k_i,)
        Query index (0..n_queries-1) of each row, for grouped fitting.
    """
    n_q = len(scores)
    lq = as_float_1d(ell_q, "ell_q")
    lnq = np.zeros(n_q) if len_q is None else as_float_1d(len_q, "len_q")
    if len(ell_d) != n_q or lq.shape[0] != n_q or lnq.shape[0] != n_q:
        raise InvalidInputError(
            "scores, ell_q, ell_d and len_q must describe the same number of queries.",
            field="ell_q",
        )
    if len_d is not None and len(len_d) != n_q:
        raise InvalidInputError("len_d must have one entry per query.", field="len_d")
    if lexical is not None and len(lexical) != n_q:
        raise InvalidInputError(
            "lexical must have one entry per query.", field="lexical"
        )
    if input_scores is not None and len(input_scores) != n_q:
        raise InvalidInputError(
            "input_scores must have one entry per query.", field="input_scores"
        )
    if n_q == 0:
        raise InvalidInputError("No queries given.", field="scores")
    blocks = [
        pair_features(
            scores[i],
            float(lq[i]),
            ell_d[i],
            float(lnq[i]),
            None if len_d is None else len_d[i],
            None if lexical is None else lexical[i],
            None if input_scores is None else input_scores[i],
        )
        for i in range(n_q)
    ]
    groups = np.concatenate(
        [np.full(b.shape[0], i, dtype=np.int64) for i, b in enumerate(blocks)]
    )
    return np.vstack(blocks), groups


def sign_probe(ell: ArrayLike, top_mean_cos: ArrayLike) -> float:
    r"""Label-free sign probe :math:`\rho = \operatorname{Spearman}(\ell, t)` (theory §4.4).

    Parameters
    ----------
    ell : array-like of shape (n,)
        :math:`\ell` of unlabelled texts of one side.
    top_mean_cos : array-like of shape (n,)
        :math:`t`: mean of each text's top-10 cosines against a sample of the other
        side (or of the same side).

    Returns
    -------
    rho : float
        Spearman correlation; 0.0 when either input is constant (no signal) or
        fewer than 3 texts are given.
    """
    a = as_float_1d(ell, "ell")
    b = as_float_1d(top_mean_cos, "top_mean_cos")
    if a.shape != b.shape:
        raise InvalidInputError("ell and top_mean_cos differ in length.", field="ell")
    # spearmanr warns (an error under strict warning filters) on constant input.
    if a.shape[0] < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return 0.0
    res: Any = spearmanr(a, b)
    rho = float(res.statistic)
    return rho if math.isfinite(rho) else 0.0


def regime_from_rho(rho: float, threshold: float = 0.1) -> Regime:
    r"""Map the sign probe to a prior regime (theory §4.4).

    Parameters
    ----------
    rho : float
        Sign-probe Spearman correlation.
    threshold : float, default=0.1
        :math:`|\rho|` below which the norm is taken as uninformative.

    Returns
    -------
    {"confidence", "conflict", "flat"}
        ``"confidence"`` if :math:`\rho \ge` threshold (prior centre
        :math:`\gamma_0 = +0.5`), ``"conflict"`` if :math:`\rho \le -`threshold
        (:math:`\gamma_0 = 0`), else ``"flat"`` (near-Platt prior).
    """
    if rho >= threshold:
        return "confidence"
    if rho <= -threshold:
        return "conflict"
    return "flat"


def query_probe_rho(X: FloatArray, groups: IntArray, top: int = 10) -> float:
    """Sign probe computed from a pair matrix: query ell vs mean top-``top`` cosine.

    Parameters
    ----------
    X : ndarray of shape (n, 12)
        Pair features.
    groups : ndarray of shape (n,)
        Query codes 0..n_queries-1.
    top : int, default=10
        Number of highest cosines averaged per query.

    Returns
    -------
    rho : float
        :func:`sign_probe` over queries (label-free).
    """
    n_q = int(groups.max()) + 1 if groups.size else 0
    ell = np.zeros(n_q)
    t = np.zeros(n_q)
    order = np.lexsort((-X[:, COSINE], groups))
    g_sorted = groups[order]
    starts = np.searchsorted(g_sorted, np.arange(n_q))
    ends = np.searchsorted(g_sorted, np.arange(n_q), side="right")
    for q in range(n_q):
        rows = order[starts[q] : min(ends[q], starts[q] + top)]
        ell[q] = X[rows[0], ELL_Q]
        t[q] = X[rows, COSINE].mean()
    return sign_probe(ell, t)
