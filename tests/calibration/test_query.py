from __future__ import annotations

import numpy as np
import pytest

from calibration.exceptions import InvalidInputError, NotFittedCalibratorError
from calibration.query import (
    QUERY_FEATURES,
    QueryConfidenceModel,
    cross_fit_query_confidence,
    fit_abstain_policy,
    query_features,
    query_table,
)


def _queries(n, rng):
    """Queries whose chance of a relevant hit follows their best hit probability."""
    k = 10
    p = rng.beta(0.6, 4.0, size=(n, k))
    y = (rng.random((n, k)) < p).astype(float)
    groups = np.repeat(np.arange(n), k)
    return p.ravel(), y.ravel(), groups


def test_query_features_shape_and_values():
    f = query_features([0.9, 0.1, 0.2], ell_q=0.3)
    assert f.shape == (len(QUERY_FEATURES),)
    assert f[0] == pytest.approx(np.log(0.9 / 0.1))
    noisy_or = 1 - 0.1 * 0.9 * 0.8
    assert f[1] == pytest.approx(np.log(noisy_or / (1 - noisy_or)))
    assert f[3] == 0.3
    with pytest.raises(InvalidInputError):
        query_features([])


def test_query_model_is_calibrated_and_monotone_in_evidence():
    rng = np.random.default_rng(0)
    p, y, g = _queries(3000, rng)
    Q, hit, _ = query_table(p, g, y=y)
    m = QueryConfidenceModel().fit(Q, hit)
    conf = m.predict_proba(Q)
    assert conf.dtype == np.float64 and np.all((conf >= 0) & (conf <= 1))
    assert abs(conf.mean() - hit.mean()) < 0.01
    assert m.coef_[1] > 0  # more noisy-OR evidence, more confidence
    with pytest.raises(NotFittedCalibratorError):
        QueryConfidenceModel().predict_proba(Q)


@pytest.mark.slow
def test_abstain_guarantee_holds_on_fresh_data():
    # LTT guarantee: P(risk on fresh data > target) <= delta. Check the frequency.
    target, delta = 0.25, 0.1
    violations, certified = 0, 0
    for rep in range(20):
        rng = np.random.default_rng(100 + rep)
        p, y, g = _queries(400, rng)
        Q, hit, _ = query_table(p, g, y=y)
        conf = cross_fit_query_confidence(Q, hit)
        policy = fit_abstain_policy(conf, hit, target_risk=target, delta=delta)
        assert policy.n_calibration == 400
        if not policy.certified:
            continue
        certified += 1
        model = QueryConfidenceModel().fit(Q, hit)
        p2, y2, g2 = _queries(2000, rng)
        Q2, hit2, _ = query_table(p2, g2, y=y2)
        answered = ~policy.should_abstain(model.predict_proba(Q2))
        fresh_risk = 1 - hit2[answered].mean()
        violations += fresh_risk > target
        assert 0 < policy.coverage <= 1
        assert policy.empirical_risk <= target
    assert certified >= 10
    assert violations <= 0.25 * certified


def test_uncertifiable_target_abstains_always():
    rng = np.random.default_rng(3)
    conf = rng.random(50)
    hit = (rng.random(50) < 0.3).astype(float)
    policy = fit_abstain_policy(conf, hit, target_risk=0.01, delta=0.05)
    assert not policy.certified
    assert policy.threshold == 1.0
    assert policy.coverage == 0.0
    assert policy.should_abstain([0.999, 1.0]).all()


def test_abstain_rejects_bad_parameters():
    with pytest.raises(InvalidInputError):
        fit_abstain_policy([0.5, 0.6], [1, 0], target_risk=1.5)


def test_sequence_starts_at_min_coverage():
    """A few misses among the most confident queries must not spend the whole test."""
    from calibration import fit_abstain_policy

    n = 1000
    confidence = np.linspace(1.0, 0.0, n)
    hit = np.ones(n)
    hit[[0, 5, 10]] = 0.0  # 3 misses among the 22 most confident
    hit[np.arange(30, n, 100)] = 0.0  # then 1% misses
    hit[600:] = np.where(np.arange(400) % 2 == 0, 0.0, 1.0)  # the low tail is bad
    strict = fit_abstain_policy(
        confidence, hit, target_risk=0.1, delta=0.1, min_coverage=0.0
    )
    assert not strict.certified
    policy = fit_abstain_policy(confidence, hit, target_risk=0.1, delta=0.1)
    assert policy.certified and policy.coverage >= 0.1
    assert policy.empirical_risk <= 0.1
