from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from calibration import io
from calibration.exceptions import NotFittedCalibratorError, UnsupportedFormatError
from calibration.features import NormReference
from calibration.models import (
    IsotonicCalibrator,
    ListAwareCalibrator,
    NormTemperedCalibrator,
    PlattCalibrator,
)
from calibration.query import QueryConfidenceModel, fit_abstain_policy, query_table
from calibration.selection import select_calibrator

CALIBRATORS = [
    PlattCalibrator(),
    IsotonicCalibrator(),
    NormTemperedCalibrator(),
    NormTemperedCalibrator(prior_width="none", query_side_only=True),
    ListAwareCalibrator(),
    ListAwareCalibrator(use_norms=False, query_side_only=True),
]


@pytest.mark.parametrize("est", CALIBRATORS, ids=lambda e: repr(e))
def test_calibrator_round_trip_is_bit_identical(est, list_world):
    d = list_world
    est.fit(d.X, d.y, d.groups)
    text = io.dumps(est)
    json.loads(text)  # strict JSON
    assert "NaN" not in text and "Infinity" not in text
    back = io.loads(text)
    assert type(back) is type(est)
    assert back.get_params() == est.get_params()
    np.testing.assert_array_equal(back.predict_proba(d.X), est.predict_proba(d.X))
    assert back.reorders_hits == est.reorders_hits


def test_reference_query_model_policy_round_trip(list_world):
    rng = np.random.default_rng(0)
    n_tok = rng.integers(2, 100, 50).astype(float)
    norms = np.exp(0.1 * rng.standard_normal(50)) / np.sqrt(n_tok)
    ref = NormReference().fit(norms, n_tok)
    back = io.loads(io.dumps(ref))
    np.testing.assert_array_equal(
        back.transform(norms, n_tok), ref.transform(norms, n_tok)
    )
    np.testing.assert_array_equal(back.length_feature(n_tok), ref.length_feature(n_tok))

    d = list_world
    p = PlattCalibrator().fit(d.X, d.y).predict_proba(d.X)
    Q, hit, _ = query_table(p, d.groups, d.X[:, 1], y=d.y)
    qm = QueryConfidenceModel().fit(Q, hit)
    np.testing.assert_array_equal(
        io.loads(io.dumps(qm)).predict_proba(Q), qm.predict_proba(Q)
    )


def test_certified_abstain_policy_round_trip():
    # Confidence separates queries with a hit from those without (200 queries, 25
    # misses all below every hit's confidence): answering every hit certifies.
    rng = np.random.default_rng(0)
    hit = (np.arange(200) >= 25).astype(float)
    confidence = np.where(
        hit == 1, rng.uniform(0.6, 1.0, 200), rng.uniform(0, 0.4, 200)
    )
    pol = fit_abstain_policy(confidence, hit, target_risk=0.1, delta=0.1)
    assert pol.certified and pol.coverage >= 175 / 200
    back = io.loads(io.dumps(pol))
    assert back == pol
    np.testing.assert_array_equal(
        back.should_abstain(confidence), pol.should_abstain(confidence)
    )


def test_uncertified_abstain_policy_round_trip_keeps_nan_risk():
    # No query has a hit: nothing certifies and no query is answered (risk NaN).
    pol = fit_abstain_policy(np.linspace(0, 1, 50), np.zeros(50), target_risk=0.1)
    assert not pol.certified and math.isnan(pol.empirical_risk)
    back = io.loads(io.dumps(pol))
    assert math.isnan(back.empirical_risk)
    # NaN != NaN, so compare every other field exactly.
    assert replace(back, empirical_risk=0.0) == replace(pol, empirical_risk=0.0)


def test_selection_result_round_trip(list_world):
    d = list_world
    res = select_calibrator(d.X, d.y, d.groups, n_splits=3)
    back = io.loads(io.dumps(res))
    assert back.method == res.method
    assert back.cv == res.cv
    assert back.why == res.why and back.why is not None
    assert back.norm_lift.terms == res.norm_lift.terms
    assert back.norm_lift.variants == res.norm_lift.variants
    np.testing.assert_array_equal(
        back.reliability.mean_predicted, res.reliability.mean_predicted
    )
    np.testing.assert_array_equal(
        back.estimator.predict_proba(d.X), res.estimator.predict_proba(d.X)
    )


@pytest.mark.parametrize(
    "payload",
    [
        '{"format_version": 99, "class": "PlattCalibrator", "params": {}, "state": {}}',
        '{"format_version": 1, "class": "Pickle", "params": {}, "state": {}}',
        '{"format_version": 1, "class": "PlattCalibrator", "params": {}}',
        "[1, 2]",
        "not json",
    ],
)
def test_bad_payloads_raise_unsupported_format(payload):
    with pytest.raises(UnsupportedFormatError):
        io.loads(payload)


def test_unfitted_or_foreign_objects_cannot_be_saved():
    with pytest.raises(NotFittedCalibratorError):
        io.dumps(PlattCalibrator())
    with pytest.raises(UnsupportedFormatError):
        io.dumps(object())


