r"""Model selection by grouped cross-validation, the norm-lift and evidence-lift reports.

Pairs of one query are correlated, so every split is by query (``GroupKFold``) and
every metric is computed on pooled out-of-fold (OOF) predictions. ``method="auto"``
keeps the method with the lowest OOF NLL (theory.md §4.7), but serves Platt unless that
method's gain over Platt exceeds one standard error of the paired per-query NLL
difference (the one-standard-error rule: selection noise must not cost calibration).

Norm-aware models must earn their place: ``nt`` is kept only if its OOF NLL beats
Platt, and ``nt-list`` only if it beats the same list model without residual-norm
terms, each by more than one standard error of the paired per-query difference
(:func:`calibration.prior.norm_lift_verdict`, "no measurable gain" otherwise); otherwise the norm-free counterpart is served (also when ``X`` carries no norm
signal at all, e.g. unit-norm embeddings). With at least 200 labelled queries a fitted
norm model whose every norm term is within 2 posterior SD of zero is also replaced
(theory.md §4.7).

Lexical evidence (BM25 columns, when the judged hits carry it) must earn its place the
same way: the list model with lexical terms stands for ``nt-list`` only while the
lexical rung of the evidence ladder (:func:`evidence_lift`) "pays"; otherwise its
lexical-free counterpart is served. Lexical terms reorder hits, so with
``query_side_only=True`` no lexical model is a candidate; the lexical rung is still
fitted, for the report, so a user learns whether allowing reordering would pay.

``auto`` never trades discrimination for calibration: every family is also scored with
a final one-dimensional recalibration of its logit (:mod:`calibration.recalibration`),
fitted inside the grouped CV (the map for fold ``f`` is fitted on the other folds'
out-of-fold logits only), and a family's candidate is its recalibrated version when the
stage clearly pays (held-out NLL gain over one standard error) or when it is what
brings a map clearly above its ECE noise floor back to it (NLL no worse by more than
one standard error). The one-standard-error rule and the ECE guard then compare these
candidates, so a better-discriminating family whose recalibrated map sits at its floor
stays eligible; :class:`SelectionWhy` records each rule's outcome.

Hybrid search orders hits by the served probabilities, so ``auto``'s last rule, the
rank guard, checks the order too: when RRF of the judged pairs' cosine-list and
BM25-list ranks orders them clearly better (held out, per-query nDCG@10, one standard
error) than the chosen map, the family at its ECE floor that orders them best is served
instead, if it too beats the chosen map by one standard error (:func:`_rank_guard`).

:func:`select_calibrator` is a pure function of ``(X, y, groups)``, so the service can
nest it inside an outer grouped CV for an honest evaluation of the whole procedure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from sklearn.model_selection import GroupKFold

from calibration._typing import ArrayLike, FloatArray, IntArray, MethodName
from calibration._validation import as_float_2d, as_groups, as_labels, require_queries
from calibration.exceptions import InvalidInputError, SingleClassError
from calibration.features import COSINE, ELL_D, ELL_Q, FEATURES, LEX, LEX_RANK
from calibration.fusion import pair_rrf
from calibration.metrics import (
    BINNING,
    ReliabilityCurve,
    auroc,
    brier_score,
    negative_log_likelihood,
    paired_ndcg_gain,
    paired_nll_gain,
    per_query_ndcg,
)
from calibration.models import (
    IsotonicCalibrator,
    ListAwareCalibrator,
    NormTemperedCalibrator,
    PlattCalibrator,
    _Calibrator,
    _NTBase,
)
from calibration.prior import CrossDomainPrior, PriorCalibrator, norm_lift_verdict
from calibration.recalibration import (
    Recalibrated,
    fit_recalibration,
    proba_logit,
    recalibrate_proba,
)

__all__ = [
    "ECE_GUARD",
    "EVIDENCE_LADDER",
    "METHODS",
    "GroupLift",
    "MethodScores",
    "NormLift",
    "SelectionResult",
    "SelectionRule",
    "SelectionWhy",
    "cross_val_predict_grouped",
    "evidence_lift",
    "make_calibrator",
    "select_calibrator",
]

METHODS: tuple[str, ...] = ("platt", "isotonic", "nt", "nt-list")
"""Method names on the wire (plus ``"auto"`` for :func:`select_calibrator`)."""

_WIDE_FROM = 200
ECE_GUARD = 2.0
"""A held-out ECE above this multiple of its noise floor is "clearly above" it."""
_GAMMA_RULE_FROM = 200


@dataclass(frozen=True)
class Variant:
    """One model :func:`select_calibrator` cross-validates.

    Attributes
    ----------
    name : str
        Key in reports (``cv`` scores, ``NormLift.variants`` methods); stored
        reports use these names, so they never change.
    family : str
        Wire method it belongs to (``METHODS``).
    norm_terms : bool
        Uses the residual-norm terms (needs norm signal in ``X``).
    length_terms : bool
        Uses the length shifts (list models only).
    lexical_terms : bool
        Uses the lexical shifts (list models only; needs lexical evidence in ``X``;
        reorders hits).
    prior_width : str
        NT prior width.
    min_queries : int
        Only tried with at least this many labelled queries.
    candidate : bool
        May stand for its wire method (else it only feeds the norm-lift report or
        is a norm-free counterpart).
    lift_key : str or None
        Key in ``NormLift.variants`` (the decomposition of the list model).
    note : str or None
        Note recorded when this variant stands for its method.
    norm_free, lexical_free : str or None
        The same model without its norm / lexical terms (what the fallbacks serve).
    """

    name: str
    family: MethodName
    norm_terms: bool = False
    length_terms: bool = True
    lexical_terms: bool = False
    prior_width: str = "auto"
    min_queries: int = 0
    candidate: bool = False
    lift_key: str | None = None
    note: str | None = None
    norm_free: str | None = None
    lexical_free: str | None = None

    def available(
        self, has_norms: bool, has_lexical: bool, n_queries: int, reorder: bool
    ) -> bool:
        """Whether this variant is tried on this data (norms, lexical evidence, size).

        Without reordering only the lexical rung of the evidence ladder is fitted,
        for the report: lexical models reorder hits, so none can be served.
        """
        lexical_ok = has_lexical and (reorder or self.name == _LEXICAL_RUNG)
        return (
            (has_norms or not self.norm_terms)
            and (lexical_ok or not self.lexical_terms)
            and n_queries >= self.min_queries
        )

    def without(self, *, norms: bool, lexical: bool) -> str:
        """Name of this model without its norm terms and/or its lexical terms."""
        name = self.name
        if norms and self.norm_free is not None:
            name = self.norm_free
        if lexical and _VARIANTS[name].lexical_free is not None:
            name = str(_VARIANTS[name].lexical_free)
        return name

    def template(self, prior: dict[str, Any] | None = None, **kw: Any) -> Any:
        """An unfitted estimator (``kw``: ``probe_rho``, ``query_side_only``)."""
        if self.family == "prior":
            return PriorCalibrator(prior=prior)
        if self.family == "platt":
            return PlattCalibrator()
        if self.family == "isotonic":
            return IsotonicCalibrator()
        if self.family == "nt":
            return NormTemperedCalibrator(prior_width=self.prior_width, **kw)
        return ListAwareCalibrator(
            use_norms=self.norm_terms,
            use_length=self.length_terms,
            use_lexical=self.lexical_terms,
            prior_width=self.prior_width,
            **kw,
        )


_LEXICAL_RUNG = "nt-list/length+lexical"


VARIANTS: tuple[Variant, ...] = (
    Variant("prior", "prior", candidate=True),
    Variant("platt", "platt", candidate=True),
    Variant("isotonic", "isotonic", candidate=True),
    Variant("nt-list/none", "nt-list", length_terms=False, lift_key="none"),
    Variant("nt-list/length", "nt-list", lift_key="length"),
    Variant("nt", "nt", norm_terms=True, candidate=True, norm_free="platt"),
    Variant(
        "nt-list/residual",
        "nt-list",
        norm_terms=True,
        length_terms=False,
        lift_key="residual",
        norm_free="nt-list/none",
    ),
    Variant(
        "nt-list/length+residual",
        "nt-list",
        norm_terms=True,
        candidate=True,
        lift_key="length+residual",
        norm_free="nt-list/length",
    ),
    Variant(
        _LEXICAL_RUNG,
        "nt-list",
        lexical_terms=True,
        candidate=True,
        lexical_free="nt-list/length",
    ),
    Variant(
        "nt-list/length+lexical+residual",
        "nt-list",
        norm_terms=True,
        lexical_terms=True,
        candidate=True,
        norm_free=_LEXICAL_RUNG,
        lexical_free="nt-list/length+residual",
    ),
    Variant(
        "nt/wide",
        "nt",
        norm_terms=True,
        prior_width="wide",
        min_queries=_WIDE_FROM,
        candidate=True,
        note="nt: the wide prior won in CV (>= 200 labelled queries).",
        norm_free="platt",
    ),
    Variant(
        "nt-list/wide",
        "nt-list",
        norm_terms=True,
        prior_width="wide",
        min_queries=_WIDE_FROM,
        candidate=True,
        norm_free="nt-list/length",
    ),
)
"""Every model tried, in the order candidates are compared."""
_VARIANTS = {v.name: v for v in VARIANTS}
_NORM_FAMILIES = ("nt", "nt-list")
_NORM_FREE = {  # what a family serves without candidates (no norms, no lexical)
    "prior": "prior",
    "platt": "platt",
    "isotonic": "isotonic",
    "nt": "platt",
    "nt-list": "nt-list/length",
}


@dataclass(frozen=True)
class MethodScores:
    """Out-of-fold metrics of one method.

    Attributes
    ----------
    method : str
        Method name (``"platt"``, ``"isotonic"``, ``"nt"``, ``"nt-list"`` or a lift
        variant such as ``"nt-list/length"``).
    nll, brier, ece, auroc : float
        OOF NLL (nats per pair), Brier score, ECE (``BINNING``), AUROC.
    """

    method: str
    nll: float
    brier: float
    ece: float
    auroc: float


@dataclass(frozen=True)
class NormLift:
    """What the norm terms bought on this data, from grouped CV.

    ``variants`` holds OOF scores of the list model with nothing, length only,
    residual norm only, and both (keys ``"none"``, ``"length"``, ``"residual"``,
    ``"length+residual"``); the raw norm is the residual plus the length trend, so
    ``"length+residual"`` carries all of it. ``with_norms``/``without_norms`` compare
    the best norm-aware family with its norm-free counterpart.

    Attributes
    ----------
    base_method : str
        Family compared (``"nt"`` vs Platt, or ``"nt-list"`` vs list model without
        residual norms).
    nll_with, nll_without, brier_with, brier_without : float
        OOF NLL and Brier with and without the residual-norm terms.
    norm_signal : bool
        Whether norm terms are kept in the served model.
    reason : str
        Why (user-readable).
    terms : dict
        Fitted ``{name: (estimate, posterior sd)}`` of the norm-aware model refitted
        on all data (sd 0 = pinned at the prior centre).
    variants : dict
        ``{variant: MethodScores}`` of the decomposition above.
    """

    base_method: str
    nll_with: float
    nll_without: float
    brier_with: float
    brier_without: float
    norm_signal: bool
    reason: str
    terms: dict[str, tuple[float, float]] = field(default_factory=dict)
    variants: dict[str, MethodScores] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupLift:
    """What one group of evidence bought on this data: one rung of the ladder.

    Attributes
    ----------
    group : str
        ``"list"`` (rank, gap), ``"length"``, ``"lexical"`` or ``"residual norm"``.
    model, base : str
        The model with the group and the rung below it, without (variant names).
    nll_gain : float
        OOF NLL of ``base`` minus that of ``model``, nats per pair (positive: the
        group helps).
    nll_gain_se : float
        Standard error of ``nll_gain`` (paired per query, nats per pair).
    brier_change : float
        OOF Brier of ``model`` minus that of ``base`` (negative: the group helps).
    verdict : str
        ``"pays"`` when ``nll_gain`` exceeds ``nll_gain_se`` (the one-standard-error
        rule of ``auto``) and :data:`NEGLIGIBLE_GAIN`, ``"no measurable gain"``
        otherwise, ``"not measured"`` when
        the data cannot show it (numbers NaN; ``reason`` says why).
    reason : str
        User-readable explanation.
    """

    group: str
    model: str
    base: str
    nll_gain: float
    nll_gain_se: float
    brier_change: float
    verdict: str
    reason: str


EVIDENCE_LADDER: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("list", (("nt-list/none", "platt"),)),
    ("length", (("nt-list/length", "nt-list/none"),)),
    ("lexical", ((_LEXICAL_RUNG, "nt-list/length"),)),
    (
        "residual norm",
        (
            ("nt-list/length+lexical+residual", _LEXICAL_RUNG),
            ("nt-list/length+residual", "nt-list/length"),
        ),
    ),
)
"""Evidence groups in ladder order, each with its ``(model, base)`` rungs: the first
rung whose two models were both fitted is measured (the residual norm is measured on
top of lexical evidence when the lexical models exist, else on top of length)."""

NEGLIGIBLE_GAIN = 1e-5
"""Nats per pair below which a gain is optimiser noise, whatever its standard error:
when every added term ends at its bound of zero, the two fits still differ by about
1e-7 nats per pair (their L-BFGS-B paths differ), with a standard error as small."""


def evidence_lift(
    oof: dict[str, FloatArray],
    y: FloatArray,
    codes: IntArray,
    unmeasured: dict[str, str] | None = None,
) -> tuple[GroupLift, ...]:
    """The lift of each evidence group, from OOF probabilities already computed.

    The ladder is platt → +list (rank, gap) → +length → +lexical → +residual norm.
    Each group is added to the rung below it (:data:`EVIDENCE_LADDER`) and judged by
    the paired per-query NLL difference (:func:`~calibration.metrics.paired_nll_gain`,
    the same one-standard-error rule as ``auto`` and the norm verdict). A ladder
    rather than leave-one-out, because each rung is a model selection fits anyway:
    the report costs no extra fit.

    Parameters
    ----------
    oof : dict
        ``{variant name: OOF probabilities}``.
    y : ndarray of shape (n_pairs,)
        Labels.
    codes : ndarray of shape (n_pairs,)
        Query codes.
    unmeasured : dict or None
        ``{group: reason}`` shown for a group whose models were not fitted.

    Returns
    -------
    tuple of GroupLift
        One per group, in ladder order.
    """
    out = []
    for group, rungs in EVIDENCE_LADDER:
        fitted = [(m, b) for m, b in rungs if m in oof and b in oof]
        model, base = (fitted or rungs)[0]
        if not fitted:
            why = (unmeasured or {}).get(group, f"{model} was not fitted")
            nan = float("nan")
            out.append(
                GroupLift(group, model, base, nan, nan, nan, "not measured", why)
            )
            continue
        gain, se = paired_nll_gain(oof[model], oof[base], y, codes)
        brier = brier_score(y, oof[model]) - brier_score(y, oof[base])
        pays = gain > max(se, NEGLIGIBLE_GAIN)
        verdict = "pays" if pays else "no measurable gain"
        size = (
            "more than one standard error"
            if pays
            else "within one standard error"
            if gain <= se
            else f"negligible (below {NEGLIGIBLE_GAIN:g})"
        )
        reason = (
            f"{model} vs {base}: held-out NLL gain {gain:+.4f} ± {se:.4f} nats per "
            f"pair, {size}."
        )
        out.append(GroupLift(group, model, base, gain, se, brier, verdict, reason))
    return tuple(out)


RuleName = Literal["requested", "one-se", "ece-guard", "rank-guard", "recalibration"]
"""The rules a choice records (:class:`SelectionRule`)."""


@dataclass(frozen=True)
class SelectionRule:
    """One rule behind the served method, its outcome and why.

    Attributes
    ----------
    rule : {"requested", "one-se", "ece-guard", "rank-guard", "recalibration"}
        ``"requested"``: a named method was served as asked (``auto``'s rules were not
        applied). ``"one-se"``: the best held-out NLL against the baseline (the prior
        fit, else Platt). ``"ece-guard"``: the served map's held-out ECE against
        ``ECE_GUARD`` times its noise floor. ``"rank-guard"``: the served map's
        held-out order of each query's judged hits (nDCG@10) against a plain fusion
        (RRF) of their cosine and BM25 lists. ``"recalibration"``: whether the final
        recalibration stage is served on top of the chosen family.
    outcome : str
        Short verdict: ``"served as asked"``; ``"best is the baseline"``, ``"kept"``,
        ``"baseline served"``; ``"at its floor"``, ``"switched"``, ``"none at its
        floor"``; ``"kept"``, ``"switched"``; ``"applied"``, ``"not applied"``.
    detail : str
        User-readable explanation with the numbers.
    """

    rule: RuleName
    outcome: str
    detail: str


@dataclass(frozen=True)
class SelectionWhy:
    """Why the served map was chosen: the choice and each rule's outcome.

    Attributes
    ----------
    chosen : str
        Wire method served.
    recalibrated : bool
        Whether the recalibration stage is served on top of it.
    served : MethodScores
        Held-out (out-of-fold) scores of the served map, the stage included.
    ece_noise_floor : float
        ECE a perfectly calibrated map with those probabilities would show
        (:meth:`~calibration.metrics.Binning.noise_floor`).
    rules : tuple of SelectionRule
        In the order applied.
    recalibrated_cv : dict
        ``{method: MethodScores}`` of every wire method with the stage (fitted inside
        the grouped CV), each on the variant ``auto`` would serve for it (after the
        norm and lexical fallbacks); ``cv`` holds the methods without the stage.
    """

    chosen: str
    recalibrated: bool
    served: MethodScores
    ece_noise_floor: float
    rules: tuple[SelectionRule, ...]
    recalibrated_cv: dict[str, MethodScores] = field(default_factory=dict)


@dataclass(frozen=True)
class SelectionResult:
    """Outcome of :func:`select_calibrator`.

    Attributes
    ----------
    estimator : calibrator
        Chosen calibrator refitted on all data.
    method : str
        Chosen wire name.
    uses_norms : bool
        Whether the served model uses residual-norm terms.
    cv : dict
        ``{method: MethodScores}`` for every wire method.
    norm_lift : NormLift
        Norm-lift report.
    n_queries, n_pairs, n_splits : int
        Data size and folds.
    reliability : ReliabilityCurve
        OOF reliability curve of the chosen method (``BINNING``).
    oof_proba : ndarray of shape (n_pairs,)
        OOF probabilities of the chosen method (for query-level fitting).
    notes : tuple of str
        Decisions taken (fallbacks, skipped methods).
    evidence_lift : tuple of GroupLift
        Lift of each evidence group (:func:`evidence_lift`); empty in results
        stored before it existed.
    why : SelectionWhy or None
        Why the served map was chosen; None in results stored before it existed.
    """

    estimator: _Calibrator
    method: str
    uses_norms: bool
    cv: dict[str, MethodScores]
    norm_lift: NormLift
    n_queries: int
    n_pairs: int
    n_splits: int
    reliability: ReliabilityCurve
    oof_proba: FloatArray
    notes: tuple[str, ...] = ()
    evidence_lift: tuple[GroupLift, ...] = ()
    why: SelectionWhy | None = None


def make_calibrator(
    method: str,
    *,
    probe_rho: float | None = None,
    query_side_only: bool = False,
    **params: Any,
) -> _Calibrator:
    """Return an unfitted calibrator for a wire method name.

    Parameters
    ----------
    method : {"platt", "isotonic", "nt", "nt-list"}
        Method name.
    probe_rho : float or None, default=None
        Sign-probe value passed to the NT models.
    query_side_only : bool, default=False
        Never reorder hits (NT models).
    **params
        Extra constructor parameters of the NT models.

    Returns
    -------
    calibrator
        Unfitted estimator.
    """
    if method == "platt":
        return PlattCalibrator()
    if method == "isotonic":
        return IsotonicCalibrator()
    if method == "nt":
        return NormTemperedCalibrator(
            probe_rho=probe_rho, query_side_only=query_side_only, **params
        )
    if method == "nt-list":
        return ListAwareCalibrator(
            probe_rho=probe_rho, query_side_only=query_side_only, **params
        )
    raise InvalidInputError(
        f"Unknown method {method!r}; expected one of {(*METHODS, 'auto')}.",
        field="method",
    )


def cross_val_predict_grouped(
    estimator: _Calibrator,
    X: ArrayLike,
    y: ArrayLike,
    groups: ArrayLike,
    *,
    n_splits: int = 5,
) -> FloatArray:
    """Out-of-fold probabilities with folds split by query.

    A training fold with a single class predicts its base rate (clipped to
    [1e-4, 1 - 1e-4]) instead of failing.

    Parameters
    ----------
    estimator : calibrator
        Unfitted template (cloned per fold).
    X : array-like of shape (n_pairs, n_features)
        Pair features.
    y : array-like of shape (n_pairs,)
        Labels.
    groups : array-like of shape (n_pairs,)
        Query ids.
    n_splits : int, default=5
        Number of folds.

    Returns
    -------
    ndarray of shape (n_pairs,)
        OOF probabilities.
    """
    Xa = as_float_2d(X, "X")
    yv = as_labels(y, Xa.shape[0], allow_single_class=True)
    codes = as_groups(groups, Xa.shape[0])
    require_queries(int(codes.max()) + 1, n_splits, "Cross-validation")
    return _oof(estimator, Xa, yv, codes, _folds(Xa, yv, codes, n_splits))


def _folds(
    X: FloatArray, y: FloatArray, codes: IntArray, n_splits: int
) -> list[tuple[IntArray, IntArray]]:
    return [
        (np.asarray(tr, np.int64), np.asarray(te, np.int64))
        for tr, te in GroupKFold(n_splits=n_splits).split(X, y, codes)
    ]


def _oof(
    template: _Calibrator,
    X: FloatArray,
    y: FloatArray,
    codes: IntArray,
    folds: list[tuple[IntArray, IntArray]],
) -> FloatArray:
    from sklearn.base import clone

    out = np.empty(X.shape[0])
    for tr, te in folds:
        try:
            est = clone(template).fit(X[tr], y[tr], codes[tr])
            out[te] = est.predict_proba(X[te])
        except SingleClassError:
            out[te] = np.clip(y[tr].mean(), 1e-4, 1 - 1e-4)
    return out


def _scores(method: str, y: FloatArray, p: FloatArray) -> MethodScores:
    return MethodScores(
        method=method,
        nll=negative_log_likelihood(y, p),
        brier=brier_score(y, p),
        ece=BINNING.ece(y, p),
        auroc=auroc(y, p),
    )


def select_calibrator(
    X: ArrayLike,
    y: ArrayLike,
    groups: ArrayLike,
    *,
    method: str = "auto",
    n_splits: int = 5,
    probe_rho: float | None = None,
    query_side_only: bool = False,
    prior: CrossDomainPrior | None = None,
) -> SelectionResult:
    """Cross-validate every method by query, choose one, refit it, report the lifts.

    With a cross-domain ``prior`` the few-label ``"prior"`` family
    (:class:`~calibration.prior.PriorCalibrator`) joins the candidates and becomes the
    baseline of the one-standard-error rule instead of Platt: with few judged queries
    a flexible family's CV gain is mostly noise, and the prior fit is the one that
    borrows the shape measured on other domains (it beat Platt at 5 queries on 10 of
    12 sets, issue 9), so any other family must beat *it* clearly. As queries
    accumulate, real gains clear one SE and the richer families take over.

    Recalibration stage: each family's candidate for ``auto`` is its map with or
    without a final recalibration of its logit, fitted inside the grouped CV (module
    docstring); the served estimator is then a
    :class:`~calibration.recalibration.Recalibrated` whose map is fitted on all the
    family's out-of-fold logits.

    ECE guard: ``auto`` never serves a candidate whose OOF ECE is clearly above its
    noise floor (more than ``ECE_GUARD`` times :meth:`Binning.noise_floor`) while
    another sits at its own floor; the best-NLL candidate at its floor is served
    instead (an NLL-chosen map with ECE 0.023 against a floor of 0.0035 was seen
    beside isotonic at 0.0039). With the stage, a better-discriminating family whose
    recalibrated map is at its floor stays eligible.

    Parameters
    ----------
    X : array-like of shape (n_pairs, 12)
        Pair features in ``FEATURES`` order.
    y : array-like of shape (n_pairs,)
        Binary relevance labels.
    groups : array-like of shape (n_pairs,)
        Query id of each pair.
    method : {"auto", "platt", "isotonic", "nt", "nt-list", "prior"}, default="auto"
        ``"auto"`` keeps the lowest OOF NLL after the norm and lexical fallbacks and the
        one-standard-error rule of the module docstring; a named method is served as
        asked (metrics of all are reported).
    n_splits : int, default=5
        Grouped folds; at least this many distinct queries are required.
    probe_rho : float or None, default=None
        Sign probe from unlabelled data for the NT prior; ``None`` probes ``X``.
    query_side_only : bool, default=False
        Restrict NT models to query-side terms and serve no lexical model (no
        reordering of hits).
    prior : CrossDomainPrior or None, default=None
        Shipped cross-domain prior; adds the ``"prior"`` family (required by
        ``method="prior"``), unless its document-side terms would reorder hits and
        ``query_side_only`` forbids that.

    Returns
    -------
    SelectionResult
        Fitted estimator, choice and why (``why``), per-method CV metrics, norm and
        evidence lift.

    Raises
    ------
    InvalidInputError
        Bad shapes, NaN/inf, non-binary labels, unknown method.
    SingleClassError
        All labels equal.
    InsufficientDataError
        Fewer distinct queries than ``n_splits`` (or fewer than 2).
    """
    if prior is not None and prior.reorders_hits and query_side_only:
        prior = None  # its document-side (lexical) terms reorder hits
    methods = METHODS if prior is None else ("prior", *METHODS)
    if method != "auto" and method not in methods:
        raise InvalidInputError(
            f"Unknown method {method!r}; expected one of {(*methods, 'auto')}.",
            field="method",
        )
    if n_splits < 2:
        raise InvalidInputError("n_splits must be at least 2.", field="n_splits")
    data = _pairs(X, y, groups, n_splits)
    notes: list[str] = []
    if not data.has_norms:
        notes.append("Norm columns are all zero (unit-norm model?): no norm terms.")
    fits = _fit_candidates(
        data, methods, prior, probe_rho=probe_rho, query_side_only=query_side_only
    )
    notes += [n for v in fits.best.values() if (n := _VARIANTS[v].note)]
    lifts = _lift_reports(data, fits, notes)
    stages = {m: _stage(m, fits.oof[lifts.served[m]], data) for m in methods}
    if method == "auto":
        method, rules = _auto(methods, stages, data.y, data.codes, notes, X=data.X)
        key = lifts.served[method]
        stage: _Stage | None = stages[method]
    else:
        key, stage = fits.best[method], None
        rules = [
            SelectionRule(
                "requested",
                "served as asked",
                f"{method} was requested: auto's rules and the recalibration stage "
                "were not applied.",
            )
        ]
    norm_est = lifts.norm.estimator
    if norm_est is not None and key == lifts.norm_key:
        est: _Calibrator = norm_est
    else:
        est = _refit(fits.templates[key], data.X, data.y, data.codes)
    oof = fits.oof[key] if stage is None else stage.oof
    if stage is not None:
        rules.append(stage.rule)
        if stage.used:
            a, b, c = fit_recalibration(proba_logit(stage.raw), data.y)
            est = Recalibrated(base=est, a=a, b=b, c=c)
    served = _scores(method, data.y, oof)
    why = SelectionWhy(
        chosen=method,
        recalibrated=isinstance(est, Recalibrated),
        served=served,
        ece_noise_floor=BINNING.noise_floor(oof),
        rules=tuple(rules),
        recalibrated_cv={m: st.recal_scores for m, st in stages.items()},
    )
    return SelectionResult(
        estimator=est,
        method=method,
        uses_norms=_VARIANTS[key].norm_terms,
        cv={m: _rename(fits.scores[fits.best[m]], m) for m in methods},
        norm_lift=lifts.norm.result,
        n_queries=data.n_queries,
        n_pairs=int(data.X.shape[0]),
        n_splits=n_splits,
        reliability=BINNING.curve(data.y, oof),
        oof_proba=oof,
        notes=tuple(notes),
        evidence_lift=lifts.evidence,
        why=why,
    )


@dataclass(frozen=True)
class _Pairs:
    """The validated judged pairs of a selection, with their grouped folds."""

    X: FloatArray
    y: FloatArray
    codes: IntArray
    n_queries: int
    folds: list[tuple[IntArray, IntArray]]
    has_norms: bool
    has_lexical: bool


def _pairs(X: ArrayLike, y: ArrayLike, groups: ArrayLike, n_splits: int) -> _Pairs:
    """Check the pairs (shapes, labels, enough queries) and fold them by query."""
    Xa = as_float_2d(X, "X", min_columns=len(FEATURES))
    yv = as_labels(y, Xa.shape[0])
    if groups is None:
        raise InvalidInputError("groups (query ids) are required.", field="groups")
    codes = as_groups(groups, Xa.shape[0])
    n_queries = int(codes.max()) + 1
    require_queries(n_queries, n_splits, f"{n_splits}-fold grouped cross-validation")
    return _Pairs(
        X=Xa,
        y=yv,
        codes=codes,
        n_queries=n_queries,
        folds=_folds(Xa, yv, codes, n_splits),
        has_norms=bool(np.any(Xa[:, [ELL_Q, ELL_D]] != 0.0)),
        has_lexical=bool(np.any(np.ptp(Xa[:, LEX : LEX_RANK + 1], axis=0) > 0.0)),
    )


@dataclass(frozen=True)
class _Candidates:
    """Every available variant cross-validated, and the best variant of each family."""

    variants: list[Variant]
    templates: dict[str, _Calibrator]
    oof: dict[str, FloatArray]  # out-of-fold probabilities, by variant
    scores: dict[str, MethodScores]  # by variant
    best: dict[str, str]  # family -> its best variant
    reorder: bool  # hits may be reordered (not query-side only)


def _fit_candidates(
    data: _Pairs,
    methods: tuple[str, ...],
    prior: CrossDomainPrior | None,
    *,
    probe_rho: float | None,
    query_side_only: bool,
) -> _Candidates:
    """Cross-validate each variant the data allows, and pick each family's best."""
    reorder = not query_side_only
    kw: dict[str, Any] = {"probe_rho": probe_rho, "query_side_only": query_side_only}
    variants = [
        v
        for v in VARIANTS
        if v.available(data.has_norms, data.has_lexical, data.n_queries, reorder)
        and v.family in methods
    ]
    payload = None if prior is None else prior.to_dict()
    templates = {v.name: v.template(payload, **kw) for v in variants}
    oof = {
        k: _oof(t, data.X, data.y, data.codes, data.folds) for k, t in templates.items()
    }
    scores = {k: _scores(k, data.y, p) for k, p in oof.items()}
    best = {m: _best(m, variants, scores, reorder) or _NORM_FREE[m] for m in methods}
    return _Candidates(variants, templates, oof, scores, best, reorder)


