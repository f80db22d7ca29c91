"""Issue 9 in the selection and the profile: the prior family, the ECE guard, the norm
verdict, and coherent confidence served by every profile (property-based)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibration import NormReference, fit_prior
from calibration.metrics import BINNING
from calibration.prior import coherent_confidence
from calibration.profile import (
    FALLBACK_ABSTAIN_THRESHOLD,
    Profile,
    fit_profile,
    prior_profile,
)
from calibration.selection import (
    ECE_GUARD,
    MethodScores,
    NormLift,
    SelectionRule,
    _auto,
    _Stage,
    select_calibrator,
)
from tests.calibration.test_prior import LEVELS, TRUE, domain
from tests.services.test_calibrators_unit import synthetic_evidence


@pytest.fixture(scope="module")
def prior():
    rng = np.random.default_rng(0)
    return fit_prior(
        {f"d{k}": domain(level, 150, rng)[:2] for k, level in enumerate(LEVELS)}
    )


def test_prior_family_is_chosen_with_few_queries_of_a_like_domain(prior):
    """Ten judged queries of a new domain with the shared shape: the prior fit wins."""
    X, y, groups = domain(-1.8, 10, np.random.default_rng(7))
    res = select_calibrator(X, y, groups, prior=prior, query_side_only=True)
    assert "prior" in res.cv and res.method == "prior"
    assert res.uses_norms is False


def test_prior_family_is_not_chosen_when_the_shape_differs_and_data_abound(prior):
    """Many queries of a domain whose cosine slope is far steeper: a free family wins
    by more than one SE, so the prior is not served."""
    rng = np.random.default_rng(3)
    X, _, groups = domain(-1.0, 300, rng)
    z = -1.0 + 5 * TRUE["cosine"] * (X[:, 0] - 0.5)  # five times the shared slope
    y = (rng.random(len(z)) < 1 / (1 + np.exp(-z))).astype(float)
    res = select_calibrator(X, y, groups, prior=prior, query_side_only=True)
    assert res.method != "prior"
    assert res.cv["prior"].nll > res.cv[res.method].nll


def test_without_a_prior_there_is_no_prior_family():
    X, y, groups = domain(-1.0, 40, np.random.default_rng(5))
    res = select_calibrator(X, y, groups, query_side_only=True)
    assert "prior" not in res.cv
    with pytest.raises(ValueError, match="prior"):
        select_calibrator(X, y, groups, method="prior")


def _guard_case(ece_iso: float) -> tuple[str, list[str]]:
    """isotonic clearly wins NLL over platt; its ECE is set to ``ece_iso``."""
    rng = np.random.default_rng(0)
    n_q, k = 200, 10
    codes = np.repeat(np.arange(n_q), k)
    y = (rng.random(n_q * k) < 0.3).astype(float)
    sharp = np.where(y == 1, 0.8, 0.1)
    flat = np.full_like(y, 0.3)
    oof = {"platt": flat, "isotonic": sharp}
    floor = {m: BINNING.noise_floor(p) for m, p in oof.items()}
    scores = {
        "platt": MethodScores("platt", 0.61, 0.21, floor["platt"], 0.5),
        "isotonic": MethodScores("isotonic", 0.2, 0.05, ece_iso, 0.9),
    }
    notes: list[str] = []
    unchanged = SelectionRule("recalibration", "not applied", "")
    stages = {
        m: _Stage(p, p, scores[m], scores[m], False, unchanged) for m, p in oof.items()
    }
    method, _ = _auto(("platt", "isotonic"), stages, y, codes, notes)
    return method, notes


def test_ece_guard_refuses_a_map_clearly_above_the_noise_floor():
    floor = BINNING.noise_floor(np.where(np.arange(10) % 2, 0.8, 0.1))
    method, notes = _guard_case(ece_iso=10 * ECE_GUARD * max(floor, 0.01))
    assert method == "platt"
    assert any("noise floor" in n for n in notes)


def test_ece_guard_keeps_a_map_at_its_noise_floor():
    method, notes = _guard_case(ece_iso=0.0)
    assert method == "isotonic" and not notes


def test_noise_floor_matches_simulated_perfect_calibration():
    """The analytic floor is close to the simulated ECE of a calibrated predictor."""
    from calibration.evaluation import ece_noise_floor

    p = np.random.default_rng(2).beta(0.5, 3.0, 3000)
    assert BINNING.noise_floor(p) == pytest.approx(ece_noise_floor(p), rel=0.25)


def test_norm_lift_without_a_clear_gain_drops_the_norm_terms():
    """Pure-noise norms: the report says "no measurable gain", the served model has
    no norm terms."""
    from calibration import simulate_judgments

    d = simulate_judgments(
        120, rng=11, gamma_q=0.0, gamma_d=0.0, beta_q=0.0, delta_gap=0.5
    )
    res = select_calibrator(d.X, d.y, d.groups)
    assert not res.norm_lift.norm_signal
    assert res.norm_lift.reason.startswith("no measurable gain")
    assert not res.uses_norms


# -- coherent confidence of every profile ------------------------------------------


@pytest.fixture(scope="module")
def profiles(prior) -> dict[str, Profile]:
    rng = np.random.default_rng(1)
    fitted = fit_profile(
        synthetic_evidence(60),
        doc_norms=rng.normal(3.0, 0.3, 500),
        doc_tokens=rng.integers(60, 256, 500),
        model="test-model",
        prior=prior,
    )
    X, y, groups = domain(-1.0, 50, rng)
    ref = NormReference().fit(rng.normal(5.0, 0.4, 200), rng.integers(8, 40, 200))
    default = prior_profile(
        prior,
        query_ref=ref,
        doc_ref=ref,
        model="test-model",
        held_out=(y, prior.predict_proba(X), groups),
        norm_lift=NormLift("prior", 0.0, 0.0, 0.0, 0.0, False, "none"),
        profile_id="default-test",
    )
    return {"fitted": fitted, "default": default}


@settings(max_examples=60, deadline=None)
@given(
    which=st.sampled_from(["fitted", "default"]),
    seed=st.integers(0, 10_000),
    k=st.integers(1, 30),
)
def test_served_confidence_is_coherent_for_every_k(profiles, which, seed, k):
    """Non-decreasing in k, at least the largest hit probability, at most the sum."""
    profile = profiles[which]
    rng = np.random.default_rng(seed)
    cos = np.sort(rng.uniform(0.1, 0.9, k))[::-1]
    norms, tokens = rng.normal(3.0, 0.3, k), rng.integers(20, 300, k)
    q_norm, q_tokens = float(rng.normal(5.0, 0.5)), int(rng.integers(3, 40))
    previous = 0.0
    for j in range(1, k + 1):
        s = profile.score(q_norm, q_tokens, cos[:j], norms[:j], tokens[:j])
        p = s.probabilities
        assert p.max() - 1e-12 <= s.confidence <= min(1.0, p.sum()) + 1e-12
        assert s.confidence >= previous - 1e-12
        previous = s.confidence
        if s.confidence_interval is not None:
            lo, hi = s.confidence_interval
            assert lo - 1e-12 <= s.confidence <= hi + 1e-12


# -- day one: the shipped default's confidence and abstain rule --------------------


def test_day_one_confidence_is_the_best_hit_and_abstain_reads_the_level_interval(
    profiles,
):
    from scipy.special import expit, logit

    default, fitted = profiles["default"], profiles["fitted"]
    assert fitted.day_one_threshold is None  # a fit has its own rules
    prior = default.prior
    assert prior is not None
    half = prior.quantile * prior.predictive_level_sd
    threshold = default.day_one_threshold
    assert threshold == pytest.approx(float(expit(-half)))
    assert 0 < threshold < FALLBACK_ABSTAIN_THRESHOLD
    rng = np.random.default_rng(7)
    for _ in range(200):
        p = rng.uniform(0, 0.3, int(rng.integers(1, 12))) ** rng.uniform(0.5, 3)
        lo, hi = p / 3, np.minimum(1.0, p * 5)
        s = default.verdict(p, (lo, hi))
        assert s.confidence == pytest.approx(p.max())  # weight 0 on day one
        # Abstain exactly when, at the upper end of the level interval, the best
        # hit is more likely irrelevant than relevant.
        at_top_level = expit(logit(p.max()) + half)
        assert s.abstain == bool(at_top_level < FALLBACK_ABSTAIN_THRESHOLD)
        assert s.confidence_interval is not None
        low, high = s.confidence_interval
        assert low == pytest.approx(lo.max())
        assert high == pytest.approx(coherent_confidence(hi, default.confidence_weight))
    # A fitted profile blends its hits and keeps the interval rule.
    p = np.array([0.3, 0.2, 0.2])
    s = fitted.verdict(p)
    assert s.confidence == pytest.approx(
        coherent_confidence(p, fitted.confidence_weight)
    )
    policy = fitted.certified_policy
    cut = FALLBACK_ABSTAIN_THRESHOLD if policy is None else policy.threshold
    assert s.abstain == (s.confidence < cut)


def test_day_one_abstains_below_the_threshold_not_at_it(profiles):
    default = profiles["default"]
    threshold = default.day_one_threshold
    assert threshold is not None
    below = float(np.nextafter(threshold, 0.0))
    for best, abstain in ((threshold, False), (below, True), (0.9, False), (0, True)):
        p = np.array([best, best / 2, best / 4])
        assert default.verdict(p).abstain is abstain, best
        assert default.verdict(p, (p / 2, np.minimum(1, p * 4))).abstain is abstain
    # Round-tripped (stored, exported) it keeps the rule.
    again = Profile.from_json(default.to_json())
    assert again.day_one_threshold == pytest.approx(threshold, rel=1e-12)


@pytest.mark.parametrize(
    ("file", "documented"),
    [("all-minilm-l6-v2.json", 0.076), ("_agnostic.json", 0.062)],
)
def test_shipped_day_one_thresholds_are_the_documented_ones(file, documented):
    """docs/calibration.md (day one) names them; a new shipped prior updates both."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "app" / "profiles" / file
    profile = Profile.from_json(json.loads(path.read_text(encoding="utf-8")))
    assert profile.default and profile.certified_policy is None
    assert round(profile.day_one_threshold, 3) == documented
