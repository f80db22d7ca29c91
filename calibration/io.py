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
import types
import typing
from collections.abc import Callable
from typing import Any

import numpy as np

from calibration.drift import (
    DRIFT_FEATURES,
    MAX_BINS,
    DriftReference,
    FeatureReference,
)
from calibration.exceptions import FORMAT_VERSION, UnsupportedFormatError
from calibration.features import NormReference
from calibration.metrics import BINNING, ReliabilityCurve
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
from calibration.recalibration import RECAL_MAX_SHIFT, RECAL_MAX_SLOPE, Recalibrated
from calibration.report import FitReport, QueryLevelReport
from calibration.selection import (
    GroupLift,
    MethodScores,
    NormLift,
    SelectionResult,
    SelectionRule,
    SelectionWhy,
)

__all__ = [
    "ARRAY_DTYPES",
    "FORMAT_VERSION",
    "MAX_ARRAY_DIMS",
    "MAX_ARRAY_ELEMENTS",
    "MAX_DEPTH",
    "MAX_PAYLOAD_ELEMENTS",
    "MAX_STRING_CHARS",
    "DecodeBudget",
    "check_dataclass",
    "dumps",
    "from_dict",
    "loads",
    "to_dict",
]


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
    # A composition of fitted parts: the fitted base and the map are its parameters.
    "Recalibrated": (Recalibrated, ()),
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
    "SelectionRule": SelectionRule,
    "SelectionWhy": SelectionWhy,
    "ReliabilityCurve": ReliabilityCurve,
    "FitReport": FitReport,
    "QueryLevelReport": QueryLevelReport,
    "DriftReference": DriftReference,
    "FeatureReference": FeatureReference,
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


# -- the decoder: a payload is data, decoded by a schema ---------------------------------
ARRAY_DTYPES: tuple[str, ...] = ("float64", "int64", "bool")
"""The only dtypes an ``__ndarray__`` may name (anything else is refused unread)."""
MAX_ARRAY_ELEMENTS = 65_536
"""Elements of one array (an isotonic map of a large fit holds a few thousand)."""
MAX_ARRAY_DIMS = 2
"""Dimensions of one array (covariances are 2-D)."""
MAX_PAYLOAD_ELEMENTS = 262_144
"""Elements of one payload: array values, tuple items and dict entries together.
A profile decodes through one budget, so this caps a whole profile."""
MAX_STRING_CHARS = 10_000
"""Characters of one string (notes, reasons, names)."""
MAX_DEPTH = 32
"""Nesting depth of one payload."""
_INT64_MAX = 2**63 - 1
_FLOAT_WORDS = ("nan", "inf", "-inf")


class DecodeBudget:
    """What one payload may still decode (:data:`MAX_PAYLOAD_ELEMENTS` in all)."""

    def __init__(self, elements: int = MAX_PAYLOAD_ELEMENTS) -> None:
        self.limit = elements
        self.left = elements

    def take(self, n: int, path: str) -> None:
        """Spend ``n`` elements; refuse the payload once the budget is spent."""
        self.left -= n
        if self.left < 0:
            raise _bad(path, f"the payload holds more than {self.limit} elements")


