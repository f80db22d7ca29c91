"""Calibration profiles: the bridge from retrieval evidence to probabilities.

A :class:`Profile` is everything search needs to turn one query's hit list into
probabilities: the norm references of both sides (same model), the pair calibrator,
the weight of the coherent query confidence and the abstain policy, plus the typed
:class:`~calibration.report.FitReport`.

The shipped default profile is the cross-domain prior itself (a
:class:`~calibration.prior.PriorCalibrator` at zero judged queries, made by
:func:`prior_profile`): its probabilities come with intervals that say how far the
level varied across domains, and it certifies nothing. A collection's own fit borrows
that prior (:func:`fit_profile` with ``prior=``).

Query confidence is :func:`~calibration.prior.coherent_confidence` of the hits
actually returned: non-decreasing in ``k``, at least the largest hit probability and
at most ``min(1, sum)``. Formats 1 and 2 served a query-level logistic model that broke
those bounds; they still load, serve the noisy-OR (weight 1) instead, and their abstain
threshold counts as certified only if it was certified on the noisy-OR. It is stored as versioned JSON
(:mod:`calibration.io`), never pickled.

:func:`fit_profile` is the one fitting path, shared by ``POST .../calibrators``, the
default-profile script and ``normcal eval``. Storing profiles and loading the shipped
default ones is the service's business (``app.profiles``).
"""

from __future__ import annotations

import itertools
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from threadpoolctl import threadpool_limits

from calibration.drift import DriftReference, query_summary, reference_from
from calibration.exceptions import InsufficientDataError, UnsupportedFormatError
from calibration.features import (
    ELL_Q,
    LEXICAL_DEPTH,
    LexicalEvidence,
    NormReference,
    pair_features,
    stack_pair_features,
)
from calibration.io import DecodeBudget, check_dataclass, from_dict, to_dict
from calibration.metrics import (
    BINNING,
    auroc,
    brier_score,
    negative_log_likelihood,
    reliability_by_tercile,
)
from calibration.models import (
    IsotonicCalibrator,
    ListAwareCalibrator,
    NormTemperedCalibrator,
    PlattCalibrator,
)
from calibration.prior import (
    CrossDomainPrior,
    PriorCalibrator,
    coherent_confidence,
    fit_confidence_weight,
)
from calibration.query import (
    AbstainPolicy,
    QueryConfidenceModel,
    fit_abstain_policy,
    query_table,
)
from calibration.recalibration import Recalibrated
from calibration.report import FitReport, QueryLevelReport, to_jsonable
from calibration.selection import (
    MethodScores,
    NormLift,
    SelectionResult,
    select_calibrator,
)

__all__ = [
    "BINNING",
    "MAX_CREATED_AT",
    "MAX_NAME_CHARS",
    "MIN_QUERIES_PER_OUTCOME",
    "PROFILE_FORMAT",
    "Profile",
    "QueryEvidence",
    "Scored",
    "build_features",
    "fit_profile",
    "labels_of",
    "prior_profile",
    "query_model_is_supported",
    "query_reference",
    "single_threaded_blas",
    "to_jsonable",
    "trial_scores",
]

# 3: coherent confidence (``confidence_weight``), prior profiles; 2: the report is a
# versioned FitReport; 1: an untyped dict
PROFILE_FORMAT = 3
_READABLE_FORMATS = (1, 2, 3)
FALLBACK_ABSTAIN_THRESHOLD = 0.5
"""Without a certified threshold, abstain only when even the *upper* end of the
confidence interval (the confidence itself when there is none) is below this; on day
one (:attr:`Profile.day_one_threshold`), when even at the upper end of the level
interval the best hit's probability is below this."""
# A query-level model needs this many queries with, and without, a relevant hit; with
# fewer, its held-out AUROC fell below that of the noisy-OR of the hit probabilities.
MIN_QUERIES_PER_OUTCOME = 20

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class QueryEvidence:
    """One query's retrieval result, with labels when it is judged.

    Attributes
    ----------
    norm, n_tokens : float, int
        Raw norm and token count of the query embedding.
    scores : ndarray of shape (k,)
        Cosines of the hits, best first.
    doc_norms, doc_tokens : ndarray of shape (k,)
        Raw norms and token counts of the hit documents.
    labels : ndarray of shape (k,) or None
        1.0 where the hit is judged relevant, else 0.0 (unjudged counts as not
        relevant, the usual IR convention).
    lexical : LexicalEvidence or None
        BM25 evidence of the hits (``None``: no lexical match).
    input_scores : ndarray of shape (k,) or None
        Scores of the retriever that handed the list over (a rerank request's), in
        list order; ``None``: normcal retrieved the list, its cosines are those.
    """

    norm: float
    n_tokens: int
    scores: FloatArray
    doc_norms: FloatArray
    doc_tokens: NDArray[np.int64]
    labels: FloatArray | None = None
    lexical: LexicalEvidence | None = None
    input_scores: FloatArray | None = None


