"""Versioned JSON persistence of fitted objects (never pickle).

A payload is strict JSON (no NaN/Infinity literals)::

    {"format_version": 1, "class": "NormTemperedCalibrator",
     "params": {...get_params()...}, "state": {"coef_": {"__ndarray__": [...],
     "dtype": "float64", "shape": [6]}, ...}}

Dataclasses (``AbstainPolicy``, ``SelectionResult``, ``FitReport``) store ``"fields"`` instead of
params/state. Floats are written with ``repr`` precision, so a round trip restores
every array bit for bit and ``predict_proba`` is identical. Non-finite floats are
encoded as ``{"__float__": "nan" | "inf" | "-inf"}``. ``SelectionResult`` keeps its
essentials (estimator, choice, metrics, norm lift, reliability curve, notes); the
out-of-fold probabilities are not stored and load as an empty array.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np

from calibration.exceptions import FORMAT_VERSION, UnsupportedFormatError
from calibration.features import NormReference
from calibration.metrics import ReliabilityCurve
from calibration.models import (
    LEXICAL_PARAMS,
    LIST_PARAMS,
    NT_PARAMS,
    IsotonicCalibrator,
    ListAwareCalibrator,
    NormTemperedCalibrator,
    PlattCalibrator,
)
from calibration.prior import PriorCalibrator
from calibration.query import AbstainPolicy, QueryConfidenceModel
from calibration.report import FitReport, QueryLevelReport
from calibration.selection import GroupLift, MethodScores, NormLift, SelectionResult

__all__ = ["FORMAT_VERSION", "dumps", "from_dict", "loads", "to_dict"]


_NT_STATE = (
    *(f"{n}_" for n in NT_PARAMS),
    *(f"{n}_sd_" for n in NT_PARAMS),
    "coef_",
    "covariance_",
    "prior_mean_",
    "prior_sd_",
    "free_",
    "regime_",
    "probe_rho_",
    "prior_width_",
    "n_queries_",
    "platt_a_",
    "platt_b_",
    "converged_",
    "n_features_in_",
)
_ESTIMATORS: dict[str, tuple[type[Any], tuple[str, ...]]] = {
    "PlattCalibrator": (
        PlattCalibrator,
        ("a_", "b_", "a_sd_", "b_sd_", "converged_", "n_features_in_"),
    ),
    "IsotonicCalibrator": (
        IsotonicCalibrator,
        ("x_thresholds_", "y_thresholds_", "n_features_in_"),
    ),
    "NormTemperedCalibrator": (NormTemperedCalibrator, _NT_STATE),
    "ListAwareCalibrator": (
        ListAwareCalibrator,
        (
            *_NT_STATE,
            *(f"{n}_" for n in LIST_PARAMS),
            *(f"{n}_sd_" for n in LIST_PARAMS),
        ),
    ),
    "NormReference": (
        NormReference,
        (
            "unit_norm_",
            "intercept_",
            "slope_",
            "residual_sd_",
            "log_len_median_",
            "n_samples_",
        ),
    ),
    "PriorCalibrator": (
        PriorCalibrator,
        ("coef_", "covariance_", "level_sd_", "n_queries_", "n_features_in_"),
    ),
    "QueryConfidenceModel": (
        QueryConfidenceModel,
        ("coef_", "intercept_", "n_features_in_"),
    ),
}
# State that only some estimators of a class have: the lexical shifts of a list model
# fitted with ``use_lexical=True`` (payloads written before they existed lack them).
_OPTIONAL_STATE: dict[str, tuple[str, ...]] = {
    "ListAwareCalibrator": (
        *(f"{n}_" for n in LEXICAL_PARAMS),
        *(f"{n}_sd_" for n in LEXICAL_PARAMS),
    ),
}
_DATACLASSES: dict[str, type[Any]] = {
    "AbstainPolicy": AbstainPolicy,
    "SelectionResult": SelectionResult,
    "MethodScores": MethodScores,
    "NormLift": NormLift,
    "GroupLift": GroupLift,
    "ReliabilityCurve": ReliabilityCurve,
    "FitReport": FitReport,
    "QueryLevelReport": QueryLevelReport,
}


def _enc(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        flat = [_enc_scalar(v) for v in value.ravel().tolist()]
        return {"__ndarray__": flat, "dtype": str(value.dtype), "shape": value.shape}
    if dataclasses.is_dataclass(value) or type(value).__name__ in _ESTIMATORS:
        return to_dict(value)
    if isinstance(value, dict):
        return {"__dict__": [[_enc(k), _enc(v)] for k, v in value.items()]}
    if isinstance(value, tuple | list):
        return {"__tuple__": [_enc(v) for v in value]}
    if isinstance(value, np.generic):
        return _enc_scalar(value.item())
    return _enc_scalar(value)


def _enc_scalar(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return {"__float__": repr(v)}
    return v


def _dec(value: Any) -> Any:
    if isinstance(value, dict):
        if "__ndarray__" in value:
            flat = [_dec(v) for v in value["__ndarray__"]]
            return np.asarray(flat, dtype=np.dtype(value["dtype"])).reshape(
                tuple(value["shape"])
            )
        if "__float__" in value:
            return float(value["__float__"])
        if "__dict__" in value:
            return {_dec(k): _dec(v) for k, v in value["__dict__"]}
        if "__tuple__" in value:
            return tuple(_dec(v) for v in value["__tuple__"])
        if "format_version" in value:
            return from_dict(value)
        raise UnsupportedFormatError("Unrecognised object in payload.")
    return value


def to_dict(obj: Any) -> dict[str, Any]:
    """Return a JSON-ready dict of a fitted object.

    Parameters
    ----------
    obj : calibrator, NormReference, QueryConfidenceModel or a report dataclass
        Fitted object.

    Returns
    -------
    dict
        Payload with ``format_version`` and ``class``.

    Raises
    ------
    UnsupportedFormatError
        If the class is not persistable.
    NotFittedCalibratorError
        If an estimator is not fitted.
    """
    name = type(obj).__name__
    if name in _ESTIMATORS:
        cls, attrs = _ESTIMATORS[name]
        if not isinstance(obj, cls):
            raise UnsupportedFormatError(f"Cannot persist {name}.", class_name=name)
        missing = [a for a in attrs if not hasattr(obj, a)]
        if missing:
            from calibration.exceptions import NotFittedCalibratorError

            raise NotFittedCalibratorError(
                f"This {name} is not fitted; cannot save it."
            )
        return {
            "format_version": FORMAT_VERSION,
            "class": name,
            "params": {k: _enc(v) for k, v in obj.get_params(deep=False).items()},
            "state": {
                a: _enc(getattr(obj, a))
                for a in (*attrs, *_OPTIONAL_STATE.get(name, ()))
                if hasattr(obj, a)
            },
        }
    if name in _DATACLASSES and dataclasses.is_dataclass(obj):
        fields: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            if name == "SelectionResult" and f.name == "oof_proba":
                continue
            fields[f.name] = _enc(getattr(obj, f.name))
        return {"format_version": FORMAT_VERSION, "class": name, "fields": fields}
    raise UnsupportedFormatError(
        f"Objects of type {name} cannot be persisted.", class_name=name
    )


def from_dict(data: Any) -> Any:
    """Rebuild an object from :func:`to_dict` output.

    Parameters
    ----------
    data : dict
        Payload.

    Returns
    -------
    object
        The fitted object.

    Raises
    ------
    UnsupportedFormatError
        Unknown ``format_version`` or class, or a malformed payload.
    """
    if not isinstance(data, dict):
        raise UnsupportedFormatError("A calibration payload must be a JSON object.")
    version = data.get("format_version")
    name = data.get("class")
    if version != FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"Unsupported format_version {version!r}; this version reads "
            f"{FORMAT_VERSION}.",
            format_version=version,
            class_name=name,
        )
    try:
        if name in _ESTIMATORS:
            cls, attrs = _ESTIMATORS[str(name)]
            params = {k: _dec(v) for k, v in data["params"].items()}
            obj = cls(**params)
            state = data["state"]
            for a in attrs:
                setattr(obj, a, _dec(state[a]))
            for a in _OPTIONAL_STATE.get(str(name), ()):
                if a in state:
                    setattr(obj, a, _dec(state[a]))
            return obj
        if name in _DATACLASSES:
            cls = _DATACLASSES[str(name)]
            fields = {k: _dec(v) for k, v in data["fields"].items()}
            if name == "SelectionResult":
                fields["oof_proba"] = np.empty(0)
            return cls(**fields)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, UnsupportedFormatError):
            raise
        raise UnsupportedFormatError(
            f"Malformed {name} payload: {exc}", format_version=version, class_name=name
        ) from exc
    raise UnsupportedFormatError(
        f"Unknown class {name!r} in payload.", format_version=version, class_name=name
    )


def dumps(obj: Any, *, indent: int | None = None) -> str:
    """Serialise a fitted object to strict JSON text.

    Parameters
    ----------
    obj : object
        See :func:`to_dict`.
    indent : int or None, default=None
        Passed to :func:`json.dumps`.

    Returns
    -------
    str
        JSON text.
    """
    return json.dumps(to_dict(obj), indent=indent, allow_nan=False)


def loads(text: str | bytes) -> Any:
    """Load an object written by :func:`dumps`.

    Parameters
    ----------
    text : str or bytes
        JSON text.

    Returns
    -------
    object
        The fitted object.

    Raises
    ------
    UnsupportedFormatError
        Invalid JSON, unknown version or class.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UnsupportedFormatError(f"Not valid JSON: {exc.msg}.") from exc
    return from_dict(data)
