from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import BaseEstimator

from calibration.exceptions import (
    InsufficientDataError,
    InvalidInputError,
    SingleClassError,
)
from calibration.metrics import negative_log_likelihood
from calibration.models import ListAwareCalibrator, NormTemperedCalibrator
from calibration.selection import (
    METHODS,
    cross_val_predict_grouped,
    make_calibrator,
    select_calibrator,
)
from calibration.simulate import simulate_judgments


@pytest.fixture(scope="module")
def auto_result(list_world):
    d = list_world
    return select_calibrator(d.X, d.y, d.groups)


@pytest.mark.slow
def test_auto_reports_every_method(auto_result, list_world):
    # Its speed is measured by benchmarks/fit_speed.py, not asserted here.
    res = auto_result
    assert set(res.cv) == set(METHODS)
    for m, sc in res.cv.items():
        assert sc.method == m
        assert np.isfinite([sc.nll, sc.brier, sc.ece, sc.auroc]).all()
    assert res.n_queries == 300 and res.n_pairs == list_world.X.shape[0]
    assert res.oof_proba.shape == list_world.y.shape


def test_auto_keeps_best_nll_and_list_model_wins_on_list_world(auto_result):
    res = auto_result
    assert res.method == "nt-list"
    assert res.cv["nt-list"].nll == min(sc.nll for sc in res.cv.values())
    assert isinstance(res.estimator, ListAwareCalibrator)
    assert res.uses_norms
    lift = res.norm_lift
    assert lift.norm_signal
    assert lift.nll_with < lift.nll_without
    assert set(lift.variants) == {"none", "length", "residual", "length+residual"}
    gq, gq_sd = lift.terms["gamma_q"]
    assert gq_sd > 0 and abs(gq) > 2 * gq_sd


def test_unit_norms_fall_back_to_norm_free(list_world):
    d = list_world
    X = d.X.copy()
    X[:, 1:3] = 0.0
    res = select_calibrator(X, d.y, d.groups)
    assert not res.uses_norms
    assert not res.norm_lift.norm_signal
    assert res.norm_lift.terms == {}
    assert res.cv["nt"].nll == res.cv["platt"].nll


@pytest.mark.slow
def test_norm_free_world_does_not_keep_norm_terms():
    d = simulate_judgments(
        250, rng=4, gamma_q=0.0, gamma_d=0.0, beta_q=0.0, delta_gap=0.5
    )
    res = select_calibrator(d.X, d.y, d.groups)
    # Pure noise norms: either CV rejects them or the 2-sd rule does.
    assert not res.uses_norms


@pytest.mark.slow
def test_named_method_is_served(list_world):
    d = list_world
    res = select_calibrator(d.X, d.y, d.groups, method="nt", query_side_only=True)
    assert res.method == "nt"
    assert isinstance(res.estimator, NormTemperedCalibrator)
    assert not res.estimator.reorders_hits


def test_selection_input_errors(list_world):
    d = list_world
    with pytest.raises(InsufficientDataError) as ei:
        rows = d.groups < 3
        select_calibrator(d.X[rows], d.y[rows], d.groups[rows])
    assert ei.value.n_queries == 3 and ei.value.required == 5
    with pytest.raises(SingleClassError):
        select_calibrator(d.X, np.ones_like(d.y), d.groups)
    with pytest.raises(InvalidInputError):
        select_calibrator(d.X, d.y, d.groups, method="magic")
    with pytest.raises(InvalidInputError):
        select_calibrator(d.X[:, :3], d.y, d.groups)
    with pytest.raises(InvalidInputError):
        select_calibrator(d.X, d.y, d.groups[:-1])
    with pytest.raises(InvalidInputError):
        make_calibrator("magic")


class QueryMemoriser(BaseEstimator):
    """Near-certain for any row of a query it was fitted on, 1/2 for unseen queries.

    Column 0 of ``X`` carries the query id, so a prediction is 1/2 exactly when the
    row's query was absent from the training fold.
    """

    def fit(self, X, y, groups):
        self.seen_ = np.unique(X[:, 0])
        return self

    def predict_proba(self, X):
        return np.where(np.isin(X[:, 0], self.seen_), 0.999, 0.5)


def test_cross_val_predict_grouped_is_out_of_fold(list_world):
    d = list_world
    X = d.X.copy()
    X[:, 0] = d.groups  # let the memoriser recognise each query
    p = cross_val_predict_grouped(QueryMemoriser(), X, d.y, d.groups)
    # Every pair was predicted by a model that never saw any pair of its query.
    np.testing.assert_array_equal(p, np.full(d.y.shape, 0.5))


@pytest.mark.slow
def test_nested_evaluation_selects_inside_each_training_fold(list_world):
    # The service's eval: outer grouped CV, selection inside each training fold.
    from sklearn.model_selection import GroupKFold

    d = list_world
    held_out = np.full(d.y.shape, np.nan)
    folds = list(GroupKFold(n_splits=3).split(d.X, d.y, d.groups))
    for i, (tr, te) in enumerate(folds):
        res = select_calibrator(d.X[tr], d.y[tr], d.groups[tr], n_splits=3)
        # Selection counted the training fold's queries only, whatever their ids.
        assert res.n_queries == len(np.unique(d.groups[tr]))
        assert res.n_pairs == len(tr) and res.oof_proba.shape == (len(tr),)
        assert res.method in METHODS
        if i == 0:
            # Query ids are names, not positions: renaming them changes nothing.
            renamed = select_calibrator(
                d.X[tr], d.y[tr], 7 * d.groups[tr] + 1000, n_splits=3
            )
            assert renamed.method == res.method and renamed.cv == res.cv
        held_out[te] = res.estimator.predict_proba(d.X[te])
    # Each pair is predicted exactly once, by a model chosen without its query, and
    # the choice carries to unseen queries: far better than the base rate.
    assert np.all(np.isfinite(held_out))
    base = d.y.mean()
    assert negative_log_likelihood(d.y, held_out) < 0.8 * negative_log_likelihood(
        d.y, np.full(d.y.shape, base)
    )


def test_auto_serves_platt_when_the_gain_is_within_one_standard_error():
    # A Platt world (no norm, no list effect) with few queries: seed 2 makes nt win
    # CV NLL by noise; the one-standard-error rule must serve Platt and say so.
    d = simulate_judgments(40, rng=2, gamma_q=0.0, gamma_d=0.0, beta_q=0.0)
    res = select_calibrator(d.X, d.y, d.groups)
    assert res.cv["nt"].nll < res.cv["platt"].nll
    assert res.method == "platt"
    assert any("one standard error" in note for note in res.notes)


def test_clear_gain_is_a_paired_per_query_test():
    from calibration.metrics import clear_nll_gain as _clear_gain

    rng = np.random.default_rng(0)
    codes = np.repeat(np.arange(50), 10)
    y = (rng.uniform(size=500) < 0.3).astype(float)
    base = np.full(500, 0.3)
    assert not _clear_gain(base, base, y, codes)  # no gain at all
    better = np.where(y == 1, 0.6, 0.15)  # consistently better on every query
    assert _clear_gain(better, base, y, codes)
    noisy = np.clip(base + rng.normal(0, 0.05, 500), 0.01, 0.99)
    assert not _clear_gain(noisy, base, y, codes)