@dataclass(frozen=True)
class Scored:
    """Probabilities of one hit list and the query-level verdict.

    ``intervals`` (per-hit ``(lo, hi)``) and ``confidence_interval`` are set when the
    calibrator gives intervals (the prior family).
    """

    probabilities: FloatArray
    confidence: float
    abstain: bool
    intervals: tuple[FloatArray, FloatArray] | None = None
    confidence_interval: tuple[float, float] | None = None


def build_features(
    evidence: Sequence[QueryEvidence], query_ref: NormReference, doc_ref: NormReference
) -> tuple[FloatArray, NDArray[np.int64]]:
    """Stack the pair feature matrix (``calibration.FEATURES`` order) of many queries.

    Queries without hits contribute no rows; group ids still index ``evidence``.
    """
    kept = [i for i, e in enumerate(evidence) if len(e.scores)]
    if not kept:
        raise InsufficientDataError("No query retrieved any document.", n_queries=0)
    q_norms = np.array([evidence[i].norm for i in kept])
    q_tokens = np.array([evidence[i].n_tokens for i in kept])
    X, local = stack_pair_features(
        [evidence[i].scores for i in kept],
        query_ref.transform(q_norms, q_tokens),
        [
            doc_ref.transform(evidence[i].doc_norms, evidence[i].doc_tokens)
            for i in kept
        ],
        query_ref.length_feature(q_tokens),
        [doc_ref.length_feature(evidence[i].doc_tokens) for i in kept],
        [evidence[i].lexical for i in kept],
        [evidence[i].input_scores for i in kept],
    )
    return X, np.asarray(kept, dtype=np.int64)[local]


