"""Cross-domain prior, few-label fit, coherent confidence and the norm-lift rule.

Synthetic domains share one slope vector and differ in their level (intercept), the
structure the prior assumes; the oracles are the known slopes and levels.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import expit, logit
from scipy.stats import t as student_t

from calibration import (
    CrossDomainPrior,
    PriorCalibrator,
    coherent_confidence,
    fit_prior,
    interval_coverage,
    negative_log_likelihood,
    norm_lift_verdict,
)
from calibration.exceptions import InvalidInputError, UnsupportedFormatError
from calibration.features import FEATURES
from calibration.prior import lodo_calibrate, t_location_scale

K_HITS = 20
# True raw slopes on cosine, log(rank), gap, len_q.
TRUE = {"cosine": 12.0, "rank": -0.6, "gap": -4.0, "len_q": 0.3}


def domain(
    level: float,
    n_queries: int,
    rng: np.random.Generator,
    *,
    gamma_q: float = 0.0,
    cos_mean: float = 0.5,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs of one synthetic domain: X in FEATURES order, labels, query ids.

    ``logit P = level + sum(TRUE * phi) + gamma_q * ell_q``, with the cosine centred at
    ``cos_mean`` so the logit is moderate.
    """
    s = np.sort(rng.normal(cos_mean, 0.08, (n_queries, K_HITS)), axis=1)[:, ::-1]
    s += rng.normal(0.0, 0.05, (n_queries, 1))  # query-level offset
    rank = np.tile(np.arange(1, K_HITS + 1, dtype=float), (n_queries, 1))
    gap = s[:, :1] - s
    len_q = np.repeat(rng.normal(0.0, 0.5, (n_queries, 1)), K_HITS, axis=1)
    ell_q = np.repeat(rng.normal(0.0, 1.0, (n_queries, 1)), K_HITS, axis=1)
    z = (
        level
        + TRUE["cosine"] * (s - cos_mean)
        + TRUE["rank"] * np.log(rank)
        + TRUE["gap"] * gap
        + TRUE["len_q"] * len_q
        + gamma_q * ell_q
    )
    y = (rng.random(z.shape) < expit(z)).astype(float)
    cols = {
        "cosine": s,
        "ell_q": ell_q,
        "ell_d": np.zeros_like(s),
        "rank": rank,
        "gap": gap,
        "len_q": len_q,
        "len_d": np.zeros_like(s),
        "lex": np.zeros_like(s),
        "lex_rel": np.zeros_like(s),
        "lex_rank": np.full_like(s, 101.0),
        "in_rank": rank,
        "in_gap": gap / np.maximum(np.ptp(s, axis=1, keepdims=True), 1e-12),
    }
    X = np.column_stack([cols[f].ravel() for f in FEATURES])
    groups = np.repeat(np.arange(n_queries), K_HITS)
    return X, y.ravel(), groups


def raw_slopes(prior: CrossDomainPrior) -> np.ndarray:
    return np.array(prior.slope) / np.array(prior.scale)


def raw_level(prior: CrossDomainPrior, coef: np.ndarray) -> float:
    """A ``[level, slopes]`` vector's level on the generator's scale (cosine centred
    at 0.5, the other features at 0)."""
    center = np.array(prior.center)
    center[0] -= 0.5
    return float(coef[0] - (coef[1:] / np.array(prior.scale)) @ center)


def raw_levels(prior: CrossDomainPrior) -> np.ndarray:
    return np.array(
        [raw_level(prior, np.array([c, *prior.slope])) for c in prior.levels]
    )


LEVELS = np.array([-3.0, -2.2, -1.5, -1.0, -0.4, 0.2])


@pytest.fixture(scope="module")
def prior() -> CrossDomainPrior:
    rng = np.random.default_rng(0)
    sets = {}
    for k, level in enumerate(LEVELS):
        X, y, _ = domain(level, 150, rng)
        sets[f"d{k}"] = (X, y)
    return fit_prior(sets)


def test_prior_recovers_shared_slopes_and_level_distribution(prior):
    np.testing.assert_allclose(raw_slopes(prior), list(TRUE.values()), rtol=0.25)
    np.testing.assert_allclose(raw_levels(prior), LEVELS, atol=0.3)
    assert prior.level_sd == pytest.approx(LEVELS.std(ddof=1), rel=0.2)
    assert prior.n_domains == len(LEVELS)


