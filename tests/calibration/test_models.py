from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import expit
from sklearn.base import clone

from calibration.exceptions import (
    InvalidInputError,
    NotFittedCalibratorError,
    SingleClassError,
)
from calibration.features import FEATURES
from calibration.metrics import negative_log_likelihood
from calibration.models import (
    IsotonicCalibrator,
    ListAwareCalibrator,
    NormTemperedCalibrator,
    PlattCalibrator,
)
from calibration.simulate import simulate_judgments

ALL = [
    PlattCalibrator,
    IsotonicCalibrator,
    NormTemperedCalibrator,
    ListAwareCalibrator,
]


@pytest.fixture(scope="module")
def fitted(list_world):
    d = list_world
    return {cls.__name__: cls().fit(d.X, d.y, d.groups) for cls in ALL}


@pytest.mark.parametrize("cls", ALL)
def test_outputs_are_1d_float64_probabilities(cls, fitted, list_world):
    p = fitted[cls.__name__].predict_proba(list_world.X)
    assert p.dtype == np.float64
    assert p.shape == (list_world.X.shape[0],)
    assert np.all((p >= 0) & (p <= 1))


@pytest.mark.parametrize("cls", ALL)
def test_estimator_contract(cls, list_world):
    est = cls()
    with pytest.raises(NotFittedCalibratorError):
        est.predict_proba(list_world.X)
    params = est.get_params()
    twin = clone(est)
    assert twin.get_params() == params
    assert not any(k.endswith("_") for k in vars(est))
    assert est.fit(list_world.X, list_world.y, list_world.groups) is est


@pytest.mark.parametrize("cls", ALL)
def test_bad_input_raises_typed_errors(cls, list_world):
    X, y = list_world.X, list_world.y
    with pytest.raises(SingleClassError):
        cls().fit(X, np.zeros_like(y))
    Xbad = X.copy()
    Xbad[3, 0] = np.nan
    with pytest.raises(InvalidInputError):
        cls().fit(Xbad, y)
    with pytest.raises(InvalidInputError):
        cls().fit(X, y[:-1])
    with pytest.raises(InvalidInputError):
        cls().fit(X, np.where(y > 0, 2.0, 0.0))


def test_isotonic_monotone(fitted):
    s = np.linspace(-1, 1, 501)
    p = fitted["IsotonicCalibrator"].predict_proba(s)
    assert np.all(np.diff(p) >= 0)
    assert p.min() > 0 and p.max() < 1


def test_platt_recovers_known_temperature():
    rng = np.random.default_rng(5)
    s = rng.uniform(0.1, 0.9, 40_000)
    y = (rng.random(s.shape[0]) < expit(25.0 * (s - 0.55))).astype(float)
    m = PlattCalibrator().fit(s, y)
    assert m.a_ == pytest.approx(25.0, abs=3 * m.a_sd_ + 1e-9)
    assert m.b_ == pytest.approx(0.55, abs=3 * m.b_sd_ + 1e-9)
    assert m.a_sd_ < 1.0


def test_nt_recovers_known_parameters(nt_world):
    d = nt_world
    m = NormTemperedCalibrator(regime="confidence", prior_width="wide").fit(
        d.X, d.y, d.groups
    )
    assert m.prior_width_ == "wide"
    for name in ("gamma_q", "gamma_d", "beta_q", "beta_d", "beta0", "alpha"):
        est, sd = getattr(m, f"{name}_"), getattr(m, f"{name}_sd_")
        assert sd > 0
        assert abs(est - d.params[name]) < 2.5 * sd, (name, est, sd)


def test_nt_laplace_hessian_matches_finite_differences(list_world):
    # The posterior sd is only as good as the Hessian; compare the analytic one with
    # the Hessian of the MAP objective by central differences of the NLL.
    d = list_world
    m = NormTemperedCalibrator(regime="confidence", prior_width="tight").fit(
        d.X, d.y, d.groups
    )
    s, V, C = m._design(d.X)
    prec = 1.0 / m.prior_sd_**2

    def obj(th):
        z = np.exp(V @ th[:3]) * (s - C @ th[3:])
        return np.sum(np.logaddexp(0, z) - d.y * z) + 0.5 * np.sum(
            prec * (th - m.prior_mean_) ** 2
        )

    th0 = m.coef_.copy()
    h = 1e-4
    H = np.empty((6, 6))
    for i in range(6):
        for j in range(6):
            e_i, e_j = np.eye(6)[i] * h, np.eye(6)[j] * h
            H[i, j] = (
                obj(th0 + e_i + e_j)
                - obj(th0 + e_i - e_j)
                - obj(th0 - e_i + e_j)
                + obj(th0 - e_i - e_j)
            ) / (4 * h * h)
    np.testing.assert_allclose(np.linalg.inv(H), m.covariance_, rtol=0.05, atol=1e-8)