@dataclass
class Profile:
    """A fitted calibration profile (see the module docstring)."""

    id: str
    method: str
    model: str
    query_ref: NormReference
    doc_ref: NormReference
    estimator: Any
    query_model: QueryConfidenceModel | None
    abstain_policy: AbstainPolicy | None
    report: FitReport
    created_at: float = field(default_factory=time.time)
    default: bool = False
    # The identity of the model files it was fitted on (``app.embedding.identity``):
    # two models served under one name have different cosines and norms. None for
    # profiles from before identities were recorded.
    model_id: str | None = None
    confidence_weight: float = 1.0
    # Whether the abstain policy was certified on the confidence this profile serves
    # (False for format 1/2 profiles whose query-level model is no longer served).
    policy_matches_served: bool = True

    @property
    def reorders_hits(self) -> bool:
        """Whether probabilities may order a query's hits differently from cosine."""
        return bool(self.estimator.reorders_hits)

    @property
    def prior(self) -> CrossDomainPrior | None:
        """The cross-domain prior this profile's calibrator carries, if any."""
        est = _unwrapped(self.estimator)
        if isinstance(est, PriorCalibrator):
            return est.prior_
        return None

    @property
    def certified_policy(self) -> AbstainPolicy | None:
        """The abstain policy if it was certified on what this profile serves."""
        policy = self.abstain_policy
        if policy is not None and policy.certified and self.policy_matches_served:
            return policy
        return None

    @property
    def day_one_threshold(self) -> float | None:
        r"""The confidence below which a shipped default abstains (None: not one).

        A shipped default is the cross-domain prior at zero judgments: the shape of a
        hit list transfers across domains, the level of relevance of this collection
        does not, and its interval says how far it may be off. Abstain when even at
        the upper end of that level interval (the served logit plus the interval's
        half-width on the level, :math:`h`) the best hit is more likely irrelevant
        than relevant: :math:`\operatorname{expit}(\operatorname{logit} p_{max} + h)
        < 0.5`, i.e. :math:`p_{max} < \operatorname{expit}(-h)`. Nothing is tuned;
        ``benchmarks/day_one.py`` measures it held out (docs/calibration.md).
        """
        prior = self.prior
        if not self.default or prior is None:
            return None
        half = prior.quantile * prior.predictive_level_sd
        return FALLBACK_ABSTAIN_THRESHOLD / (
            FALLBACK_ABSTAIN_THRESHOLD
            + (1 - FALLBACK_ABSTAIN_THRESHOLD) * math.exp(half)
        )

    def score(
        self,
        norm: float,
        n_tokens: int,
        scores: FloatArray,
        doc_norms: FloatArray,
        doc_tokens: NDArray[np.int64],
        lexical: LexicalEvidence | None = None,
        input_scores: FloatArray | None = None,
    ) -> Scored:
        """Probabilities of one query's hits, their coherent confidence, abstain flag.

        The hits are in the order of the list they came in (``in_rank``);
        ``input_scores`` are the handing-over retriever's (a rerank request's).
        """
        if len(scores) == 0:
            return Scored(np.zeros(0), 0.0, True)
        ell_q = float(self.query_ref.transform([norm], [n_tokens])[0])
        X = pair_features(
            scores,
            ell_q,
            self.doc_ref.transform(doc_norms, doc_tokens),
            float(self.query_ref.length_feature([n_tokens])[0]),
            self.doc_ref.length_feature(doc_tokens),
            lexical,
            input_scores,
        )
        p = self.estimator.predict_proba(X)
        intervals = None
        if hasattr(self.estimator, "predict_interval"):
            intervals = self.estimator.predict_interval(X)
        return self.verdict(p, intervals)

    def verdict(
        self, p: FloatArray, intervals: tuple[FloatArray, FloatArray] | None = None
    ) -> Scored:
        """Confidence, its interval and abstain flag of the hits actually returned.

        Search calls this again after ``min_probability``/``target_precision`` cut
        the list, so the confidence is always that of what the user receives.

        On day one (a shipped default) the confidence is the best hit's probability
        (the coherent confidence at weight 0, the least P(any relevant) can be): how
        much the other hits add depends on how relevance is spread in the collection,
        which its judgments tell, not the prior. Held out, a blend ranked queries
        worse than the best hit alone on sparse sets (``benchmarks/day_one.py``). The
        upper end of the interval keeps the fitted weight: the hits may add that much.
        """
        weight = 0.0 if self.day_one_threshold is not None else self.confidence_weight
        confidence = coherent_confidence(p, weight)
        if intervals is None:
            return Scored(p, confidence, self.abstains(confidence))
        band = (
            coherent_confidence(intervals[0], weight),
            coherent_confidence(intervals[1], self.confidence_weight),
        )
        return Scored(
            p, confidence, self.abstains(confidence, band[1]), intervals, band
        )

    def abstains(self, confidence: float, upper: float | None = None) -> bool:
        """Abstain below the certified threshold, else by the conservative rules.

        On day one, below :attr:`day_one_threshold`. Otherwise, without a threshold
        certified on this collection's judgments, abstain only when even the upper
        end of the confidence interval (``upper``, else the confidence) is below
        :data:`FALLBACK_ABSTAIN_THRESHOLD`. Neither claims a rate.
        """
        policy = self.certified_policy
        if policy is not None:
            return confidence < policy.threshold
        day_one = self.day_one_threshold
        if day_one is not None:
            return confidence < day_one
        return (confidence if upper is None else upper) < FALLBACK_ABSTAIN_THRESHOLD

    # -- persistence ------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (``calibration.io`` for the fitted objects)."""
        return {
            "format": PROFILE_FORMAT,
            "id": self.id,
            "method": self.method,
            "model": self.model,
            "model_id": self.model_id,
            "created_at": self.created_at,
            "default": self.default,
            "confidence_weight": self.confidence_weight,
            "query_ref": to_dict(self.query_ref),
            "doc_ref": to_dict(self.doc_ref),
            "estimator": to_dict(self.estimator),
            "query_model": None
            if self.query_model is None
            else to_dict(self.query_model),
            "abstain_policy": (
                None if self.abstain_policy is None else to_dict(self.abstain_policy)
            ),
            "report": to_dict(self.report),
        }

    @classmethod
    def from_json(cls, data: Any) -> Profile:
        """Inverse of :meth:`to_json`; reads the untyped reports of older profiles.

        The document is decoded by its schema: every top-level field is typed and
        bounded, the fitted objects decode through :func:`calibration.io.from_dict`
        sharing one :class:`~calibration.io.DecodeBudget`, and each must be of the
        class its slot holds. It does not score anything: :func:`trial_scores` does.

        Raises
        ------
        UnsupportedFormatError
            Anything else; ``field`` names the offending value.
        """
        if not isinstance(data, dict):
            raise _bad("", "a calibration profile must be a JSON object")
        version = data.get("format")
        if type(version) is not int or version not in _READABLE_FORMATS:
            raise UnsupportedFormatError(
                f"format: calibration profile format {version!r} is not supported "
                f"(this version reads {', '.join(map(str, _READABLE_FORMATS))})",
                field="format",
            )
        budget = DecodeBudget()
        for key in ("query_model", "abstain_policy"):
            if key not in data:
                raise _bad(key, "missing")
        # A query-level model (formats 1/2) was served and certified on; no longer.
        old_model = data["query_model"] is not None
        return cls(
            id=_text(data, "id"),
            method=_text(data, "method"),
            model=_text(data, "model"),
            model_id=_text(data, "model_id", optional=True),
            query_ref=_object(data, "query_ref", NormReference, budget),
            doc_ref=_object(data, "doc_ref", NormReference, budget),
            estimator=_object(data, "estimator", _SERVED_ESTIMATORS, budget),
            query_model=_object(
                data, "query_model", QueryConfidenceModel, budget, optional=True
            ),
            abstain_policy=_object(
                data, "abstain_policy", AbstainPolicy, budget, optional=True
            ),
            report=_load_report(data.get("report"), budget),
            created_at=_number(data, "created_at", 0.0, MAX_CREATED_AT),
            default=_flag(data, "default"),
            confidence_weight=_number(data, "confidence_weight", 0.0, 1.0, 1.0),
            policy_matches_served=not old_model,
        )


