from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibration.exceptions import (
    InsufficientDataError,
    InvalidInputError,
    NotFittedCalibratorError,
)
from calibration.features import (
    FEATURES,
    NormReference,
    list_features,
    pair_features,
    regime_from_rho,
    sign_probe,
    stack_pair_features,
)


def _norm_sample(n: int, seed: int = 0, slope: float = -0.3):
    rng = np.random.default_rng(seed)
    n_tok = rng.integers(3, 300, size=n).astype(float)
    resid = 0.1 * rng.standard_normal(n)
    norms = np.exp(1.5 + slope * np.log(n_tok) + resid)
    return norms, n_tok, resid


def test_feature_order_contract():
    assert FEATURES[:3] == ("cosine", "ell_q", "ell_d")
    assert set(FEATURES) == {
        "cosine",
        "ell_q",
        "ell_d",
        "rank",
        "gap",
        "len_q",
        "len_d",
        "lex",
        "lex_rel",
        "lex_rank",
        "in_rank",
        "in_gap",
    }


def test_order_columns_read_the_list_as_handed_over():
    cosines = [0.5, 0.9, 0.7]
    X = pair_features(cosines, 0.0, [0.0] * 3, input_scores=[12.0, 7.0, 2.0])
    np.testing.assert_array_equal(X[:, FEATURES.index("in_rank")], [1.0, 2.0, 3.0])
    np.testing.assert_allclose(X[:, FEATURES.index("in_gap")], [0.0, 0.5, 1.0])
    # The retriever's scale is unknown: an increasing affine map changes nothing.
    Y = pair_features(cosines, 0.0, [0.0] * 3, input_scores=[-3.0, -8.0, -13.0])
    np.testing.assert_allclose(X, Y)
    # normcal's own list: its cosines are the scores.
    own = pair_features(cosines, 0.0, [0.0] * 3)
    np.testing.assert_allclose(own[:, FEATURES.index("in_gap")], [1.0, 0.0, 0.5])
    flat = pair_features(cosines, 0.0, [0.0] * 3, input_scores=[1.0, 1.0, 1.0])
    np.testing.assert_array_equal(flat[:, FEATURES.index("in_gap")], 0.0)
    with pytest.raises(InvalidInputError):
        pair_features(cosines, 0.0, [0.0] * 3, input_scores=[1.0, 2.0])


def test_reference_removes_length_and_standardises():
    norms, n_tok, resid = _norm_sample(2000)
    ref = NormReference().fit(norms, n_tok)
    assert not ref.unit_norm_
    assert ref.slope_ == pytest.approx(-0.3, abs=0.02)
    assert ref.residual_sd_ == pytest.approx(0.1, rel=0.1)
    ell = ref.transform(norms, n_tok)
    # ell is the residual in units of 2 robust SDs: it tracks the true residual
    # and not the length.
    assert np.corrcoef(ell, resid)[0, 1] > 0.98
    assert abs(np.corrcoef(ell, np.log(n_tok))[0, 1]) < 0.05
    assert np.median(np.abs(ell)) == pytest.approx(0.5 * 0.6745, abs=0.05)
    assert np.all(np.abs(ell) <= ref.clip)


def test_reference_clips_outliers():
    norms, n_tok, _ = _norm_sample(200)
    ref = NormReference(clip=1.0).fit(norms, n_tok)
    out = ref.transform([1e6, 1e-6], [10, 10])
    np.testing.assert_array_equal(out, [1.0, -1.0])


def test_reference_small_sample_and_equal_token_counts():
    rng = np.random.default_rng(1)
    norms = np.exp(0.1 * rng.standard_normal(20))
    ref = NormReference().fit(norms, np.full(20, 12.0))
    assert ref.slope_ == 0.0
    ell = ref.transform(norms, np.full(20, 12.0))
    assert np.median(ell) == pytest.approx(0.0, abs=1e-12)
    assert np.all(np.isfinite(ell))


