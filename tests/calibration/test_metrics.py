from __future__ import annotations

import numpy as np
import pytest
from sklearn.calibration import calibration_curve
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score

from calibration.exceptions import InvalidInputError
from calibration.metrics import (
    auroc,
    brier_score,
    expected_calibration_error,
    negative_log_likelihood,
    reliability_by_tercile,
    reliability_curve,
)


@pytest.fixture(scope="module")
def preds():
    rng = np.random.default_rng(7)
    p = rng.beta(1.0, 3.0, size=3000)
    y = (rng.random(3000) < p**0.8).astype(float)
    return y, p


def test_brier_nll_auroc_agree_with_sklearn(preds):
    y, p = preds
    assert brier_score(y, p) == pytest.approx(brier_score_loss(y, p), rel=1e-12)
    assert negative_log_likelihood(y, p) == pytest.approx(log_loss(y, p), rel=1e-9)
    assert auroc(y, p) == pytest.approx(roc_auc_score(y, p), rel=1e-12)


@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
def test_reliability_curve_agrees_with_sklearn(preds, strategy):
    y, p = preds
    curve = reliability_curve(y, p, n_bins=15, strategy=strategy)
    prob_true, prob_pred = calibration_curve(y, p, n_bins=15, strategy=strategy)
    np.testing.assert_allclose(curve.observed_frequency, prob_true, rtol=1e-12)
    np.testing.assert_allclose(curve.mean_predicted, prob_pred, rtol=1e-12)
    assert curve.counts.sum() == y.shape[0]
    ece = np.sum(curve.counts * np.abs(prob_true - prob_pred)) / y.shape[0]
    assert expected_calibration_error(y, p, strategy=strategy) == pytest.approx(ece)


def test_ece_zero_for_perfect_bins_and_positive_for_miscalibration():
    y = np.array([0, 1, 0, 1, 1, 1, 1, 0], dtype=float)
    p = np.array([0.5] * 4 + [0.75] * 4)
    assert expected_calibration_error(y, p, n_bins=2) == pytest.approx(0.0)
    assert expected_calibration_error(y, np.full(8, 0.99), n_bins=2) > 0.3


def test_equal_mass_bins_have_equal_counts():
    rng = np.random.default_rng(0)
    p = rng.random(1500)
    y = (rng.random(1500) < p).astype(float)
    curve = reliability_curve(y, p, n_bins=15, strategy="quantile")
    assert np.all(curve.counts == 100)


def test_nll_is_finite_for_confident_mistakes():
    assert np.isfinite(negative_log_likelihood([1.0, 0.0], [0.0, 1.0]))


def test_auroc_single_class_is_nan():
    assert np.isnan(auroc([1.0, 1.0], [0.2, 0.3]))


@pytest.mark.parametrize(
    ("y", "p"),
    [
        ([0, 1], [0.5, 1.2]),
        ([0, 2], [0.5, 0.5]),
        ([0, 1], [0.5]),
        ([0, 1], [np.nan, 0.1]),
    ],
)
def test_bad_metric_input(y, p):
    with pytest.raises(InvalidInputError):
        brier_score(y, p)


def test_reliability_by_tercile_detects_norm_dependent_miscalibration():
    rng = np.random.default_rng(11)
    n = 6000
    ell = rng.uniform(-1, 1, n)
    p_true = rng.uniform(0.05, 0.95, n)
    y = (rng.random(n) < p_true).astype(float)
    # A norm-blind map that is too high for short and too low for long queries.
    p_hat = np.clip(p_true - 0.15 * ell, 0.0, 1.0)
    rep = reliability_by_tercile(y, p_hat, ell)
    assert rep.counts == (2000, 2000, 2000)
    assert rep.mean_gap[0] > 0.05
    assert rep.mean_gap[2] < -0.05
    calibrated = reliability_by_tercile(y, p_true, ell)
    assert max(abs(g) for g in calibrated.mean_gap) < 0.03