# -- the profile schema (format 1-3) ---------------------------------------------------
MAX_NAME_CHARS = 256
"""Characters of a profile's ``id``, ``method``, ``model`` and ``model_id``."""
MAX_CREATED_AT = 32_503_680_000.0
"""Latest ``created_at`` (seconds since the epoch): the year 3000."""
_SERVED_ESTIMATORS = (
    PlattCalibrator,
    IsotonicCalibrator,
    NormTemperedCalibrator,
    ListAwareCalibrator,
    PriorCalibrator,
    Recalibrated,
)


def _unwrapped(estimator: Any) -> Any:
    """The calibrator family under a recalibration stage (the estimator without one)."""
    return estimator.base if isinstance(estimator, Recalibrated) else estimator


def _bad(field_: str, rule: str) -> UnsupportedFormatError:
    where = field_ or "profile"
    return UnsupportedFormatError(f"{where}: {rule}", field=field_ or None)


def _text(data: dict[str, Any], key: str, *, optional: bool = False) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise _bad(key, f"must be a string of 1 to {MAX_NAME_CHARS} characters")
    return value


def _number(
    data: dict[str, Any],
    key: str,
    low: float,
    high: float,
    default: float | None = None,
) -> float:
    value = data.get(key, default)
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not low <= value <= high
    ):
        raise _bad(key, f"must be a number in [{low:g}, {high:g}]")
    return float(value)