@dataclass(frozen=True)
class _Lifts:
    """What the norm and each evidence group earned, and the variants served."""

    norm: _Lift
    norm_key: str  # the norm-aware variant the norm lift measured
    evidence: tuple[GroupLift, ...]
    served: dict[str, str]  # family -> variant, after the norm and lexical fallbacks


def _lift_reports(data: _Pairs, fits: _Candidates, notes: list[str]) -> _Lifts:
    """The norm lift, the evidence ladder, and the fallbacks they imply.

    The norm lift compares the best norm-aware family with its norm-free counterpart;
    each fallback is also said in ``notes``.
    """
    scores, reorder = fits.scores, fits.reorder
    norm_key = {
        m: _best(m, fits.variants, scores, reorder, norms=True) or fits.best[m]
        for m in _NORM_FAMILIES
    }
    fam = (
        min(_NORM_FAMILIES, key=lambda m: scores[norm_key[m]].nll)
        if data.has_norms
        else _NORM_FAMILIES[-1]
    )
    with_key = norm_key[fam]
    free_key = _VARIANTS[with_key].norm_free or with_key
    lift = _norm_lift(
        fam,
        with_key,
        free_key,
        scores,
        fits.oof,
        data.has_norms,
        data.n_queries,
        fits.templates,
        data.X,
        data.y,
        data.codes,
    )
    lifts = evidence_lift(
        fits.oof, data.y, data.codes, _unmeasured(data.has_norms, data.has_lexical)
    )
    lexical = next(g for g in lifts if g.group == "lexical")
    lexical_pays = lexical.verdict == "pays"
    served = {
        m: _VARIANTS[k].without(
            norms=not lift.result.norm_signal, lexical=not lexical_pays
        )
        for m, k in fits.best.items()
    }
    if not lift.result.norm_signal and data.has_norms:
        notes.append(f"Norm fallback: {lift.result.reason}")
    if data.has_lexical and not lexical_pays and reorder:
        notes.append(
            f"Lexical fallback: {lexical.reason} The lexical-free model is served."
        )
    if lexical_pays and not reorder:
        notes.append(
            f"{lexical.reason} Lexical terms reorder hits: fit with reordering "
            "allowed to serve them."
        )
    return _Lifts(lift, with_key, lifts, served)