def test_zero_label_intervals_cover_new_domains_at_about_the_nominal_rate(prior):
    """Levels drawn from the training levels' distribution land in the interval."""
    rng = np.random.default_rng(1)
    covered = []
    for level in rng.normal(LEVELS.mean(), LEVELS.std(ddof=1), 40):
        X, _, _ = domain(level, 5, rng)
        lo, hi = prior.predict_interval(X)
        p_true = expit(logit(prior.predict_proba(X)) + level - LEVELS.mean())
        covered.append(np.mean((lo <= p_true) & (p_true <= hi)))
    assert 0.7 <= np.mean(covered) <= 0.97  # nominal 0.8, t-widened for K=6


def test_few_label_fit_moves_to_the_true_level_and_narrows(prior):
    rng = np.random.default_rng(2)
    true_level = LEVELS.mean() + 2.0 * LEVELS.std(ddof=1)  # an unusual domain
    X_test, _, _ = domain(true_level, 50, rng)
    mean, _ = prior.prior_mean_sd()
    errors = [abs(raw_level(prior, mean) - true_level)]
    lo, hi = prior.predict_interval(X_test)
    widths = [float(np.mean(hi - lo))]
    level_sds = [prior.predictive_level_sd]
    for n in (5, 30, 200):
        X, y, g = domain(true_level, n, rng)
        est = PriorCalibrator(prior=prior.to_dict()).fit(X, y, g)
        p = est.predict_proba(X_test)
        lo, hi = est.predict_interval(X_test)
        assert p.dtype == np.float64 and p.ndim == 1
        assert np.all((lo <= p) & (p <= hi))
        errors.append(abs(raw_level(prior, est.coef_) - true_level))
        widths.append(float(np.mean(hi - lo)))
        level_sds.append(est.level_sd_)
    assert errors[-1] < 0.3 < errors[0]
    assert errors[1] < errors[0] and errors[2] < errors[0]
    assert widths == sorted(widths, reverse=True)
    assert level_sds == sorted(level_sds, reverse=True)


def test_few_label_fit_accepts_single_class_labels(prior):
    X, _, g = domain(-2.0, 3, np.random.default_rng(3))
    est = PriorCalibrator(prior=prior.to_dict()).fit(X, np.zeros(len(X)), g)
    assert np.all(est.predict_proba(X) < prior.predict_proba(X))


def test_prior_calibrator_needs_a_prior_and_a_fit(prior):
    X, y, g = domain(-1.0, 3, np.random.default_rng(4))
    with pytest.raises(InvalidInputError):
        PriorCalibrator().fit(X, y, g)
    from calibration.exceptions import NotFittedCalibratorError

    with pytest.raises(NotFittedCalibratorError):
        PriorCalibrator(prior=prior.to_dict()).predict_proba(X)


def test_prior_never_reorders_hits_within_a_query(prior):
    X, y, g = domain(-1.0, 30, np.random.default_rng(5))
    est = PriorCalibrator(prior=prior.to_dict()).fit(X, y, g)
    for p in (prior.predict_proba(X), est.predict_proba(X)):
        per_query = p.reshape(-1, K_HITS)  # hits sorted by cosine, best first
        assert np.all(np.diff(per_query, axis=1) <= 1e-12)


def test_prior_json_round_trip_is_exact(prior):
    text = json.dumps(prior.to_dict(), allow_nan=False)
    back = CrossDomainPrior.from_dict(json.loads(text))
    assert back == prior
    X, _, _ = domain(-1.0, 3, np.random.default_rng(6))
    np.testing.assert_array_equal(back.predict_proba(X), prior.predict_proba(X))


def test_prior_rejects_foreign_payloads(prior):
    bad = prior.to_dict() | {"format_version": 99}
    with pytest.raises(UnsupportedFormatError):
        CrossDomainPrior.from_dict(bad)
    with pytest.raises(UnsupportedFormatError):
        CrossDomainPrior.from_dict(prior.to_dict() | {"fields": {}})


def test_interval_coverage_counts_bins_whose_rate_is_inside():
    rng = np.random.default_rng(7)
    p = rng.uniform(0.05, 0.95, 3000)
    y = (rng.random(3000) < p).astype(float)
    assert interval_coverage(y, p, p - 0.1, p + 0.1) == 1.0
    assert interval_coverage(y, p, p + 0.2, p + 0.3) == 0.0


def test_interval_coverage_allows_for_a_bins_sampling_error():
    """150 pairs at a true 0.3%: 0 relevant is the likeliest sample, and no miss."""
    p = np.full(150 * 15, 0.003)
    y = np.zeros_like(p)
    y[:: 150 * 5] = 1.0  # 3 relevant in all
    lo, hi = p / 2, p * 2
    assert interval_coverage(y, p, lo, hi) == 1.0
    assert interval_coverage(y, p, lo, hi, alpha=0.0) < 0.5
    assert interval_coverage(y, p, lo + 0.2, hi + 0.2) == 0.0