def _bad(path: str, rule: str) -> UnsupportedFormatError:
    """The error of one value: its path in the payload and the rule it breaks."""
    where = path or "payload"
    return UnsupportedFormatError(f"{where}: {rule}", field=where)


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _dec(value: Any, path: str, budget: DecodeBudget, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise _bad(path, f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return _dec_array(value, path, budget)
        if "__float__" in value:
            word = value["__float__"]
            if len(value) != 1 or word not in _FLOAT_WORDS:
                raise _bad(path, '__float__ must be "nan", "inf" or "-inf"')
            return float(word)
        if "__dict__" in value:
            return _dec_dict(value, path, budget, depth)
        if "__tuple__" in value:
            items = value["__tuple__"]
            if len(value) != 1 or not isinstance(items, list):
                raise _bad(path, "__tuple__ must be a JSON array")
            budget.take(len(items), path)
            return tuple(
                _dec(v, f"{path}[{i}]", budget, depth + 1) for i, v in enumerate(items)
            )
        if "format_version" in value:
            return _from_dict(value, path, budget, depth + 1)
        raise _bad(
            path,
            "an object must be an __ndarray__, __float__, __dict__, __tuple__ or a "
            "versioned payload",
        )
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) > _INT64_MAX:
            raise _bad(path, "integers must fit in 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _bad(path, "numbers must be finite")
        return value
    if isinstance(value, str):
        if len(value) > MAX_STRING_CHARS:
            raise _bad(path, f"strings hold at most {MAX_STRING_CHARS} characters")
        return value
    raise _bad(path, 'a JSON array must be wrapped as {"__tuple__": [...]}')


def _dec_dict(
    value: dict[str, Any], path: str, budget: DecodeBudget, depth: int
) -> dict[Any, Any]:
    items = value["__dict__"]
    if len(value) != 1 or not isinstance(items, list):
        raise _bad(path, "__dict__ must be a JSON array of [key, value] pairs")
    budget.take(len(items), path)
    out: dict[Any, Any] = {}
    for i, item in enumerate(items):
        if not (isinstance(item, list) and len(item) == 2):
            raise _bad(f"{path}[{i}]", "a __dict__ entry must be a [key, value] pair")
        key = _dec(item[0], f"{path}[{i}]", budget, depth + 1)
        if not isinstance(key, str | int | float | bool):
            raise _bad(f"{path}[{i}]", "keys must be strings, numbers or booleans")
        out[key] = _dec(item[1], _join(path, key), budget, depth + 1)
    return out


def _array_float(v: Any) -> float | None:
    if type(v) is int and abs(v) <= _INT64_MAX:
        return float(v)
    if type(v) is float and math.isfinite(v):
        return v
    if isinstance(v, dict) and len(v) == 1 and v.get("__float__") in ("inf", "-inf"):
        return float(v["__float__"])
    return None


def _dec_array(
    value: dict[str, Any], path: str, budget: DecodeBudget
) -> np.ndarray[Any, Any]:
    """An array, its dtype and shape checked before anything is allocated."""
    if set(value) != {"__ndarray__", "dtype", "shape"}:
        raise _bad(path, "an array has exactly the keys __ndarray__, dtype and shape")
    dtype = value["dtype"]
    if not isinstance(dtype, str) or dtype not in ARRAY_DTYPES:
        raise _bad(
            _join(path, "dtype"), f"dtype must be one of {', '.join(ARRAY_DTYPES)}"
        )
    flat = value["__ndarray__"]
    if not isinstance(flat, list):
        raise _bad(path, "__ndarray__ must be a JSON array")
    if len(flat) > MAX_ARRAY_ELEMENTS:
        raise _bad(path, f"an array holds at most {MAX_ARRAY_ELEMENTS} elements")
    shape = value["shape"]
    if not (
        isinstance(shape, list | tuple)  # a tuple: to_dict output not yet JSON
        and len(shape) <= MAX_ARRAY_DIMS
        and all(type(n) is int and 0 <= n <= MAX_ARRAY_ELEMENTS for n in shape)
    ):
        raise _bad(
            _join(path, "shape"),
            f"shape must be at most {MAX_ARRAY_DIMS} integers in "
            f"[0, {MAX_ARRAY_ELEMENTS}]",
        )
    if math.prod(shape) != len(flat):
        raise _bad(_join(path, "shape"), "shape must match the number of elements")
    budget.take(len(flat), path)
    if dtype == "bool":
        ok = all(isinstance(v, bool) for v in flat)
        rule = "bool arrays hold true/false only"
    elif dtype == "int64":
        ok = all(type(v) is int and -_INT64_MAX - 1 <= v <= _INT64_MAX for v in flat)
        rule = "int64 arrays hold 64-bit integers only"
    else:
        # An unbounded prior has infinite SDs ({"__float__": "inf"}); NaN means
        # nothing in a fitted object and is refused.
        flat = [_array_float(v) for v in flat]
        ok = all(v is not None for v in flat)
        rule = "float64 arrays hold numbers (or +/-inf as __float__), never NaN"
    if not ok:
        raise _bad(path, rule)
    return np.array(flat, dtype=np.dtype(dtype)).reshape(tuple(shape))


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
        if isinstance(obj, Recalibrated) and obj.base is None:
            missing.append("base")
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


def from_dict(data: Any, *, budget: DecodeBudget | None = None, path: str = "") -> Any:
    """Rebuild an object from :func:`to_dict` output, checking every value.

    Arrays name a dtype of :data:`ARRAY_DTYPES`, hold at most
    :data:`MAX_ARRAY_ELEMENTS` finite values, and the whole payload at most
    :data:`MAX_PAYLOAD_ELEMENTS` (checked before anything is allocated); every field of
    a dataclass is checked against its annotation.

    Parameters
    ----------
    data : dict
        Payload.
    budget : DecodeBudget or None
        Share one budget across the payloads of one document (a profile); default: a
        fresh one.
    path : str
        Where ``data`` sits in that document, for error messages.

    Returns
    -------
    object
        The fitted object.

    Raises
    ------
    UnsupportedFormatError
        Unknown ``format_version`` or class, or a malformed payload; ``field`` names
        the offending value and the message the rule it breaks.
    """
    return _from_dict(data, path, budget or DecodeBudget(), 0)


def _from_dict(data: Any, path: str, budget: DecodeBudget, depth: int) -> Any:
    if not isinstance(data, dict):
        raise _bad(path, "a calibration payload must be a JSON object")
    version = data.get("format_version")
    name = data.get("class")
    if version != FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"{path or 'payload'}: unsupported format_version {version!r}; this "
            f"version reads {FORMAT_VERSION}.",
            format_version=version if isinstance(version, int) else None,
            field=_join(path, "format_version"),
        )
    if isinstance(name, str) and name in _ESTIMATORS:
        return _estimator(name, data, path, budget, depth)
    if isinstance(name, str) and name in _DATACLASSES:
        return _dataclass(name, data, path, budget, depth)
    raise _bad(_join(path, "class"), "unknown class")


def _members(data: dict[str, Any], key: str, path: str) -> dict[str, Any]:
    members = data.get(key)
    if not isinstance(members, dict):
        raise _bad(_join(path, key), "must be a JSON object")
    return members


def _estimator(
    name: str, data: dict[str, Any], path: str, budget: DecodeBudget, depth: int
) -> Any:
    cls, attrs = _ESTIMATORS[name]
    params_path, state_path = _join(path, "params"), _join(path, "state")
    raw_params = _members(data, "params", path)
    state = _members(data, "state", path)
    names = set(cls._get_param_names())
    for key in raw_params:
        if key not in names:
            raise _bad(_join(params_path, key), f"not a parameter of {name}")
    budget.take(len(raw_params) + len(state), path)
    obj = cls(
        **{
            k: _dec(v, _join(params_path, k), budget, depth + 1)
            for k, v in raw_params.items()
        }
    )
    optional = _OPTIONAL_STATE.get(name, ())
    for key in state:
        if key not in attrs and key not in optional:
            raise _bad(_join(state_path, key), f"not a state attribute of {name}")
    for a in attrs:
        if a not in state:
            raise _bad(_join(state_path, a), "missing")
        setattr(obj, a, _dec(state[a], _join(state_path, a), budget, depth + 1))
    for a in optional:
        if a in state:
            setattr(obj, a, _dec(state[a], _join(state_path, a), budget, depth + 1))
    for rule in _ESTIMATOR_RULES.get(name, ()):
        rule(obj, params_path)
    return obj


def _dataclass(
    name: str, data: dict[str, Any], path: str, budget: DecodeBudget, depth: int
) -> Any:
    cls = _DATACLASSES[name]
    fields_path = _join(path, "fields")
    raw = _members(data, "fields", path)
    declared = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in declared:
            raise _bad(_join(fields_path, key), f"not a field of {name}")
    budget.take(len(raw), fields_path)
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for key, f in declared.items():
        where = _join(fields_path, key)
        if name == "SelectionResult" and key == "oof_proba":
            values[key] = np.empty(0)
            continue
        if key not in raw:
            if (
                f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING
            ):
                raise _bad(where, "missing")
            continue
        value = _dec(raw[key], where, budget, depth + 1)
        values[key] = _checked(value, hints[key], where)
    for rule in _RULES.get(name, ()):
        rule(values, fields_path)
    return cls(**values)


def _hints(cls: type[Any]) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _describe(hint: Any) -> str:
    if hint is type(None):
        return "null"
    if isinstance(hint, type) and not typing.get_args(hint):
        return {
            "int": "an integer",
            "float": "a number",
            "str": "a string",
            "bool": "true or false",
        }.get(hint.__name__, hint.__name__)
    return str(hint).replace("typing.", "")


def _checked(value: Any, hint: Any, path: str) -> Any:
    """``value`` as the annotation ``hint`` types it (ints widen to floats), or raise."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        _check_plain(value, path)
        return value
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        for option in args:
            if option is type(None):
                continue
            try:
                return _checked(value, option, path)
            except UnsupportedFormatError:
                continue
        raise _bad(path, f"must be {' or '.join(_describe(a) for a in args)}")
    if origin is typing.Literal:
        if isinstance(value, str) and value in args:
            return value
        raise _bad(path, f"must be one of {', '.join(map(str, args))}")
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if type(value) is int:
            return value
    elif hint is float:
        if type(value) is int or type(value) is float:
            if math.isinf(value):
                raise _bad(path, "must be a finite number (or NaN when undefined)")
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif origin is tuple:
        if isinstance(value, tuple):
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(
                    _checked(v, args[0], f"{path}[{i}]") for i, v in enumerate(value)
                )
            if len(value) == len(args):
                return tuple(
                    _checked(v, a, f"{path}[{i}]")
                    for i, (v, a) in enumerate(zip(value, args, strict=True))
                )
    elif origin is dict:
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                if not isinstance(k, str):
                    raise _bad(path, "keys must be strings")
                out[k] = _checked(v, args[1], _join(path, k))
            return out
    elif origin is np.ndarray:
        dtype = np.dtype(typing.get_args(args[-1])[0])
        if isinstance(value, np.ndarray) and value.dtype == dtype:
            return value
        raise _bad(path, f"must be an array of dtype {dtype}")
    elif isinstance(hint, type):
        if isinstance(value, hint):
            return value
    else:  # a protocol or alias the decoder cannot name: the estimator checks it
        return value
    raise _bad(path, f"must be {_describe(hint)}")


def _check_plain(value: Any, path: str) -> None:
    """A free-form value (``extra``, tercile tables): JSON data, no objects."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise _bad(path, "keys must be strings")
            _check_plain(v, _join(path, k))
    elif isinstance(value, tuple | list):  # lists: untyped (format 1) reports
        for i, v in enumerate(value):
            _check_plain(v, f"{path}[{i}]")
    elif not (
        value is None or isinstance(value, bool | int | float | str | np.ndarray)
    ):
        raise _bad(path, "must be plain data (numbers, strings, tuples, dicts)")


def _non_negative(*names: str) -> Callable[[dict[str, Any], str], None]:
    def rule(values: dict[str, Any], path: str) -> None:
        for name in names:
            value = values.get(name)
            if isinstance(value, int) and value < 0:
                raise _bad(_join(path, name), "must be >= 0")
            if isinstance(value, np.ndarray) and value.size and value.min() < 0:
                raise _bad(_join(path, name), "values must be >= 0")

    return rule


def _probabilities(*names: str) -> Callable[[dict[str, Any], str], None]:
    def rule(values: dict[str, Any], path: str) -> None:
        for name in names:
            value = np.asarray(values.get(name, 0.0), dtype=np.float64)
            if np.any((value < 0.0) | (value > 1.0)):
                raise _bad(_join(path, name), "must be in [0, 1]")

    return rule


def _curve_bins(values: dict[str, Any], path: str) -> None:
    """A reliability curve is its bins (:data:`~calibration.metrics.BINNING`), no more."""
    n_bins = BINNING.n_bins
    for name in ("mean_predicted", "observed_frequency", "counts"):
        if values[name].ndim != 1 or len(values[name]) > n_bins:
            raise _bad(_join(path, name), f"at most {n_bins} bins (1-D)")
        if len(values[name]) != len(values["mean_predicted"]):
            raise _bad(_join(path, name), "one value per bin of mean_predicted")
    edges = values["bin_edges"]
    if edges.ndim != 1 or len(edges) > n_bins + 1:
        raise _bad(_join(path, "bin_edges"), f"at most {n_bins + 1} edges (1-D)")


def _extra_keys(values: dict[str, Any], path: str) -> None:
    """``extra`` is shown beside the report's own fields: it cannot shadow them."""
    taken = {f.name for f in dataclasses.fields(FitReport)} | {"query_ref", "doc_ref"}
    for key in values.get("extra", {}):
        if key in taken:
            raise _bad(_join(_join(path, "extra"), key), "shadows a report field")


def _feature_bins(values: dict[str, Any], path: str) -> None:
    """A drift feature: a known name, increasing finite edges, one count per bin.

    At most :data:`~calibration.drift.MAX_BINS` bins.
    """
    if values["name"] not in DRIFT_FEATURES:
        raise _bad(_join(path, "name"), f"must be one of {', '.join(DRIFT_FEATURES)}")
    edges, counts = values["edges"], values["counts"]
    if edges.ndim != 1 or len(edges) > MAX_BINS - 1:
        raise _bad(_join(path, "edges"), f"at most {MAX_BINS - 1} edges (1-D)")
    if not np.all(np.isfinite(edges)) or np.any(np.diff(edges) <= 0):
        raise _bad(_join(path, "edges"), "finite and increasing")
    if counts.ndim != 1 or len(counts) != len(edges) + 1:
        raise _bad(_join(path, "counts"), "one count per bin (one more than edges)")


def _drift_reference(values: dict[str, Any], path: str) -> None:
    """Each feature once, every count summing to the judged queries."""
    n = values["n_queries"]
    if n < 1 or values["top_relevant"] > n:
        raise _bad(path, "n_queries >= 1 and top_relevant <= n_queries")
    names = [f.name for f in values["features"]]
    if len(set(names)) != len(names):
        raise _bad(_join(path, "features"), "each feature at most once")
    for f in values["features"]:
        if int(f.counts.sum()) != n:
            raise _bad(_join(path, "features"), "counts must sum to n_queries")


_RULES: dict[str, tuple[Callable[[dict[str, Any], str], None], ...]] = {
    "FitReport": (
        _non_negative("n_queries", "n_pairs", "n_positive", "n_splits", "k"),
        _extra_keys,
    ),
    "QueryLevelReport": (_non_negative("n_queries", "with_relevant_in_top_k"),),
    "AbstainPolicy": (
        _non_negative("n_calibration"),
        _probabilities("threshold", "target_risk", "delta"),
    ),
    "ReliabilityCurve": (
        _non_negative("counts"),
        _probabilities("mean_predicted", "observed_frequency"),
        _curve_bins,
    ),
    "FeatureReference": (_non_negative("counts"), _feature_bins),
    "DriftReference": (
        _non_negative("n_queries", "top_relevant"),
        _drift_reference,
    ),
}


_RECALIBRATED_BASES = (
    PlattCalibrator,
    IsotonicCalibrator,
    NormTemperedCalibrator,
    ListAwareCalibrator,
    PriorCalibrator,
)


def _recalibration_map(obj: Recalibrated, path: str) -> None:
    """A recalibrated calibrator wraps one fitted family, through a bounded map."""
    if not isinstance(obj.base, _RECALIBRATED_BASES):
        names = " or ".join(c.__name__ for c in _RECALIBRATED_BASES)
        raise _bad(_join(path, "base"), f"must be a {names}")
    bounds = {
        "a": (1.0 / RECAL_MAX_SLOPE, RECAL_MAX_SLOPE),
        "b": (1.0 / RECAL_MAX_SLOPE, RECAL_MAX_SLOPE),
        "c": (-RECAL_MAX_SHIFT, RECAL_MAX_SHIFT),
    }
    for name, (low, high) in bounds.items():
        value = getattr(obj, name)
        if not (
            type(value) in (int, float)
            and math.isfinite(value)
            and low <= value <= high
        ):
            raise _bad(_join(path, name), f"must be a number in [{low:g}, {high:g}]")


_ESTIMATOR_RULES: dict[str, tuple[Callable[[Any, str], None], ...]] = {
    "Recalibrated": (_recalibration_map,),
}


def check_dataclass(obj: Any, path: str = "") -> None:
    """Check a report dataclass built by other means (an untyped format-1 report).

    Raises
    ------
    UnsupportedFormatError
        A field does not have its annotated type or breaks a rule of its class.
    """
    name = type(obj).__name__
    if name not in _DATACLASSES or not dataclasses.is_dataclass(obj):
        raise _bad(path, f"unexpected {name}")
    hints = _hints(type(obj))
    values = {}
    for f in dataclasses.fields(obj):
        if name == "SelectionResult" and f.name == "oof_proba":
            continue
        value = getattr(obj, f.name)
        values[f.name] = _checked(value, hints[f.name], _join(path, f.name))
        nested = [value] if dataclasses.is_dataclass(value) else []
        if isinstance(value, dict):
            nested = [v for v in value.values() if dataclasses.is_dataclass(v)]
        elif isinstance(value, tuple):
            nested = [v for v in value if dataclasses.is_dataclass(v)]
        for v in nested:
            check_dataclass(v, _join(path, f.name))
    for rule in _RULES.get(name, ()):
        rule(values, path)


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