@dataclass(frozen=True)
class _Stage:
    """A family's map without and with the recalibration stage, and its candidate."""

    raw: FloatArray  # out-of-fold probabilities of the family's served variant
    recalibrated: FloatArray  # the same, recalibrated inside the grouped CV
    raw_scores: MethodScores
    recal_scores: MethodScores
    used: bool  # the candidate is the recalibrated map
    rule: SelectionRule  # why (or why not)

    @property
    def oof(self) -> FloatArray:
        return self.recalibrated if self.used else self.raw

    @property
    def scores(self) -> MethodScores:
        return self.recal_scores if self.used else self.raw_scores


def _recalibrated_oof(
    p: FloatArray, y: FloatArray, folds: list[tuple[IntArray, IntArray]]
) -> FloatArray:
    """Out-of-fold probabilities with the recalibration stage, fitted honestly.

    The map applied to fold ``f`` is fitted on the other folds' out-of-fold logits
    only.
    """
    z = proba_logit(p)
    out = np.empty_like(p)
    for tr, te in folds:
        out[te] = recalibrate_proba(p[te], *fit_recalibration(z[tr], y[tr]))
    return out


def _stage(method: str, raw: FloatArray, data: _Pairs) -> _Stage:
    """Whether a family's candidate is its recalibrated map (module docstring).

    Yes when the stage's held-out NLL gain exceeds one standard error, or when it
    brings a map clearly above its ECE noise floor back within ``ECE_GUARD`` times it
    while the NLL is no worse by more than one standard error.
    """
    y, codes = data.y, data.codes
    rec = _recalibrated_oof(raw, y, data.folds)
    s_raw, s_rec = _scores(method, y, raw), _scores(method, y, rec)
    f_raw, f_rec = BINNING.noise_floor(raw), BINNING.noise_floor(rec)
    gain, se = paired_nll_gain(rec, raw, y, codes)
    raw_at_floor = s_raw.ece <= ECE_GUARD * f_raw
    fixes = not raw_at_floor and s_rec.ece <= ECE_GUARD * f_rec and gain > -se
    pays = gain > max(se, NEGLIGIBLE_GAIN)
    if pays:
        verdict = "the NLL gain exceeds one standard error"
    elif fixes:
        verdict = f"it brings the ECE within {ECE_GUARD:g}x its noise floor"
    elif raw_at_floor:
        verdict = (
            "no NLL gain beyond one standard error, and the map is already within "
            f"{ECE_GUARD:g}x its noise floor"
        )
    else:
        verdict = (
            "no NLL gain beyond one standard error, and it does not bring the ECE "
            f"within {ECE_GUARD:g}x its noise floor"
        )
    used = pays or fixes
    detail = (
        f"{method} recalibrated inside the grouped CV: held-out NLL {s_raw.nll:.4f} "
        f"-> {s_rec.nll:.4f} (gain {gain:+.3g} +/- {se:.3g} nats per pair), ECE "
        f"{s_raw.ece:.4f} -> {s_rec.ece:.4f} (noise floor {f_raw:.4f} -> {f_rec:.4f}); "
        f"{'applied' if used else 'not applied'}: {verdict}."
    )
    rule = SelectionRule("recalibration", "applied" if used else "not applied", detail)
    return _Stage(raw, rec, s_raw, s_rec, used, rule)