# --------------------------------------------------------------------- confidence

probs = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(p=probs, weight=st.floats(0.0, 1.0), k=st.integers(1, 60))
def test_confidence_is_coherent(p, weight, k):
    hits = p[:k]
    c = coherent_confidence(hits, weight)
    assert max(hits) <= c <= min(1.0, sum(hits)) + 1e-12
    if k < len(p):  # one more hit returned never lowers the confidence
        assert coherent_confidence(p[: k + 1], weight) >= c


def test_confidence_of_no_hits_is_zero():
    assert coherent_confidence([], 0.5) == 0.0


# ---------------------------------------------------------------------- norm lift


def _oof_pair(gamma_q: float) -> tuple[np.ndarray, ...]:
    """Held-out predictions of prior fits with and without ell_q."""
    rng = np.random.default_rng(8)
    sets = {
        f"d{k}": domain(level, 120, rng, gamma_q=gamma_q)[:2]
        for k, level in enumerate(LEVELS)
    }
    with_n = fit_prior(sets, features=("cosine", "rank", "gap", "len_q", "ell_q"))
    without = fit_prior(sets)
    X, y, g = domain(-1.0, 150, rng, gamma_q=gamma_q)
    return y, with_n.predict_proba(X), without.predict_proba(X), g


def test_norm_lift_says_no_measurable_gain_without_norm_signal():
    verdict = norm_lift_verdict(*_oof_pair(0.0))
    assert not verdict.kept and verdict.verdict == "no measurable gain"


def test_norm_lift_keeps_a_strong_norm_signal():
    verdict = norm_lift_verdict(*_oof_pair(1.0))
    assert verdict.kept and verdict.verdict == "kept"
    assert verdict.nll_with < verdict.nll_without


def test_prior_calibrator_plugs_into_grouped_cross_validation(prior):
    """The sklearn contract select_calibrator relies on: clone, fit per fold, predict."""
    from sklearn.base import clone

    from calibration import cross_val_predict_grouped

    X, y, g = domain(-1.0, 20, np.random.default_rng(9))
    est = PriorCalibrator(prior=prior.to_dict())
    assert clone(est).get_params() == est.get_params()
    oof = cross_val_predict_grouped(est, X, y, g, n_splits=5)
    assert oof.shape == y.shape and np.all((oof >= 0) & (oof <= 1))


# -------------------------------------------------- heavy-tailed levels (issue 26)


def test_t_levels_keep_their_centre_beside_one_far_domain():
    levels = np.array([-2.0, -2.1, -1.9, -2.05, -1.95, -2.2, -1.8, -6.0])
    location, scale = t_location_scale(levels, 4.0)
    assert abs(location + 2.0) < 0.15 < abs(levels.mean() + 2.0)
    assert scale < levels.std(ddof=1)
    # Many normal draws: location and scale near the mean and SD's t counterpart.
    draws = np.random.default_rng(8).normal(1.0, 2.0, 4000)
    location, scale = t_location_scale(draws, 1e6)
    assert location == pytest.approx(1.0, abs=0.1)
    assert scale == pytest.approx(2.0, rel=0.05)


def _sets(levels, rng, n_queries=120):
    return {
        f"d{k}": domain(level, n_queries, rng)[:2] for k, level in enumerate(levels)
    }


def test_lodo_width_covers_every_held_out_set_by_construction():
    rng = np.random.default_rng(9)
    near = _sets([-2.0, -1.6, -1.2, -0.8, -0.4], rng)
    far = near | {"far": domain(-4.5, 120, rng)[:2]}
    width_near = lodo_calibrate(near).width
    choice = lodo_calibrate(far)
    assert choice.width == max(choice.need.values()) and choice.width > width_near
    for name, (X, y) in far.items():
        others = {n: xy for n, xy in far.items() if n != name}
        held = fit_prior(others, width=choice.width, point_offset=choice.point_offset)
        lo, hi = held.predict_interval(X)
        assert interval_coverage(y, held.predict_proba(X), lo, hi) >= 0.8, name


def test_a_few_judgments_move_a_level_in_the_t_tail_further_than_a_normal_prior():
    rng = np.random.default_rng(10)
    sets = _sets(LEVELS, rng, 150)
    true_level = LEVELS.mean() - 4.0 * LEVELS.std(ddof=1)
    X, y, g = domain(true_level, 5, rng)
    errors = {}
    for df in (None, 4.0):
        fitted = fit_prior(sets, level_df=df)
        est = PriorCalibrator(prior=fitted.to_dict()).fit(X, y, g)
        errors[df] = abs(raw_level(fitted, est.coef_) - true_level)
    assert errors[4.0] < errors[None]


