"""The typed fit report of a calibration profile, and its JSON forms.

A :class:`FitReport` says what a fit saw and decided: data sizes, every method's
grouped-CV scores, why the served method was chosen, the norm lift, the lift of each
evidence group, the reliability curve, the query-level model and the abstain
guarantee. It is stored through
:mod:`calibration.io` (versioned, like the fitted objects);
:meth:`FitReport.to_jsonable` gives the plain JSON dict shown to users (``report`` of
the calibrator endpoints), and :meth:`FitReport.from_jsonable` reads that dict back,
which is also how profiles stored before the report was typed load.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calibration.drift import DriftReference, FeatureReference
from calibration.metrics import ReliabilityCurve
from calibration.query import AbstainPolicy
from calibration.selection import (
    GroupLift,
    MethodScores,
    NormLift,
    SelectionRule,
    SelectionWhy,
)

__all__ = ["FitReport", "QueryLevelReport", "to_jsonable"]


@dataclass(frozen=True)
class QueryLevelReport:
    """How query confidence is computed, and how well it separated held-out queries.

    Attributes
    ----------
    n_queries, with_relevant_in_top_k : int
        Judged queries, and those with a relevant hit in the top k.
    confidence : str
        Which model serves confidence (user-readable).
    auroc : float or None
        Held-out AUROC of confidence for "any relevant hit"; None if undefined.
    """

    n_queries: int
    with_relevant_in_top_k: int
    confidence: str
    auroc: float | None


@dataclass(frozen=True)
class FitReport:
    """What a fit saw and decided (module docstring).

    Attributes
    ----------
    requested_method : str
        Method asked for (``"auto"`` or a wire name).
    allow_reorder : bool
        Whether document-side terms were allowed.
    n_queries, n_pairs, n_positive, n_splits, k : int
        Data size, grouped-CV folds and retrieval depth.
    uses_norms : bool
        Whether the served model uses residual-norm terms.
    cv : dict
        ``{method: MethodScores}`` of every wire method.
    norm_lift : NormLift
        What the norm terms bought.
    reliability : ReliabilityCurve
        Out-of-fold reliability of the served method.
    reliability_by_norm_tercile : dict
        JSON form of :class:`~calibration.TercileReliability` of the served method.
    query_level : QueryLevelReport
        The query confidence model.
    abstain : AbstainPolicy or None
        The abstain policy (None if no target was asked).
    query_unit_norm, doc_unit_norm : bool
        Whether the query / document embeddings had unit norm.
    notes : tuple of str
        Decisions taken.
    fit_seconds : float
        Wall time of the fit.
    evidence_lift : tuple of GroupLift or None
        Lift of each evidence group (list, length, lexical, residual norm) along the
        ladder of :func:`~calibration.selection.evidence_lift`; None in reports
        stored before it existed (and then absent from the JSON form).
    selection : SelectionWhy or None
        Why the served method was chosen: the one-standard-error rule, the ECE guard
        and the recalibration stage, each with its outcome
        (:func:`~calibration.selection.select_calibrator`); None in reports stored
        before it existed and in the shipped default's (then absent from the JSON
        form).
    drift_reference : DriftReference or None
        The judged queries summarised for drift (:mod:`calibration.drift`); None for
        the shipped default (no judged queries of a collection) and in reports
        stored before it existed (then absent from the JSON form).
    extra : dict
        Caller's JSON-able additions (``collection``, ``source`` ...), shown at the
        top level of the JSON form.
    """

    requested_method: str
    allow_reorder: bool
    n_queries: int
    n_pairs: int
    n_positive: int
    n_splits: int
    k: int
    uses_norms: bool
    cv: dict[str, MethodScores]
    norm_lift: NormLift
    reliability: ReliabilityCurve
    reliability_by_norm_tercile: dict[str, Any]
    query_level: QueryLevelReport
    abstain: AbstainPolicy | None
    query_unit_norm: bool
    doc_unit_norm: bool
    notes: tuple[str, ...] = ()
    fit_seconds: float = 0.0
    evidence_lift: tuple[GroupLift, ...] | None = None
    selection: SelectionWhy | None = None
    drift_reference: DriftReference | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_jsonable(self) -> dict[str, Any]:
        """The plain JSON dict of the calibrator endpoints (NaN/inf to None)."""
        out: dict[str, Any] = {
            f.name: to_jsonable(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name not in _FLATTENED
            and not (f.name in _OPTIONAL and getattr(self, f.name) is None)
        }
        out["query_ref"] = {"unit_norm": self.query_unit_norm}
        out["doc_ref"] = {"unit_norm": self.doc_unit_norm}
        return {**out, **to_jsonable(self.extra)}

    @classmethod
    def from_jsonable(cls, data: dict[str, Any]) -> FitReport:
        """Inverse of :meth:`to_jsonable` (``None`` floats come back as NaN)."""
        known = {f.name for f in dataclasses.fields(cls)} | {"query_ref", "doc_ref"}
        lift = dict(data["norm_lift"])
        curve = data["reliability"]
        abstain = data.get("abstain")
        lifts = data.get("evidence_lift")
        why = data.get("selection")
        drift = data.get("drift_reference")
        return cls(
            requested_method=str(data["requested_method"]),
            allow_reorder=bool(data["allow_reorder"]),
            n_queries=int(data["n_queries"]),
            n_pairs=int(data["n_pairs"]),
            n_positive=int(data["n_positive"]),
            n_splits=int(data["n_splits"]),
            k=int(data["k"]),
            uses_norms=bool(data["uses_norms"]),
            cv={m: _scores(s) for m, s in data["cv"].items()},
            norm_lift=NormLift(
                **{
                    **_nan_for_none(lift),
                    "terms": {
                        n: (_f(v), _f(sd)) for n, (v, sd) in lift["terms"].items()
                    },
                    "variants": {k: _scores(s) for k, s in lift["variants"].items()},
                }
            ),
            reliability=ReliabilityCurve(
                mean_predicted=_array(curve["mean_predicted"]),
                observed_frequency=_array(curve["observed_frequency"]),
                counts=np.asarray(curve["counts"], dtype=np.int64),
                bin_edges=_array(curve["bin_edges"]),
                strategy=curve["strategy"],
            ),
            reliability_by_norm_tercile=dict(data["reliability_by_norm_tercile"]),
            query_level=QueryLevelReport(**data["query_level"]),
            abstain=None
            if abstain is None
            else AbstainPolicy(**_nan_for_none(abstain)),
            query_unit_norm=bool(data["query_ref"]["unit_norm"]),
            doc_unit_norm=bool(data["doc_ref"]["unit_norm"]),
            notes=tuple(data.get("notes", ())),
            fit_seconds=_f(data.get("fit_seconds")),
            evidence_lift=None
            if lifts is None
            else tuple(GroupLift(**_nan_for_none(g)) for g in lifts),
            selection=None if why is None else _why(why),
            drift_reference=None if drift is None else _drift_reference(drift),
            extra={k: v for k, v in data.items() if k not in known},
        )


_FLATTENED = ("query_unit_norm", "doc_unit_norm", "extra")
# Fields added after reports were first stored: absent from the JSON form when None.
_OPTIONAL = ("evidence_lift", "selection", "drift_reference")


def _drift_reference(data: dict[str, Any]) -> DriftReference:
    return DriftReference(
        n_queries=int(data["n_queries"]),
        features=tuple(
            FeatureReference(
                name=str(f["name"]),
                edges=_array(f["edges"]),
                counts=np.asarray(f["counts"], dtype=np.int64),
            )
            for f in data["features"]
        ),
        top_relevant=int(data["top_relevant"]),
    )


def _nan_for_none(data: dict[str, Any]) -> dict[str, Any]:
    """The JSON form writes non-finite floats as None; read them back as NaN."""
    return {k: math.nan if v is None else v for k, v in data.items()}


def _f(value: Any) -> float:
    return math.nan if value is None else float(value)


def _array(values: list[Any]) -> np.ndarray[Any, np.dtype[np.float64]]:
    return np.array([_f(v) for v in values], dtype=np.float64)


def _scores(data: dict[str, Any]) -> MethodScores:
    return MethodScores(
        method=str(data["method"]),
        nll=_f(data["nll"]),
        brier=_f(data["brier"]),
        ece=_f(data["ece"]),
        auroc=_f(data["auroc"]),
    )


def _why(data: dict[str, Any]) -> SelectionWhy:
    return SelectionWhy(
        chosen=str(data["chosen"]),
        recalibrated=bool(data["recalibrated"]),
        served=_scores(data["served"]),
        ece_noise_floor=_f(data["ece_noise_floor"]),
        rules=tuple(SelectionRule(**r) for r in data["rules"]),
        recalibrated_cv={
            m: _scores(s) for m, s in data.get("recalibrated_cv", {}).items()
        },
    )


def to_jsonable(value: Any) -> Any:
    """Dataclasses, arrays and numpy scalars to JSON values (NaN/inf to None)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_jsonable(getattr(value, f.name))
            for f in dataclasses.fields(value)
        }
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [to_jsonable(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
