"""normcal calibration maths: retrieval evidence to P(relevant).

Pure numpy / scipy / scikit-learn; importing this package never imports fastapi, torch
or faiss. Modules: :mod:`~calibration.features` (NormReference, pair features, sign
probe), :mod:`~calibration.models` (Platt, isotonic, NT, NT-list),
:mod:`~calibration.selection` (grouped CV, method choice, norm lift),
:mod:`~calibration.query` (query confidence, risk-controlled abstention),
:mod:`~calibration.prior` (cross-domain prior, few-label fit, coherent confidence),
:mod:`~calibration.metrics`, :mod:`~calibration.io` (versioned JSON) and
:mod:`~calibration.exceptions`.
"""

from __future__ import annotations

from calibration.exceptions import (
    CalibrationError,
    CalibrationFitError,
    ConvergenceError,
    InsufficientDataError,
    InvalidInputError,
    NotFittedCalibratorError,
    SingleClassError,
    UnsupportedFormatError,
)
from calibration.features import (
    FEATURES,
    ListFeatures,
    NormReference,
    list_features,
    pair_features,
    regime_from_rho,
    sign_probe,
    stack_pair_features,
)
from calibration.io import FORMAT_VERSION, dumps, from_dict, loads, to_dict
from calibration.metrics import (
    ReliabilityCurve,
    TercileReliability,
    auroc,
    brier_score,
    expected_calibration_error,
    negative_log_likelihood,
    reliability_by_tercile,
    reliability_curve,
)
from calibration.models import (
    IsotonicCalibrator,
    ListAwareCalibrator,
    NormTemperedCalibrator,
    PlattCalibrator,
    nt_prior,
)
from calibration.prior import (
    NORM_FEATURES,
    PRIOR_FEATURES,
    CrossDomainPrior,
    NormVerdict,
    PriorCalibrator,
    coherent_confidence,
    fit_confidence_weight,
    fit_prior,
    interval_coverage,
    norm_lift_verdict,
)
from calibration.query import (
    QUERY_FEATURES,
    AbstainPolicy,
    QueryConfidenceModel,
    cross_fit_query_confidence,
    fit_abstain_policy,
    query_features,
    query_table,
)
from calibration.selection import (
    METHODS,
    MethodScores,
    NormLift,
    SelectionResult,
    cross_val_predict_grouped,
    make_calibrator,
    select_calibrator,
)
from calibration.simulate import SimulatedJudgments, simulate_judgments

__all__ = [
    "FEATURES",
    "FORMAT_VERSION",
    "METHODS",
    "NORM_FEATURES",
    "PRIOR_FEATURES",
    "QUERY_FEATURES",
    "AbstainPolicy",
    "CalibrationError",
    "CalibrationFitError",
    "ConvergenceError",
    "CrossDomainPrior",
    "InsufficientDataError",
    "InvalidInputError",
    "IsotonicCalibrator",
    "ListAwareCalibrator",
    "ListFeatures",
    "MethodScores",
    "NormLift",
    "NormReference",
    "NormTemperedCalibrator",
    "NormVerdict",
    "NotFittedCalibratorError",
    "PlattCalibrator",
    "PriorCalibrator",
    "QueryConfidenceModel",
    "ReliabilityCurve",
    "SelectionResult",
    "SimulatedJudgments",
    "SingleClassError",
    "TercileReliability",
    "UnsupportedFormatError",
    "auroc",
    "brier_score",
    "coherent_confidence",
    "cross_fit_query_confidence",
    "cross_val_predict_grouped",
    "dumps",
    "expected_calibration_error",
    "fit_abstain_policy",
    "fit_confidence_weight",
    "fit_prior",
    "from_dict",
    "interval_coverage",
    "list_features",
    "loads",
    "make_calibrator",
    "negative_log_likelihood",
    "norm_lift_verdict",
    "nt_prior",
    "pair_features",
    "query_features",
    "query_table",
    "regime_from_rho",
    "reliability_by_tercile",
    "reliability_curve",
    "select_calibrator",
    "sign_probe",
    "simulate_judgments",
    "stack_pair_features",
    "to_dict",
]
