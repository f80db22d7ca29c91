"""The recalibration stage (issue 26): the map, the wrapper, its persistence and
trial, and ``auto`` serving a recalibrated better-discriminating shape where the ECE
guard used to fall back to a worse-discriminating family."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibration import fit_prior, io
from calibration.exceptions import UnsupportedFormatError
from calibration.metrics import auroc
from calibration.models import IsotonicCalibrator, ListAwareCalibrator, PlattCalibrator
from calibration.prior import PriorCalibrator
from calibration.profile import Profile, fit_profile, trial_scores
from calibration.recalibration import (
    RECAL_MAX_SHIFT,
    RECAL_MAX_SLOPE,
    Recalibrated,
    fit_recalibration,
    proba_logit,
    recalibrate_proba,
)
from calibration.report import FitReport
from calibration.selection import (
    ECE_GUARD,
    _auto,
    _pairs,
    _stage,
    cross_val_predict_grouped,
    select_calibrator,
)
from calibration.simulate import simulate_judgments
from tests.calibration.test_prior import LEVELS, domain
from tests.services.test_calibrators_unit import synthetic_evidence

SLOPES = st.floats(1.0 / RECAL_MAX_SLOPE, RECAL_MAX_SLOPE)
SHIFTS = st.floats(-RECAL_MAX_SHIFT, RECAL_MAX_SHIFT)


@pytest.fixture(scope="module")
def world():
    rng = np.random.default_rng(3)
    X, y, groups = domain(-1.0, 40, rng)
    return X, y, groups


@pytest.fixture(scope="module")
def platt(world):
    X, y, _ = world
    return PlattCalibrator().fit(X, y)


@pytest.fixture(scope="module")
def prior_fit(world):
    rng = np.random.default_rng(0)
    prior = fit_prior(
        {f"d{k}": domain(level, 100, rng)[:2] for k, level in enumerate(LEVELS)}
    )
    X, y, groups = world
    return PriorCalibrator(prior=prior.to_dict()).fit(X, y, groups)


# -- the map ------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(a=SLOPES, b=SLOPES, c=SHIFTS)
def test_the_map_keeps_the_order_of_the_probabilities(platt, world, a, b, c):
    X = world[0]
    base = platt.predict_proba(X)
    p = Recalibrated(base=platt, a=a, b=b, c=c).predict_proba(X)
    order = np.argsort(base, kind="stable")
    assert np.all(np.diff(p[order]) >= 0.0)
    assert np.all((p >= 0.0) & (p <= 1.0))
    if 0 < world[1].sum() < len(world[1]):
        assert auroc(world[1], p) == pytest.approx(auroc(world[1], base), abs=1e-9)


def test_the_identity_map_changes_nothing(platt, world):
    X = world[0]
    np.testing.assert_allclose(
        Recalibrated(base=platt).predict_proba(X), platt.predict_proba(X), atol=1e-12
    )


def test_equal_slopes_are_temperature_and_intercept_on_the_logit():
    p = np.linspace(0.01, 0.99, 50)
    np.testing.assert_allclose(
        recalibrate_proba(p, 2.0, 2.0, -0.5),
        1.0 / (1.0 + np.exp(-(2.0 * proba_logit(p) - 0.5))),
    )


def test_the_fit_recovers_a_known_distortion_and_stays_near_identity_on_little_data():
    rng = np.random.default_rng(0)
    z = rng.normal(-1.0, 2.0, 40_000)
    y = rng.random(z.shape) < recalibrate_proba(1 / (1 + np.exp(-z)), 2, 0.5, 0.3)
    a, b, c = fit_recalibration(z, y.astype(float))
    assert (a, b, c) == pytest.approx((2.0, 0.5, 0.3), abs=0.15)
    # Ten pairs say little: the prior keeps the map close to the identity.
    a, b, c = fit_recalibration(z[:10], y[:10].astype(float))
    assert max(abs(math.log(a)), abs(math.log(b)), abs(c)) < 1.0
    # A single class is fine (the prior keeps the fit finite).
    assert all(math.isfinite(v) for v in fit_recalibration(z[:50], np.zeros(50)))


# -- the wrapper keeps what the service uses of its base -----------------------------


def test_intervals_go_through_the_same_map(prior_fit, world):
    X = world[0]
    wrapped = Recalibrated(base=prior_fit, a=1.5, b=0.7, c=-0.2)
    lo, hi = prior_fit.predict_interval(X)
    w_lo, w_hi = wrapped.predict_interval(X)
    np.testing.assert_allclose(w_lo, recalibrate_proba(lo, 1.5, 0.7, -0.2))
    np.testing.assert_allclose(w_hi, recalibrate_proba(hi, 1.5, 0.7, -0.2))
    p = wrapped.predict_proba(X)
    assert np.all((w_lo <= p + 1e-12) & (p <= w_hi + 1e-12))
    assert wrapped.reorders_hits == prior_fit.reorders_hits
    assert wrapped.n_features_in_ == prior_fit.n_features_in_


def test_a_base_without_intervals_gives_none(platt):
    wrapped = Recalibrated(base=platt, a=1.2)
    assert not hasattr(wrapped, "predict_interval")
    assert wrapped.reorders_hits is False


# -- persistence and the profile trial ------------------------------------------------


@pytest.mark.parametrize("base", ["platt", "prior_fit"])
def test_round_trip_is_bit_identical(request, base, world):
    X = world[0]
    est = Recalibrated(base=request.getfixturevalue(base), a=1.3, b=0.6, c=0.25)
    back = io.loads(io.dumps(est))
    assert isinstance(back, Recalibrated) and type(back.base) is type(est.base)
    np.testing.assert_array_equal(back.predict_proba(X), est.predict_proba(X))
    assert hasattr(back, "predict_interval") == hasattr(est, "predict_interval")


def _payload(**params):
    data = io.to_dict(Recalibrated(base=PlattCalibrator().fit([0.1, 0.9], [0, 1])))
    data["params"].update(params)
    return data


@pytest.mark.parametrize("name", ["a", "b"])
def test_slopes_at_the_bound_and_one_past(name):
    for value in (RECAL_MAX_SLOPE, 1.0 / RECAL_MAX_SLOPE):
        assert getattr(io.from_dict(_payload(**{name: value})), name) == value
    for value in (
        math.nextafter(RECAL_MAX_SLOPE, math.inf),
        math.nextafter(1.0 / RECAL_MAX_SLOPE, 0.0),
        0.0,
        -1.0,
        True,
        "2",
    ):
        with pytest.raises(UnsupportedFormatError) as info:
            io.from_dict(_payload(**{name: value}))
        assert info.value.field == f"params.{name}"


def test_intercept_at_the_bound_and_one_past():
    assert io.from_dict(_payload(c=-RECAL_MAX_SHIFT)).c == -RECAL_MAX_SHIFT
    with pytest.raises(UnsupportedFormatError) as info:
        io.from_dict(_payload(c=math.nextafter(RECAL_MAX_SHIFT, math.inf)))
    assert info.value.field == "params.c"
    assert "must be a number in [-10, 10]" in str(info.value)


def test_the_base_must_be_a_calibrator_family():
    nested = _payload()
    nested["params"]["base"] = _payload()  # a recalibrated recalibrator
    for payload in (_payload(base=None), nested):
        with pytest.raises(UnsupportedFormatError) as info:
            io.from_dict(payload)
        assert info.value.field == "params.base"


def test_an_unfitted_wrapper_cannot_be_saved():
    from calibration.exceptions import NotFittedCalibratorError

    with pytest.raises(NotFittedCalibratorError):
        io.to_dict(Recalibrated())
    with pytest.raises(NotFittedCalibratorError):
        io.to_dict(Recalibrated(base=IsotonicCalibrator()))


@pytest.fixture(scope="module")
def profile() -> Profile:
    rng = np.random.default_rng(1)
    return fit_profile(
        synthetic_evidence(30),
        doc_norms=rng.normal(3.0, 0.3, 300),
        doc_tokens=rng.integers(60, 256, 300),
        model="test-model",
    )


def test_the_reasons_round_trip_through_both_forms_of_the_report(profile):
    why = profile.report.selection
    assert why is not None and why.rules
    assert FitReport.from_jsonable(profile.report.to_jsonable()).selection == why
    assert io.loads(io.dumps(profile.report)).selection == why


@pytest.mark.parametrize("base", ["platt", "isotonic", "prior_fit"])
def test_a_profile_serving_a_recalibrated_map_loads_and_passes_the_trial(
    request, profile, world, base
):
    X, y, _ = world
    fitted = (
        IsotonicCalibrator().fit(X, y)
        if base == "isotonic"
        else request.getfixturevalue(base)
    )
    est = Recalibrated(base=fitted, a=RECAL_MAX_SLOPE, b=0.5, c=-RECAL_MAX_SHIFT)
    served = dataclasses.replace(profile, estimator=est)
    back = Profile.from_json(json.loads(json.dumps(served.to_json())))
    trial_scores(back, max_rank=100)
    assert back.report.selection == profile.report.selection
    np.testing.assert_array_equal(back.estimator.predict_proba(X), est.predict_proba(X))
    if base == "prior_fit":
        assert (
            back.prior is not None
            and back.score(
                1.0, 8, np.array([0.6, 0.5]), np.ones(2), np.array([50, 60])
            ).intervals
            is not None
        )


# -- auto: a recalibrated better shape instead of the guard's fallback ----------------


@pytest.fixture(scope="module")
def s_shaped():
    """A list world whose labels follow an S-shaped distortion of the list model's
    probabilities (a logistic link cannot fit it): the list model discriminates best
    but sits clearly above its ECE noise floor, isotonic on the cosine at its own.
    Before issue 26, ``auto`` served isotonic here (measured)."""
    d = simulate_judgments(
        300,
        k=20,
        rng=1,
        alpha=float(np.log(10)),
        gamma_q=0.0,
        gamma_d=0.0,
        beta_q=0.0,
        delta_rank=0.05,
        delta_gap=1.0,
    )
    noise = np.random.default_rng(101).random(len(d.y))
    y = (noise < recalibrate_proba(d.p_true, 0.2, 4.0, -4.0)).astype(float)
    return d.X, y, d.groups


def test_the_guard_fell_back_to_a_worse_shape_without_the_stage(s_shaped):
    """Each family's raw map against its recalibrated one, through ``auto``'s rules."""
    X, y, groups = s_shaped
    data = _pairs(X, y, groups, 5)
    families = {
        "platt": PlattCalibrator(),
        "isotonic": IsotonicCalibrator(),
        "nt-list": ListAwareCalibrator(use_norms=False),
    }
    stages = {
        m: _stage(m, cross_val_predict_grouped(t, X, y, groups), data)
        for m, t in families.items()
    }
    raw = {m: dataclasses.replace(s, used=False) for m, s in stages.items()}
    before, rules = _auto(tuple(families), raw, data.y, data.codes, [])
    assert before == "isotonic" and rules[1].outcome == "switched"
    after, rules = _auto(tuple(families), stages, data.y, data.codes, [])
    assert after == "nt-list" and stages["nt-list"].used
    assert rules[1].outcome == "at its floor"


def test_auto_serves_the_recalibrated_better_shape(s_shaped):
    X, y, groups = s_shaped
    res = select_calibrator(X, y, groups)
    why = res.why
    assert why is not None
    assert res.method == why.chosen == "nt-list"
    assert why.recalibrated and isinstance(res.estimator, Recalibrated)
    assert isinstance(res.estimator.base, ListAwareCalibrator)
    rules = {r.rule: r for r in why.rules}
    assert list(rules) == ["one-se", "ece-guard", "rank-guard", "recalibration"]
    assert rules["recalibration"].outcome == "applied"
    assert rules["ece-guard"].outcome == "at its floor"
    # At its noise floor, with the list model's discrimination and the best NLL.
    assert why.served.ece <= ECE_GUARD * why.ece_noise_floor
    assert why.served.auroc > res.cv["isotonic"].auroc + 0.02
    assert why.served.nll < min(s.nll for s in res.cv.values())
    # The served map is the reported one: OOF figures are those of the served map.
    assert auroc(y, res.oof_proba) == pytest.approx(why.served.auroc)
    np.testing.assert_allclose(
        res.estimator.predict_proba(X),
        recalibrate_proba(
            res.estimator.base.predict_proba(X),
            res.estimator.a,
            res.estimator.b,
            res.estimator.c,
        ),
    )