def test_unit_norm_input_gives_zero_ell():
    n_tok = np.arange(1, 51, dtype=float)
    ref = NormReference().fit(np.ones(50) + 1e-5, n_tok)
    assert ref.unit_norm_
    np.testing.assert_array_equal(ref.transform([1.0, 1.0], [3, 40]), [0.0, 0.0])


def test_length_feature_is_centred_log_length():
    norms, n_tok, _ = _norm_sample(101)
    ref = NormReference().fit(norms, n_tok)
    lf = ref.length_feature(n_tok)
    assert np.median(lf) == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(np.diff(ref.length_feature([10, 20])), np.log(2.0))


@pytest.mark.parametrize(
    ("norms", "n_tok", "exc"),
    [
        ([1.0, np.nan, 2.0, 1.0, 1.0], [1, 2, 3, 4, 5], InvalidInputError),
        ([1.0, -1.0, 2.0, 1.0, 1.0], [1, 2, 3, 4, 5], InvalidInputError),
        ([1.0, 1.0, 2.0, 1.0, 1.0], [1, 0, 3, 4, 5], InvalidInputError),
        ([1.0, 1.0, 2.0], [1, 2], InvalidInputError),
        ([1.0, 1.1], [1, 2], InsufficientDataError),
    ],
)
def test_reference_rejects_bad_input(norms, n_tok, exc):
    with pytest.raises(exc):
        NormReference().fit(norms, n_tok)


def test_reference_not_fitted():
    with pytest.raises(NotFittedCalibratorError):
        NormReference().transform([1.0], [3])


def test_list_and_pair_features():
    scores = np.array([0.9, 0.7, 0.8])
    lf = list_features(scores)
    np.testing.assert_array_equal(lf.rank, [1.0, 3.0, 2.0])
    np.testing.assert_allclose(lf.gap, [0.0, 0.2, 0.1])
    assert lf.top == 0.9
    assert lf.margin == pytest.approx(0.1)
    assert lf.std == pytest.approx(np.std(scores))
    X = pair_features(scores, 0.3, [0.1, 0.2, 0.3], 0.5, [1.0, 2.0, 3.0])
    assert X.shape == (3, len(FEATURES))
    assert X.dtype == np.float64
    np.testing.assert_array_equal(X[:, FEATURES.index("cosine")], scores)
    np.testing.assert_array_equal(X[:, FEATURES.index("ell_q")], 0.3)
    np.testing.assert_array_equal(X[:, FEATURES.index("len_d")], [1.0, 2.0, 3.0])


def test_pair_features_rejects_mismatch():
    with pytest.raises(InvalidInputError):
        pair_features([0.9, 0.8], 0.0, [0.1])
    with pytest.raises(InvalidInputError):
        pair_features([0.9, np.inf], 0.0, [0.1, 0.2])


def test_stack_pair_features_groups():
    X, groups = stack_pair_features(
        [[0.9, 0.5], [0.7, 0.6, 0.1]], [0.1, -0.2], [[0.0, 0.1], [0.2, 0.3, 0.4]]
    )
    assert X.shape == (5, len(FEATURES))
    np.testing.assert_array_equal(groups, [0, 0, 1, 1, 1])
    np.testing.assert_array_equal(X[:, 1], [0.1, 0.1, -0.2, -0.2, -0.2])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=1, max_size=30))
def test_rank_gap_properties(scores):
    lf = list_features(scores)
    assert sorted(lf.rank.tolist()) == list(range(1, len(scores) + 1))
    assert np.all(lf.gap >= 0)
    assert lf.gap[lf.rank == 1][0] == 0.0


def test_sign_probe_and_regimes():
    rng = np.random.default_rng(3)
    ell = rng.standard_normal(500)
    assert sign_probe(ell, ell + 0.5 * rng.standard_normal(500)) > 0.5
    assert sign_probe(ell, -ell) == pytest.approx(-1.0)
    assert sign_probe(np.zeros(10), np.arange(10.0)) == 0.0
    assert regime_from_rho(0.2) == "confidence"
    assert regime_from_rho(-0.2) == "conflict"
    assert regime_from_rho(0.05) == "flat"