def _auto(
    methods: tuple[str, ...],
    stages: dict[str, _Stage],
    y: FloatArray,
    codes: IntArray,
    notes: list[str],
    *,
    X: FloatArray | None = None,
) -> tuple[str, list[SelectionRule]]:
    """``auto``: best NLL, the one-SE rule, the ECE guard, then the rank guard.

    Each family is represented by its candidate (:func:`_stage`: recalibrated or not).
    ``X`` (the pairs' features) gives the rank guard its plain fusion (``pair_rrf``)
    and the cosines that break ties; without it the pairs' own order stands for both.
    """
    base = methods[0]  # "prior" when a prior is given, else "platt"
    best = min(methods, key=lambda m: stages[m].scores.nll)
    one_se = _one_se_rule(best, base, stages, y, codes)
    method = base if one_se.outcome == "baseline served" else best
    if method != best:
        notes.append(
            f"auto: {best} beat {base} in grouped CV by less than one standard "
            f"error of the per-query NLL difference; serving {base}."
        )
    guard, method = _ece_guard(method, methods, stages)
    if guard.outcome == "switched":
        notes.append(f"auto: {guard.detail}")
    tie = np.zeros_like(y) if X is None else X[:, COSINE]
    fusion = -np.arange(len(y), dtype=np.float64) if X is None else pair_rrf(X)
    order, method = _rank_guard(method, methods, stages, y, codes, tie, fusion)
    if order.outcome == "switched":
        notes.append(f"auto: {order.detail}")
    return method, [one_se, guard, order]