def _flag(data: dict[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise _bad(key, "must be true or false")
    return value


def _object(
    data: dict[str, Any],
    key: str,
    kind: type[Any] | tuple[type[Any], ...],
    budget: DecodeBudget,
    *,
    optional: bool = False,
) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    obj = from_dict(value, budget=budget, path=key)
    if not isinstance(obj, kind):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        raise _bad(f"{key}.class", f"must be {' or '.join(k.__name__ for k in kinds)}")
    return obj


# -- the trial: scoring a grid over the feature space ----------------------------------
TRIAL_COSINES = 201
"""Cosines of the fine sweep over [-1, 1] (every other context uses 21)."""
TRIAL_LIST_RANK = 10_000.0
"""The deepest ``in_rank`` the trial scores (a rerank list is at most this long)."""


def trial_scores(profile: Profile, *, max_rank: int) -> None:
    """Score a grid over the feature space; every probability must be in [0, 1].

    The grid crosses cosines in [-1, 1] (a fine sweep, plus the knots of a map that
    has them) with every corner of the other features: the clipped norm features of
    both references, ranks 1 and ``max_rank``, gaps 0 and 2, the clipped lengths,
    lexical evidence absent (0, 0, beyond the BM25 list) and present at its extremes,
    list positions 1 and :data:`TRIAL_LIST_RANK` and relative score gaps 0 and 1.
    It also scores whole hit lists end to end (:meth:`Profile.score`) for extreme
    norms and token counts, with and without BM25 evidence. A profile that stored a
    broken map would otherwise break every later search that reaches the bad region.

    Raises
    ------
    UnsupportedFormatError
        ``field`` is the part that failed (``estimator``, ``query_ref``, ``doc_ref``
        or ``confidence_weight``); no exception text is passed on.
    """
    with np.errstate(all="ignore"):
        _trial_references(profile)
        _trial_grid(profile, max_rank)
        _trial_lists(profile, max_rank)


def _finite_unit(values: Any) -> bool:
    a = np.asarray(values, dtype=np.float64)
    return bool(np.all(np.isfinite(a)) and np.all((a >= 0.0) & (a <= 1.0)))


def _trial_references(profile: Profile) -> None:
    norms = np.array([1e-3, 0.1, 1.0, 10.0, 1e3])
    tokens = np.array([1, 8, 64, 512, 100_000])
    for key in ("query_ref", "doc_ref"):
        ref = getattr(profile, key)
        try:
            ell = np.asarray(ref.transform(norms, tokens), dtype=np.float64)
            length = np.asarray(ref.length_feature(tokens), dtype=np.float64)
            ok = bool(np.all(np.isfinite(ell)) and np.all(np.isfinite(length)))
        except Exception:  # an untrusted payload may fail in any way
            ok = False
        if not ok:
            raise _bad(key, "does not give finite features for norms and lengths")


def _clip(ref: NormReference, name: str) -> float:
    value = float(getattr(ref, name))
    return value if math.isfinite(value) else 0.0


def _trial_grid(profile: Profile, max_rank: int) -> None:
    q, d = profile.query_ref, profile.doc_ref
    corners = [
        (-_clip(q, "clip"), _clip(q, "clip")),  # ell_q
        (-_clip(d, "clip"), _clip(d, "clip")),  # ell_d
        (1.0, float(max_rank)),  # rank
        (0.0, 2.0),  # gap
        (-_clip(q, "length_clip"), _clip(q, "length_clip")),  # len_q
        (-_clip(d, "length_clip"), _clip(d, "length_clip")),  # len_d
        (0.0, 3.0),  # lex
        (0.0, 1.0),  # lex_rel
        (1.0, float(LEXICAL_DEPTH + 1)),  # lex_rank
        (1.0, TRIAL_LIST_RANK),  # in_rank
        (0.0, 1.0),  # in_gap
    ]
    contexts = np.array(list(itertools.product(*corners)), dtype=np.float64)
    centre = np.array(
        [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, LEXICAL_DEPTH + 1.0, 1.0, 0.0]
    )
    fine = np.linspace(-1.0, 1.0, TRIAL_COSINES)
    knots = getattr(_unwrapped(profile.estimator), "x_thresholds_", None)
    if isinstance(knots, np.ndarray) and knots.ndim == 1 and knots.size:
        inner = knots[(knots >= -1.0) & (knots <= 1.0)]
        fine = np.concatenate([fine, inner, (inner[1:] + inner[:-1]) / 2])
    coarse = np.linspace(-1.0, 1.0, 21)
    X = np.vstack(
        [
            np.column_stack([fine, np.tile(centre, (len(fine), 1))]),
            np.column_stack(
                [
                    np.tile(coarse, len(contexts)),
                    np.repeat(contexts, len(coarse), axis=0),
                ]
            ),
        ]
    )
    try:
        ok = _finite_unit(profile.estimator.predict_proba(X))
        if ok and hasattr(profile.estimator, "predict_interval"):
            lo, hi = profile.estimator.predict_interval(X)
            ok = _finite_unit(lo) and _finite_unit(hi)
        bool(profile.reorders_hits)
    except Exception:  # an untrusted payload may fail in any way
        ok = False
    if not ok:
        raise _bad(
            "estimator",
            "must give finite probabilities in [0, 1] over the trial grid "
            "(cosine in [-1, 1], ranks, lengths, BM25 present and absent)",
        )


def _trial_lists(profile: Profile, max_rank: int) -> None:
    for k in sorted({1, 5, max_rank}):
        scores = np.linspace(1.0, -1.0, k)
        ranks = np.arange(1, k + 1, dtype=np.float64)
        lexical = LexicalEvidence(
            bm25=np.linspace(20.0, 0.0, k), rank=ranks, idf_mass=10.0, top=20.0
        )
        for norm, n_tokens in ((1.0, 8), (1e-3, 1), (1e3, 100_000)):
            for lex in (None, lexical):
                try:
                    scored = profile.score(
                        norm,
                        n_tokens,
                        scores,
                        np.full(k, norm),
                        np.full(k, n_tokens, dtype=np.int64),
                        lex,
                    )
                    ok = _finite_unit(scored.probabilities) and _finite_unit(
                        scored.confidence
                    )
                    if ok and scored.intervals is not None:
                        ok = _finite_unit(scored.intervals[0]) and _finite_unit(
                            scored.intervals[1]
                        )
                except Exception:  # an untrusted payload may fail in any way
                    ok = False
                if not ok:
                    raise _bad(
                        "estimator",
                        "must give finite probabilities and confidence in [0, 1] "
                        "for whole hit lists",
                    )


def single_threaded_blas() -> threadpool_limits:
    """Limit BLAS to one thread for a fit.

    A fit is many tiny L-BFGS problems: multi-threaded BLAS only adds contention
    (measured 10x slower on a busy 2-core machine).
    """
    return threadpool_limits(limits=1, user_api="blas")


def fit_profile(
    evidence: Sequence[QueryEvidence],
    *,
    doc_norms: FloatArray,
    doc_tokens: NDArray[np.int64],
    model: str,
    model_id: str | None = None,
    method: str = "auto",
    allow_reorder: bool = False,
    abstain_target: float | None = 0.1,
    abstain_delta: float = 0.1,
    n_splits: int = 5,
    profile_id: str | None = None,
    extra_report: dict[str, Any] | None = None,
    prior: CrossDomainPrior | None = None,
) -> Profile:
    """Fit a profile from judged retrieval results.

    Parameters
    ----------
    evidence : sequence of QueryEvidence
        One per judged query, with ``labels``.
    doc_norms, doc_tokens : ndarray
        Unlabelled sample of the collection's documents, for the document-side
        :class:`~calibration.NormReference`. The query side is fitted on the judged
        queries themselves.
    model : str
        Embedding model name (profiles are per model, theory.md §4.8).
    model_id : str or None
        Identity of the model's files, recorded so the profile is applied to (and
        imported for) that model only.
    method : {"auto", "platt", "isotonic", "nt", "nt-list"}
        Calibrator family; ``auto`` keeps the best grouped-CV NLL.
    allow_reorder : bool
        Allow document-side terms, which can reorder a query's hits.
    abstain_target : float or None
        Tolerated fraction of answered queries without a relevant hit; ``None``
        skips the certified threshold.
    abstain_delta : float
        Probability that the abstain guarantee fails.
    n_splits : int
        Grouped CV folds.
    prior : CrossDomainPrior or None
        The shipped cross-domain prior: adds the few-label ``prior`` family to the
        selection (:func:`~calibration.selection.select_calibrator`).

    Raises
    ------
    calibration.CalibrationError
        Too few queries, single-class labels, bad values (HTTP 422).
    """
    query_ref = query_reference(evidence)
    doc_ref = NormReference().fit(doc_norms, doc_tokens)
    X, groups = build_features(evidence, query_ref, doc_ref)
    y = labels_of(evidence)
    started = time.perf_counter()
    with single_threaded_blas():
        selection = select_calibrator(
            X,
            y,
            groups,
            method=method,
            n_splits=n_splits,
            query_side_only=not allow_reorder,
            prior=prior,
        )
        weight, policy, query_report = _fit_query_level(
            selection, X, y, groups, abstain_target, abstain_delta
        )
    report = FitReport(
        requested_method=method,
        allow_reorder=allow_reorder,
        n_queries=selection.n_queries,
        n_pairs=selection.n_pairs,
        n_positive=int(y.sum()),
        n_splits=n_splits,
        k=int(max(len(e.scores) for e in evidence)),
        uses_norms=selection.uses_norms,
        cv=dict(selection.cv),
        norm_lift=selection.norm_lift,
        reliability=selection.reliability,
        reliability_by_norm_tercile=to_jsonable(
            reliability_by_tercile(y, selection.oof_proba, X[:, ELL_Q])
        ),
        query_level=query_report,
        abstain=policy,
        query_unit_norm=bool(query_ref.unit_norm_),
        doc_unit_norm=bool(doc_ref.unit_norm_),
        notes=tuple(selection.notes),
        fit_seconds=time.perf_counter() - started,
        evidence_lift=selection.evidence_lift,
        selection=selection.why,
        drift_reference=drift_reference(evidence, X, groups, y, selection.estimator),
        extra=dict(extra_report or {}),
    )
    return Profile(
        id=profile_id or uuid.uuid4().hex[:12],
        method=selection.method,
        model=model,
        model_id=model_id,
        query_ref=query_ref,
        doc_ref=doc_ref,
        estimator=selection.estimator,
        query_model=None,
        abstain_policy=policy,
        report=report,
        confidence_weight=weight,
    )


def drift_reference(
    evidence: Sequence[QueryEvidence],
    X: FloatArray,
    groups: NDArray[np.int64],
    y: FloatArray,
    estimator: Any,
) -> DriftReference:
    """The judged queries summarised as search summarises served ones.

    ``X``, ``groups`` and ``y`` are :func:`build_features`' and :func:`labels_of`'
    (one query's rows together, in its hits' order); the probabilities are the fitted
    ``estimator``'s, the map served queries get.
    """
    p = estimator.predict_proba(X)
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    summaries, top_relevant = [], []
    for rows in np.split(np.arange(len(groups)), starts[1:]):
        e = evidence[int(groups[rows[0]])]
        summaries.append(query_summary(e.scores, e.n_tokens, e.lexical, p[rows]))
        top_relevant.append(y[rows][int(np.argmax(e.scores))] > 0)
    return reference_from(np.array(summaries), np.array(top_relevant))


def prior_profile(
    prior: CrossDomainPrior,
    *,
    query_ref: NormReference,
    doc_ref: NormReference,
    model: str,
    model_id: str | None = None,
    held_out: tuple[FloatArray, FloatArray, NDArray[np.int64]],
    norm_lift: NormLift,
    profile_id: str,
    extra_report: dict[str, Any] | None = None,
) -> Profile:
    """The shipped default: the cross-domain prior at zero judged queries.

    ``held_out`` is ``(y, p, groups)`` pooled over the training sets, each ``p`` from
    a prior fitted *without* that set (leave-one-dataset-out), so the report's figures
    are what a new domain can expect. The weight of the coherent confidence is fitted
    on those held-out probabilities. No abstain threshold is certified: without
    judgments from a collection its level is unknown.
    """
    y, p, groups = held_out
    _, hit, _ = query_table(p, groups, None, y)
    assert hit is not None
    weight = fit_confidence_weight(p, groups, hit)
    scores = MethodScores("prior", *_pair_scores(y, p))
    n_q = int(np.unique(groups).shape[0])
    report = FitReport(
        requested_method="prior",
        allow_reorder=False,
        n_queries=n_q,
        n_pairs=len(y),
        n_positive=int(y.sum()),
        n_splits=prior.n_domains,
        k=int(np.bincount(np.unique(groups, return_inverse=True)[1]).max()),
        uses_norms=bool(set(prior.features) & {"ell_q", "ell_d"}),
        cv={"prior": scores},
        norm_lift=norm_lift,
        reliability=BINNING.curve(y, p),
        reliability_by_norm_tercile={},
        query_level=QueryLevelReport(
            n_queries=n_q,
            with_relevant_in_top_k=int(hit.sum()),
            confidence=f"coherent confidence of the hit probabilities (weight {weight:.3f})",
            auroc=None,
        ),
        abstain=None,
        query_unit_norm=bool(query_ref.unit_norm_),
        doc_unit_norm=bool(doc_ref.unit_norm_),
        notes=(
            "Cross-domain prior over "
            f"{', '.join(prior.domains)} (each set weighted equally); figures are "
            "leave-one-dataset-out.",
        ),
        extra=dict(extra_report or {}),
    )
    return Profile(
        id=profile_id,
        method="prior",
        model=model,
        model_id=model_id,
        query_ref=query_ref,
        doc_ref=doc_ref,
        estimator=PriorCalibrator.at_prior(prior),
        query_model=None,
        abstain_policy=None,
        report=report,
        default=True,
        confidence_weight=weight,
    )


def _pair_scores(y: FloatArray, p: FloatArray) -> tuple[float, float, float, float]:
    return (
        negative_log_likelihood(y, p),
        brier_score(y, p),
        BINNING.ece(y, p),
        auroc(y, p),
    )


def query_reference(evidence: Sequence[QueryEvidence]) -> NormReference:
    """The query-side norm reference, fitted on the judged queries themselves."""
    return NormReference().fit(
        np.array([e.norm for e in evidence]), np.array([e.n_tokens for e in evidence])
    )


def labels_of(evidence: Sequence[QueryEvidence]) -> FloatArray:
    """Pair labels in :func:`build_features` row order.

    Raises
    ------
    ValueError
        Some evidence is unlabelled (fitting and evaluation need labels).
    """
    labels = [e.labels for e in evidence if len(e.scores)]
    if any(y is None for y in labels):
        raise ValueError("fitting needs labelled evidence")
    return np.concatenate([y for y in labels if y is not None])


def query_model_is_supported(hit: FloatArray, n_splits: int) -> bool:
    """Whether enough queries of each outcome back a query-level model.

    ``hit`` is 1.0 per query with a relevant hit in the top k. Below
    :data:`MIN_QUERIES_PER_OUTCOME` (or ``n_splits``) queries of either outcome, the
    noisy-OR of the hit probabilities serves confidence instead.
    """
    n_hit = int(hit.sum())
    return min(n_hit, len(hit) - n_hit) >= max(MIN_QUERIES_PER_OUTCOME, n_splits)


def _load_report(data: Any, budget: DecodeBudget) -> FitReport:
    """A stored report: versioned (``calibration.io``) or the untyped dict of format 1."""
    if not isinstance(data, dict):
        raise _bad("report", "must be a JSON object")
    if "format_version" in data:
        report = from_dict(data, budget=budget, path="report")
        if not isinstance(report, FitReport):
            raise _bad("report.class", "must be FitReport")
        return report
    try:
        report = FitReport.from_jsonable(data)
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
        raise _bad("report", "not a readable untyped (format 1) report") from exc
    check_dataclass(report, "report")
    return report


def _fit_query_level(
    selection: SelectionResult,
    X: FloatArray,
    y: FloatArray,
    groups: NDArray[np.int64],
    abstain_target: float | None,
    abstain_delta: float,
) -> tuple[float, AbstainPolicy | None, QueryLevelReport]:
    """Weight of the coherent confidence and the abstain policy, both held out.

    The weight is fitted on out-of-fold hit probabilities, and the policy certified on
    the coherent confidences of those same probabilities: exactly what
    :meth:`Profile.score` serves (a query-level model could not keep the bounds).
    """
    _, hit, _ = query_table(selection.oof_proba, groups, X[:, ELL_Q], y)
    assert hit is not None
    n_hit = int(hit.sum())
    weight = fit_confidence_weight(selection.oof_proba, groups, hit)
    held_out = np.array(
        [
            coherent_confidence(selection.oof_proba[groups == q], weight)
            for q in np.unique(groups)
        ]
    )
    report = QueryLevelReport(
        n_queries=len(hit),
        with_relevant_in_top_k=n_hit,
        confidence=f"coherent confidence of the hit probabilities (weight {weight:.3f})",
        auroc=auroc(hit, held_out) if 0 < n_hit < len(hit) else None,
    )
    policy = None
    if abstain_target is not None:
        policy = fit_abstain_policy(
            held_out, hit, target_risk=abstain_target, delta=abstain_delta
        )
    return weight, policy, report
