"""Other retrievers' lists: their order, stand-in scores and nDCG (pure maths)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calibration.evaluation import ndcg_at_k
from calibration.external import ndcg_of_order, rank_scores, rerank_order
from calibration.features import FEATURES, pair_features


def test_rerank_order_is_by_probability_ties_in_list_order():
    assert rerank_order([0.2, 0.9, 0.2, 0.5]).tolist() == [1, 3, 0, 2]
    assert rerank_order([0.3, 0.3, 0.3]).tolist() == [0, 1, 2]


def test_rank_scores_give_rank_linear_gaps():
    X = pair_features([0.1, 0.5, 0.3, 0.2], 0.0, [0.0] * 4, input_scores=rank_scores(4))
    np.testing.assert_allclose(X[:, FEATURES.index("in_gap")], [0, 1 / 3, 2 / 3, 1])
    assert rank_scores(1).tolist() == [1.0]


@pytest.mark.parametrize("seed", range(5))
def test_ndcg_of_order_agrees_with_the_evaluation_s(seed):
    rng = np.random.default_rng(seed)
    gains = rng.integers(0, 3, 12).astype(float)
    judged = {f"d{i}": int(g) for i, g in enumerate(gains)} | {"far": 2, "zero": 0}
    order = rng.permutation(12)
    ranked = [f"d{i}" for i in order]
    expected = ndcg_at_k(ranked, judged, 10)
    got = ndcg_of_order(gains, order, list(judged.values()), 10)
    assert got == pytest.approx(expected)


def test_ndcg_of_order_is_nan_without_a_relevant_document():
    assert math.isnan(ndcg_of_order([0.0, 0.0], [0, 1], [0.0]))
