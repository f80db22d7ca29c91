"""The rank guard of ``auto`` (issue 36, part 2): a map chosen for its probabilities must
not throw away the evidence that orders hits.

Simulated lexical-heavy worlds: the cosine says little, BM25 says much (a catalogue of
short titles). Search orders a hybrid pool by the served probabilities, so a cosine-only
map served there would rank like the dense list alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from calibration import simulate_judgments
from calibration.fusion import pair_rrf
from calibration.metrics import BINNING, per_query_ndcg
from calibration.models import IsotonicCalibrator, ListAwareCalibrator
from calibration.selection import (
    ECE_GUARD,
    SelectionRule,
    _auto,
    _pairs,
    _rank_guard,
    _Stage,
    _stage,
    cross_val_predict_grouped,
    select_calibrator,
)

SEED = 20261206
# A weak cosine (a low temperature) and strong lexical shifts.
LEXICAL_HEAVY = {
    "alpha": float(np.log(4.0)),
    "gamma_q": 0.0,
    "gamma_d": 0.0,
    "beta_q": 0.0,
    "delta_lex": -1.2,
    "delta_lex_rel": -0.6,
    "delta_lex_rank": 0.15,
}
COSINE_ONLY, LEXICAL = "isotonic", "nt-list"


@pytest.fixture(scope="module")
def world():
    return simulate_judgments(120, rng=SEED, lexical=True, **LEXICAL_HEAVY)


@pytest.fixture(scope="module")
def stages(world):
    """Each family's held-out candidate, from real grouped cross-validation."""
    d = world
    data = _pairs(d.X, d.y, d.groups, 5)
    families = {
        COSINE_ONLY: IsotonicCalibrator(),
        LEXICAL: ListAwareCalibrator(use_norms=False, use_lexical=True),
    }
    return {
        m: _stage(m, cross_val_predict_grouped(t, d.X, d.y, d.groups), data)
        for m, t in families.items()
    }


def _mean_ndcg(world, p) -> float:
    return float(np.nanmean(per_query_ndcg(world.y, p, world.groups, world.X[:, 0])))


def _guard(method: str, stages: dict[str, _Stage], world) -> tuple[SelectionRule, str]:
    """The rank guard on ``world``'s pairs: cosine ties, RRF of the two lists."""
    d = world
    return _rank_guard(
        method, tuple(stages), stages, d.y, d.groups, d.X[:, 0], pair_rrf(d.X)
    )


def _best_nll(stage: _Stage, nll: float) -> _Stage:
    """``stage`` with a better held-out NLL and ECE 0 (the map auto picks first)."""
    better = dataclasses.replace(stage.scores, nll=nll, ece=0.0)
    return dataclasses.replace(stage, raw_scores=better, recal_scores=better)


def test_the_world_is_lexical_heavy(world, stages):
    """Precondition: held out, the lexical map orders far better than the cosine one."""
    assert (
        _mean_ndcg(world, stages[LEXICAL].oof)
        > _mean_ndcg(world, stages[COSINE_ONLY].oof) + 0.1
    )
    s = stages[LEXICAL]
    assert s.scores.ece <= ECE_GUARD * BINNING.noise_floor(s.oof)


def test_a_cosine_only_map_chosen_for_its_nll_does_not_set_the_order(world, stages):
    """The issue's case: isotonic on the cosine won the NLL by a hair; the order it
    imposes would throw the lexical evidence away, so the lexical map is served."""
    lexical_nll = stages[LEXICAL].scores.nll
    chosen = {**stages, COSINE_ONLY: _best_nll(stages[COSINE_ONLY], lexical_nll - 1e-3)}
    notes: list[str] = []
    methods = (COSINE_ONLY, LEXICAL)  # isotonic is the baseline of the one-SE rule
    method, rules = _auto(methods, chosen, world.y, world.groups, notes, X=world.X)
    assert [r.rule for r in rules] == ["one-se", "ece-guard", "rank-guard"]
    assert rules[0].outcome == "best is the baseline"  # the NLL picked isotonic
    assert rules[1].outcome == "at its floor"
    assert rules[2].outcome == "switched" and method == LEXICAL
    assert "nDCG@10" in rules[2].detail and any("serving nt-list" in n for n in notes)


def test_the_served_order_keeps_up_with_a_plain_fusion(world, stages):
    """What the guard serves orders held-out judged hits at least as well as RRF of
    the same two lists, and far better than the cosine-only map."""
    chosen = {**stages, COSINE_ONLY: _best_nll(stages[COSINE_ONLY], 0.0)}
    _, served = _guard(COSINE_ONLY, chosen, world)
    order = _mean_ndcg(world, chosen[served].oof)
    assert order >= _mean_ndcg(world, pair_rrf(world.X))
    assert order > _mean_ndcg(world, chosen[COSINE_ONLY].oof) + 0.1


def test_the_guard_never_serves_a_map_above_its_ece_floor(world, stages):
    """A better order is no reason to serve probabilities that do not hold."""
    off = dataclasses.replace(stages[LEXICAL].scores, ece=1.0)
    chosen = {
        COSINE_ONLY: _best_nll(stages[COSINE_ONLY], 0.0),
        LEXICAL: dataclasses.replace(stages[LEXICAL], raw_scores=off, recal_scores=off),
    }
    rule, method = _guard(COSINE_ONLY, chosen, world)
    assert method == COSINE_ONLY and rule.outcome == "kept"


def test_within_one_standard_error_the_choice_stands(world, stages):
    """Two maps that order alike: no switch on noise (the one-SE rule)."""
    p = stages[LEXICAL].oof
    rng = np.random.default_rng(SEED)
    twin = dataclasses.replace(
        stages[LEXICAL], raw=p * (1 + 1e-9 * rng.random(p.shape)), used=False
    )
    chosen = {LEXICAL: stages[LEXICAL], "twin": twin}
    rule, method = _guard(LEXICAL, chosen, world)
    assert method == LEXICAL and rule.outcome == "kept"


def test_auto_on_a_lexical_heavy_world_orders_by_the_lexical_evidence(world):
    """End to end: whatever ``auto`` serves, it ranks fresh queries of the same world
    better than the cosine order and no worse than RRF of the two lists."""
    fresh = simulate_judgments(120, rng=SEED + 1, lexical=True, **LEXICAL_HEAVY)
    res = select_calibrator(world.X, world.y, world.groups)
    why = res.why
    assert why is not None and "rank-guard" in [r.rule for r in why.rules]
    served = _mean_ndcg(fresh, res.estimator.predict_proba(fresh.X))
    cosine = _mean_ndcg(fresh, fresh.X[:, 0])
    assert served >= _mean_ndcg(fresh, pair_rrf(fresh.X))
    assert served > cosine + 0.1


def test_per_query_ndcg_orders_by_probability_then_the_tie_breaker():
    y = np.array([0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    codes = np.array([0, 0, 0, 1, 1, 2, 2])
    p = np.array([0.2, 0.9, 0.5, 0.4, 0.4, 0.1, 0.3])
    tie = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    out = per_query_ndcg(y, p, codes, tie)
    assert out[0] == pytest.approx(1.0)
    assert np.isnan(out[1]) and np.isnan(out[2])  # one class: no order to judge
    worst = per_query_ndcg(y, 1.0 - p, codes, tie)[0]
    assert worst == pytest.approx(1.0 / np.log2(4))
    # A tie in p falls back to the tie breaker, descending (the cosine).
    tied = per_query_ndcg(y[:3], np.full(3, 0.5), codes[:3], np.array([0.1, 0.3, 0.2]))
    assert tied[0] == pytest.approx(1.0)