def _one_se_rule(
    best: str, base: str, stages: dict[str, _Stage], y: FloatArray, codes: IntArray
) -> SelectionRule:
    """Whether the best held-out NLL beats the baseline's by more than one SE."""
    if best == base:
        nll = stages[base].scores.nll
        return SelectionRule(
            "one-se",
            "best is the baseline",
            f"{base} (the baseline) had the lowest held-out NLL, {nll:.4f}.",
        )
    gain, se = paired_nll_gain(stages[best].oof, stages[base].oof, y, codes)
    kept = gain > se
    detail = (
        f"{best} beat {base} (the baseline) by {gain:.3g} +/- {se:.3g} held-out nats "
        "per pair, "
        + (
            "more than one standard error: kept."
            if kept
            else f"within one standard error: {base} is served."
        )
    )
    return SelectionRule("one-se", "kept" if kept else "baseline served", detail)


def _ece_guard(
    method: str, methods: tuple[str, ...], stages: dict[str, _Stage]
) -> tuple[SelectionRule, str]:
    """Never serve a map clearly above its ECE noise floor while another is at its own."""
    floor = {m: BINNING.noise_floor(stages[m].oof) for m in methods}
    ece = {m: stages[m].scores.ece for m in methods}
    at_floor = [m for m in methods if ece[m] <= ECE_GUARD * floor[m]]
    if method in at_floor:
        detail = (
            f"{method}'s held-out ECE {ece[method]:.4f} is within {ECE_GUARD:g}x its "
            f"noise floor {floor[method]:.4f}."
        )
        return SelectionRule("ece-guard", "at its floor", detail), method
    if not at_floor:
        detail = (
            f"{method}'s held-out ECE {ece[method]:.4f} is above {ECE_GUARD:g}x its "
            f"noise floor {floor[method]:.4f}, as is every other family's: kept."
        )
        return SelectionRule("ece-guard", "none at its floor", detail), method
    guard = min(at_floor, key=lambda m: stages[m].scores.nll)
    detail = (
        f"{method} had held-out ECE {ece[method]:.4f}, clearly above its noise floor "
        f"{floor[method]:.4f}, while {guard} sits at its floor; serving {guard}."
    )
    return SelectionRule("ece-guard", "switched", detail), guard