# -- the decoder's schema: dtypes, caps, finite values, typed fields --------------------
def _ref_payload(**state: object) -> dict[str, object]:
    """A NormReference payload (9 entries of params and state), ``state`` overriding."""
    rng = np.random.default_rng(1)
    n_tok = rng.integers(2, 100, 30).astype(float)
    ref = NormReference().fit(np.exp(0.1 * rng.standard_normal(30)) / n_tok, n_tok)
    payload = io.to_dict(ref)
    payload["state"].update(state)  # type: ignore[attr-defined]
    return payload


def _arr(values: list[object], dtype: str = "float64", shape=None) -> dict[str, object]:
    return {
        "__ndarray__": values,
        "dtype": dtype,
        "shape": [len(values)] if shape is None else shape,
    }


def _refused(payload: object, field: str, rule: str) -> None:
    with pytest.raises(UnsupportedFormatError) as info:
        io.from_dict(payload)
    assert info.value.field == field
    assert rule in str(info.value)


@pytest.mark.parametrize(
    "dtype", ["S1000000000", "(1000000000,)f8", "<U8", "object", "float32", "V8", 8]
)
def test_only_whitelisted_dtypes_decode(dtype):
    _refused(
        _ref_payload(slope_=_arr([1.0], dtype)),
        "state.slope_.dtype",
        "dtype must be one of float64, int64, bool",
    )


@pytest.mark.parametrize(
    ("values", "dtype"),
    [([1.5, 2], "float64"), ([1, -(2**63)], "int64"), ([True, False], "bool")],
)
def test_whitelisted_dtypes_decode_their_values(values, dtype):
    back = io.from_dict(_ref_payload(slope_=_arr(values, dtype)))
    assert back.slope_.dtype == np.dtype(dtype)
    assert back.slope_.tolist() == values


@pytest.mark.parametrize(
    ("values", "dtype", "rule"),
    [
        (["1.0"], "float64", "float64 arrays hold numbers"),
        ([True], "float64", "float64 arrays hold numbers"),
        ([{"__float__": "nan"}], "float64", "never NaN"),
        ([1.5], "int64", "int64 arrays hold 64-bit integers"),
        ([2**63], "int64", "int64 arrays hold 64-bit integers"),
        ([1], "bool", "bool arrays hold true/false"),
        ([[1.0]], "float64", "float64 arrays hold numbers"),
    ],
)
def test_array_values_must_match_their_dtype(values, dtype, rule):
    _refused(_ref_payload(slope_=_arr(values, dtype)), "state.slope_", rule)


def test_infinite_array_values_are_kept_nan_refused():
    inf = {"__float__": "inf"}
    back = io.from_dict(_ref_payload(slope_=_arr([inf, 1.0])))
    assert back.slope_[0] == math.inf


def test_array_element_cap_at_the_bound_and_one_past():
    cap = io.MAX_ARRAY_ELEMENTS
    back = io.from_dict(_ref_payload(slope_=_arr([0.0] * cap)))
    assert back.slope_.shape == (cap,)
    _refused(
        _ref_payload(slope_=_arr([0.0] * (cap + 1))),
        "state.slope_",
        f"an array holds at most {cap} elements",
    )


@pytest.mark.parametrize(
    ("shape", "rule"),
    [
        ([2, 2, 1], "shape must be at most 2 integers"),
        ([-4, -1], "shape must be at most 2 integers"),
        ([10**9], "shape must be at most 2 integers"),
        ([3], "shape must match the number of elements"),
        ("4", "shape must be at most 2 integers"),
    ],
)
def test_shapes_are_checked(shape, rule):
    field = "state.slope_.shape"
    _refused(_ref_payload(slope_=_arr([0.0] * 4, shape=shape)), field, rule)


def test_a_two_dimensional_array_decodes():
    back = io.from_dict(_ref_payload(slope_=_arr([1.0, 2.0, 3.0, 4.0], shape=[2, 2])))
    assert back.slope_.shape == (2, 2)


def test_payload_element_cap_at_the_bound_and_one_past():
    # 9 params and state entries, the rest a tuple in one parameter.
    room = io.MAX_PAYLOAD_ELEMENTS - 9
    payload = _ref_payload()
    payload["params"]["clip"] = {"__tuple__": [0] * room}  # type: ignore[index]
    assert len(io.from_dict(payload).clip) == room
    payload["params"]["clip"] = {"__tuple__": [0] * (room + 1)}  # type: ignore[index]
    _refused(payload, "params.clip", "more than 262144 elements")


def test_budget_is_shared_across_payloads():
    budget = io.DecodeBudget(20)
    io.from_dict(_ref_payload(), budget=budget)  # 9
    io.from_dict(_ref_payload(), budget=budget)  # 18
    with pytest.raises(UnsupportedFormatError, match="more than 20 elements"):
        io.from_dict(_ref_payload(), budget=budget)


