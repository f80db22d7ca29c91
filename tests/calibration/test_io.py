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