def _rank_guard(
    method: str,
    methods: tuple[str, ...],
    stages: dict[str, _Stage],
    y: FloatArray,
    codes: IntArray,
    tie: FloatArray,
    fusion: FloatArray,
) -> tuple[SelectionRule, str]:
    """Never serve a map that orders hits clearly worse than a plain fusion does.

    Search orders a hybrid pool by the served probabilities, so a map chosen for its
    probabilities (NLL, ECE) must not throw away the evidence that orders hits: a
    cosine-only map on a collection where BM25 finds what the cosine misses. Each
    query's judged pairs are ordered held out by the chosen family's out-of-fold
    probabilities and by ``fusion`` (RRF of their cosine-list and BM25-list ranks).
    When the fusion's mean per-query nDCG@10 beats the map's by more than one
    standard error of the paired difference, the family that orders them best among
    those within ``ECE_GUARD`` times their noise floor is served instead, if it orders
    them better than the chosen one by more than one standard error too (a switch on
    noise would give up NLL for nothing). Ties of probability fall back to ``tie``.
    """

    def mean(v: FloatArray) -> float:
        return float(np.nanmean(v)) if np.any(~np.isnan(v)) else 0.0

    ndcg = {m: per_query_ndcg(y, stages[m].oof, codes, tie) for m in methods}
    fused = mean(per_query_ndcg(y, fusion, codes, tie))
    gain, se = paired_ndcg_gain(fusion, stages[method].oof, y, codes, tie)
    said = (
        f"{method} orders the judged hits held out with mean nDCG@10 "
        f"{mean(ndcg[method]):.3f}; RRF of the cosine and BM25 lists {fused:.3f} "
        f"(gain {gain:+.3g} +/- {se:.3g} per query)"
    )
    if not gain > se:
        detail = f"{said}: not clearly better, {method} is kept."
        return SelectionRule("rank-guard", "kept", detail), method
    eligible = [
        m
        for m in methods
        if stages[m].scores.ece <= ECE_GUARD * BINNING.noise_floor(stages[m].oof)
    ]
    best = max(eligible, key=lambda m: mean(ndcg[m]), default=method)
    b_gain, b_se = paired_ndcg_gain(stages[best].oof, stages[method].oof, y, codes, tie)
    if best == method or not b_gain > b_se:
        detail = (
            f"{said}: clearly better, but no family at its ECE floor orders them "
            f"clearly better than {method}, which is kept."
        )
        return SelectionRule("rank-guard", "kept", detail), method
    detail = (
        f"{said}: clearly better; {best} orders them best among the families at "
        f"their ECE floor ({mean(ndcg[best]):.3f}, gain {b_gain:+.3g} +/- {b_se:.3g}): "
        f"serving {best}."
    )
    return SelectionRule("rank-guard", "switched", detail), best