@settings(max_examples=40, deadline=None)
@given(
    lq=st.floats(-5, 5),
    ld=st.floats(-5, 5),
    rank=st.integers(1, 50),
    gap=st.floats(0, 1),
)
def test_nt_increasing_in_cosine_for_any_norms(fitted, lq, ld, rank, gap):
    s = np.linspace(-1, 1, 201)
    X = np.zeros((s.shape[0], len(FEATURES)))
    X[:, 0], X[:, 1], X[:, 2], X[:, 3], X[:, 4] = s, lq, ld, rank, gap
    for name in ("NormTemperedCalibrator", "ListAwareCalibrator"):
        z = fitted[name].decision_function(X)
        assert np.all(np.diff(z) > 0)


def _within_query_order_kept(model, X, groups):
    p = model.predict_proba(X)
    for g in np.unique(groups):
        rows = groups == g
        order = np.argsort(-X[rows, 0], kind="stable")
        assert np.all(np.diff(p[rows][order]) <= 1e-12)


@pytest.mark.parametrize("cls", [NormTemperedCalibrator, ListAwareCalibrator])
def test_query_side_only_never_reorders(cls, list_world):
    d = list_world
    m = cls(query_side_only=True).fit(d.X, d.y, d.groups)
    assert not m.reorders_hits
    assert m.gamma_d_ == 0.0 and m.beta_d_ == 0.0
    _within_query_order_kept(m, d.X, d.groups)
    assert cls().reorders_hits
    assert not PlattCalibrator().reorders_hits
    assert not IsotonicCalibrator().reorders_hits


def test_label_budget_fixes_centre_with_few_queries():
    d = simulate_judgments(12, rng=1, probe_link=0.1)
    m = NormTemperedCalibrator(regime="confidence").fit(d.X, d.y, d.groups)
    assert m.prior_width_ == "fixed"
    assert m.gamma_q_ == 0.5 and m.gamma_q_sd_ == 0.0
    assert m.beta_q_ == 0.0
    assert m.alpha_sd_ > 0


def test_regime_auto_uses_probe(list_world):
    d = list_world
    assert NormTemperedCalibrator(probe_rho=-0.3).fit(d.X, d.y).regime_ == "conflict"
    m = NormTemperedCalibrator().fit(d.X, d.y, d.groups)
    assert m.probe_rho_ is not None and m.regime_ == "confidence"
    assert NormTemperedCalibrator().fit(d.X, d.y).regime_ == "flat"


def test_prior_nt_not_worse_than_platt_with_few_queries():
    # theory.md 4.6: below ~30 queries NT with the prior centre is never worse than
    # Platt by more than noise. Average over draws of 10 labelled queries.
    test = simulate_judgments(400, rng=99, probe_link=0.05)
    diffs = []
    for rep in range(12):
        tr = simulate_judgments(10, rng=1000 + rep, probe_link=0.05)
        if tr.y.min() == tr.y.max():
            continue
        nt = NormTemperedCalibrator(regime="confidence").fit(tr.X, tr.y, tr.groups)
        pl = PlattCalibrator().fit(tr.X, tr.y)
        diffs.append(
            negative_log_likelihood(test.y, nt.predict_proba(test.X))
            - negative_log_likelihood(test.y, pl.predict_proba(test.X))
        )
    diffs_a = np.asarray(diffs)
    assert diffs_a.mean() < 2 * diffs_a.std() / np.sqrt(len(diffs_a)) + 1e-3


def test_list_terms_help_on_list_world(list_world):
    d = list_world
    test = simulate_judgments(300, rng=77, **d.params, probe_link=0.05)
    nt = NormTemperedCalibrator().fit(d.X, d.y, d.groups)
    ntl = ListAwareCalibrator().fit(d.X, d.y, d.groups)
    assert negative_log_likelihood(test.y, ntl.predict_proba(test.X)) < (
        negative_log_likelihood(test.y, nt.predict_proba(test.X))
    )
    assert ntl.delta_gap_ > 0


def test_nt_requires_three_columns(list_world):
    with pytest.raises(InvalidInputError):
        NormTemperedCalibrator().fit(list_world.X[:, :2], list_world.y)
    with pytest.raises(InvalidInputError):
        ListAwareCalibrator().fit(list_world.X[:, :3], list_world.y)