def test_profiles_before_the_t_levels_load_as_normal_levels(prior):
    old = prior.to_dict()
    fields = {k: v for k, v in old["fields"].items() if k not in ("level_df", "width")}
    back = CrossDomainPrior.from_dict(old | {"fields": fields})
    assert back.level_df is None and back.width == 1.0
    assert back.quantile == pytest.approx(
        float(student_t.ppf(0.9, df=back.n_domains - 1))
    )


@pytest.mark.parametrize(
    ("key", "value"), [("level_df", 0.4), ("level_df", 2e6), ("width", 0.0)]
)
def test_prior_refuses_level_df_and_width_out_of_bounds(prior, key, value):
    data = prior.to_dict()
    with pytest.raises(UnsupportedFormatError):
        CrossDomainPrior.from_dict(data | {"fields": data["fields"] | {key: value}})


def fusion_domain(
    level: float, n_queries: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """A domain whose relevance follows the reciprocal-rank fusion of two lists.

    Each query's 20 hits hold random cosine-list and BM25-list ranks (BM25 rank 101:
    not in the list); ``logit P = level + 3000 * (rrf - 0.025)``, so a hit both lists
    hold at rank 15 (rrf 0.0267) beats the cosine list's top hit with no BM25 match
    (0.0164): an order log(rank) terms cannot give without the fusion feature.
    """
    rank = np.column_stack(
        [rng.permutation(np.arange(1.0, 41.0))[:20] for _ in range(n_queries)]
    ).T
    lex_rank = rng.choice(np.r_[np.arange(1.0, 41.0), [101.0] * 20], (n_queries, 20))
    rrf = 1 / (60 + rank) + np.where(lex_rank <= 100, 1 / (60 + lex_rank), 0.0)
    y = (rng.random(rank.shape) < expit(level + 3000 * (rrf - 0.025))).astype(float)
    X = np.zeros((rank.size, len(FEATURES)))
    X[:, FEATURES.index("rank")] = rank.ravel()
    X[:, FEATURES.index("lex_rank")] = lex_rank.ravel()
    X[:, FEATURES.index("cosine")] = 0.5
    return X, y.ravel()


def test_the_fusion_feature_is_the_pairs_rrf_of_its_two_list_ranks():
    X = np.zeros((3, len(FEATURES)))
    X[:, FEATURES.index("rank")] = [1.0, 15.0, 30.0]
    X[:, FEATURES.index("lex_rank")] = [101.0, 15.0, 100.0]  # 101: not in the list
    prior = CrossDomainPrior(
        features=("rrf",),
        center=(0.0,),
        scale=(1.0,),
        slope=(1.0,),
        slope_sd=(0.1,),
        level_mean=0.0,
        level_sd=1.0,
        levels=(0.0, 0.0, 0.0),
        domains=("a", "b", "c"),
    )
    np.testing.assert_allclose(
        prior.standardise(X)[:, 1], [1 / 61, 2 / 75, 1 / 90 + 1 / 160]
    )
    assert prior.reorders_hits  # the BM25 rank is the document's, not the cosine's
    back = CrossDomainPrior.from_dict(json.loads(json.dumps(prior.to_dict())))
    assert back == prior
    with pytest.raises(InvalidInputError):
        fit_prior({"a": (X, np.ones(3))}, features=("rrf", "fusion"))


def test_a_prior_with_the_fusion_feature_orders_like_rrf_where_the_labels_do():
    rng = np.random.default_rng(11)
    sets = {f"d{k}": fusion_domain(level, 200, rng) for k, level in enumerate(LEVELS)}
    logs = fit_prior(sets, features=("rank", "lex_rank"))
    fused = fit_prior(sets, features=("rank", "lex_rank", "rrf"))
    both_at_15, top_alone = np.zeros((2, len(FEATURES)))
    both_at_15[[FEATURES.index("rank"), FEATURES.index("lex_rank")]] = 15.0
    top_alone[[FEATURES.index("rank"), FEATURES.index("lex_rank")]] = [1.0, 101.0]
    pair = np.vstack([both_at_15, top_alone])
    assert fused.slope[-1] > 0
    p = fused.predict_proba(pair)
    assert p[0] > p[1]
    p_logs = logs.predict_proba(pair)  # the log ranks alone put the top hit first
    assert p_logs[0] < p_logs[1]
    X, y = fusion_domain(-1.0, 300, rng)
    held_fused = negative_log_likelihood(y, fused.predict_proba(X))
    held_logs = negative_log_likelihood(y, logs.predict_proba(X))
    assert held_fused < held_logs