def _best(
    family: str,
    variants: list[Variant],
    scores: dict[str, MethodScores],
    reorder: bool,
    *,
    norms: bool = False,
) -> str | None:
    """The best candidate of a wire method (``norms``: among norm-aware ones), if any.

    Candidates are tried in table order and a later one must be strictly better, so
    a wide prior replaces the default one only when it wins. Lexical models are no
    candidates when hits must keep their order. Without a candidate the method
    stands for its norm-free model (``_NORM_FREE``).
    """
    candidates = [
        v.name
        for v in variants
        if v.family == family
        and v.candidate
        and (reorder or not v.lexical_terms)
        and (v.norm_terms or not norms)
    ]
    if not candidates:
        return None
    return min(candidates, key=lambda name: scores[name].nll)


def _unmeasured(has_norms: bool, has_lexical: bool) -> dict[str, str]:
    """Why a group of the evidence ladder could not be measured on this data."""
    out = {}
    if not has_lexical:
        out["lexical"] = (
            "The judged hits carry no lexical evidence (the lexical "
            "columns are constant)."
        )
    if not has_norms:
        out["residual norm"] = "The norm columns are all zero (unit-norm embeddings)."
    return out


@dataclass(frozen=True)
class _Lift:
    result: NormLift
    estimator: _NTBase | None  # the norm-aware model refitted on all data