def test_string_cap_at_the_bound_and_one_past():
    cap = io.MAX_STRING_CHARS
    assert io.from_dict(_ref_payload(slope_="x" * cap)).slope_ == "x" * cap
    _refused(_ref_payload(slope_="x" * (cap + 1)), "state.slope_", f"at most {cap}")


def test_nesting_depth_at_the_bound_and_one_past():
    def nested(levels: int) -> object:
        value: object = 0
        for _ in range(levels):
            value = {"__tuple__": [value]}
        return value

    # The state value is decoded at depth 1; each tuple adds one level.
    io.from_dict(_ref_payload(slope_=nested(io.MAX_DEPTH - 1)))
    with pytest.raises(UnsupportedFormatError, match="nested deeper than 32"):
        io.from_dict(_ref_payload(slope_=nested(io.MAX_DEPTH)))


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        (2**64, "integers must fit in 64 bits"),
        (math.inf, "numbers must be finite"),
        ([1, 2], "must be wrapped"),
        ({"__float__": "zero"}, "__float__ must be"),
        ({"__tuple__": "ab"}, "__tuple__ must be a JSON array"),
        ({"__dict__": "ab"}, "__dict__ must be a JSON array"),
        ({"__pickle__": "x"}, "an object must be"),
    ],
)
def test_wrong_scalar_and_container_kinds_are_refused(value, rule):
    _refused(_ref_payload(slope_=value), "state.slope_", rule)


def test_dict_entries_are_pairs_with_plain_keys():
    _refused(
        _ref_payload(slope_={"__dict__": [[1]]}),
        "state.slope_[0]",
        "a [key, value] pair",
    )
    key = {"__tuple__": [1]}
    _refused(
        _ref_payload(slope_={"__dict__": [[key, 1]]}),
        "state.slope_[0]",
        "keys must be strings, numbers or booleans",
    )
    back = io.from_dict(_ref_payload(slope_={"__dict__": [["a", 1], [2, "b"]]}))
    assert back.slope_ == {"a": 1, 2: "b"}


def test_unknown_or_missing_members_are_named():
    payload = _ref_payload()
    payload["state"]["extra_"] = 1  # type: ignore[index]
    _refused(payload, "state.extra_", "not a state attribute of NormReference")
    payload = _ref_payload()
    del payload["state"]["slope_"]  # type: ignore[attr-defined]
    _refused(payload, "state.slope_", "missing")
    payload = _ref_payload()
    payload["params"]["sneaky"] = 1  # type: ignore[index]
    _refused(payload, "params.sneaky", "not a parameter of NormReference")


def _policy_payload(**fields: object) -> dict[str, object]:
    pol = fit_abstain_policy(np.linspace(0, 1, 50), np.ones(50), target_risk=0.1)
    payload = io.to_dict(pol)
    payload["fields"].update(fields)  # type: ignore[attr-defined]
    return payload


@pytest.mark.parametrize(
    ("name", "value", "rule"),
    [
        ("method", 3, "must be a string"),
        ("method", "x" * 10_001, "at most 10000 characters"),
        ("n_calibration", {"__tuple__": [1, 2]}, "must be an integer"),
        ("n_calibration", 2.5, "must be an integer"),
        ("n_calibration", True, "must be an integer"),
        ("n_calibration", -1, "must be >= 0"),
        ("certified", 1, "must be true or false"),
        ("threshold", "0.5", "must be a number"),
        ("threshold", 1.5, "must be in [0, 1]"),
        ("coverage", {"__float__": "inf"}, "must be a finite number"),
    ],
)
def test_dataclass_fields_are_typed(name, value, rule):
    _refused(_policy_payload(**{name: value}), f"fields.{name}", rule)


def test_dataclass_int_widens_to_float_and_nan_means_undefined():
    back = io.from_dict(
        _policy_payload(coverage=1, empirical_risk={"__float__": "nan"})
    )
    assert back.coverage == 1.0 and isinstance(back.coverage, float)
    assert math.isnan(back.empirical_risk)


def test_report_fields_are_typed_and_bounded(list_world):
    d = list_world
    res = select_calibrator(d.X, d.y, d.groups, n_splits=3)
    payload = io.to_dict(res)
    curve = payload["fields"]["reliability"]["fields"]
    n = len(curve["mean_predicted"]["__ndarray__"])
    assert n <= 15
    curve["counts"] = "abc"
    _refused(payload, "fields.reliability.fields.counts", "dtype int64")
    curve["counts"] = _arr([1] * 16, "int64")
    _refused(payload, "fields.reliability.fields.counts", "at most 15 bins")
    payload = io.to_dict(res)
    payload["fields"]["cv"]["__dict__"][0][0] = 7
    _refused(payload, "fields.cv", "keys must be strings")
    payload = io.to_dict(res)
    payload["fields"]["cv"]["__dict__"][0][1] = "zzz"
    assert io.to_dict(res)["fields"]["cv"]["__dict__"][0][0] in res.cv
    with pytest.raises(UnsupportedFormatError, match="must be MethodScores"):
        io.from_dict(payload)