def _norm_lift(
    fam: str,
    with_key: str,
    free_key: str,
    scores: dict[str, MethodScores],
    oof: dict[str, FloatArray],
    has_norms: bool,
    n_queries: int,
    templates: dict[str, _Calibrator],
    X: FloatArray,
    y: FloatArray,
    codes: IntArray,
) -> _Lift:
    """Whether norm terms earn their place (module docstring), and their estimates."""
    norm_signal = (
        has_norms and norm_lift_verdict(y, oof[with_key], oof[free_key], codes).kept
    )
    if not has_norms:
        reason = "No norm signal: norm columns are constant (unit-norm embeddings)."
    elif norm_signal:
        reason = (
            f"kept: {fam} with norm terms beat its norm-free counterpart in grouped "
            "CV by more than one standard error of the per-query NLL difference."
        )
    else:
        reason = (
            f"no measurable gain: {fam} with norm terms did not beat its norm-free "
            "counterpart by more than one standard error of the per-query NLL "
            "difference; the norm-free model is served."
        )
    norm_est: _NTBase | None = None
    terms: dict[str, tuple[float, float]] = {}
    if has_norms:
        norm_est = _refit(templates[with_key], X, y, codes)
        terms = norm_est.norm_terms()
        if (
            norm_signal
            and n_queries >= _GAMMA_RULE_FROM
            and norm_est.prior_width_ != "fixed"
            and all(abs(v) < 2 * sd for v, sd in terms.values())
        ):
            norm_signal = False
            reason = (
                "Every fitted norm term is within 2 posterior SD of zero with "
                f"{n_queries} labelled queries: the norm adds nothing here."
            )
    result = NormLift(
        base_method=fam,
        nll_with=scores[with_key].nll,
        nll_without=scores[free_key].nll,
        brier_with=scores[with_key].brier,
        brier_without=scores[free_key].brier,
        norm_signal=norm_signal,
        reason=reason,
        terms=terms,
        variants={
            v.lift_key: scores[v.name]
            for v in VARIANTS
            if v.lift_key is not None and v.name in scores
        },
    )
    return _Lift(result, norm_est)


def _rename(s: MethodScores, method: str) -> MethodScores:
    return MethodScores(method, s.nll, s.brier, s.ece, s.auroc)


def _refit(template: Any, X: FloatArray, y: FloatArray, codes: IntArray) -> Any:
    from sklearn.base import clone

    return clone(template).fit(X, y, codes)
