"""Drift statistics (``calibration.drift``) and the reference a fit stores."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibration import io
from calibration.drift import (
    DRIFT_FEATURES,
    FAMILY_ALPHA,
    MAX_BINS,
    PSI_SHIFT,
    DriftReference,
    FeatureReference,
    ServedWindow,
    compare,
    psi,
    psi_critical,
    query_summary,
    reference_from,
)
from calibration.exceptions import InvalidInputError, UnsupportedFormatError
from calibration.features import LexicalEvidence
from calibration.profile import Profile, QueryEvidence, fit_profile
from calibration.report import FitReport

TOKENS = DRIFT_FEATURES.index("query_tokens")
COSINE = DRIFT_FEATURES.index("top_cosine")


def _summaries(rng: np.random.Generator, n: int, cosine: float = 0.5) -> np.ndarray:
    """Query summaries of one made-up population (top cosine centred on ``cosine``)."""
    return np.column_stack(
        [
            rng.normal(cosine, 0.08, n),
            rng.gamma(2.0, 0.03, n),
            rng.poisson(12, n) + 1,
            rng.beta(1.0, 3.0, n),
            rng.beta(4.0, 2.0, n),
        ]
    )


def _window(reference: DriftReference, summaries: np.ndarray) -> ServedWindow:
    window = ServedWindow(reference, len(summaries))
    for s in summaries:
        window.add(s)
    return window


def _verdict(reference: DriftReference, summaries: np.ndarray):
    window = _window(reference, summaries)
    return compare(reference, window.counts(), window.predicted_rate())


# -- one query's summary -------------------------------------------------------------
def test_query_summary_reads_the_top_hit_and_the_gap_to_the_fifth():
    scores = np.array([0.4, 0.9, 0.7, 0.6, 0.5, 0.3])
    lexical = LexicalEvidence(
        bm25=np.array([0.0, 3.0, 1.0, 0.0, 0.0, 0.0]),
        rank=np.array([7.0, 1.0, 2.0, 7.0, 7.0, 7.0]),
        idf_mass=6.0,
        top=3.0,
    )
    p = np.array([0.1, 0.8, 0.5, 0.3, 0.2, 0.1])
    got = query_summary(scores, 12, lexical, p)
    np.testing.assert_allclose(got, [0.9, 0.9 - 0.4, 12, 0.5, 0.8])
    # fewer than five hits: the gap to the last; no lexical evidence: no share
    short = query_summary([0.9, 0.7], 3, None, [0.6, 0.2])
    np.testing.assert_allclose(short, [0.9, 0.2, 3, 0.0, 0.6])
    with pytest.raises(InvalidInputError):
        query_summary([], 3, None, [])
    with pytest.raises(InvalidInputError):
        query_summary([0.9, 0.7], 3, None, [0.6])


# -- the reference -------------------------------------------------------------------
@pytest.mark.parametrize(("n", "bins"), [(5, 2), (14, 2), (15, 3), (40, 8), (400, 10)])
def test_reference_bins_are_equal_mass_and_bounded(n, bins):
    rng = np.random.default_rng(n)
    summaries = _summaries(rng, n)
    summaries[:, TOKENS] += rng.uniform(0, 1e-3, n)  # no ties: all bins kept
    reference = reference_from(summaries, np.arange(n) % 3 == 0)
    assert reference.n_queries == n and reference.top_relevant == len(range(0, n, 3))
    assert [f.name for f in reference.features] == list(DRIFT_FEATURES)
    for f in reference.features:
        assert len(f.counts) == bins <= MAX_BINS and f.counts.sum() == n
        assert f.counts.max() - f.counts.min() <= 1
        assert np.all(np.diff(f.edges) > 0)


def test_tied_values_merge_bins():
    summaries = _summaries(np.random.default_rng(3), 50)
    summaries[:35, DRIFT_FEATURES.index("top_lexical")] = 0.0  # no term matched
    reference = reference_from(summaries, np.zeros(50, bool))
    lexical = reference.features[DRIFT_FEATURES.index("top_lexical")]
    assert len(lexical.counts) < 10 and lexical.counts.sum() == 50
    assert lexical.counts[0] == 0 and lexical.counts[1] >= 35  # edge at 0: ties above


def test_reference_refuses_what_it_cannot_summarise():
    with pytest.raises(InvalidInputError):
        reference_from(np.zeros((4, 3)), np.zeros(4, bool))
    bad = _summaries(np.random.default_rng(0), 10)
    bad[0, 0] = np.nan
    with pytest.raises(InvalidInputError):
        reference_from(bad, np.zeros(10, bool))


# -- PSI and its null ----------------------------------------------------------------
def test_psi_is_zero_for_equal_shares_and_grows_with_the_shift():
    assert psi([10, 10, 10], [20, 20, 20]) == pytest.approx(0.0)
    assert psi([10, 10, 10], [30, 20, 10]) < psi([10, 10, 10], [50, 9, 1])
    assert psi([0, 10], [10, 0]) > 0  # empty bins stay finite
    with pytest.raises(InvalidInputError):
        psi([1, 2], [1, 2, 3])


@pytest.mark.parametrize(("n", "m"), [(5, 30), (40, 60), (200, 1000)])
def test_the_critical_value_holds_its_risk_under_no_drift(n, m):
    """Judged and served queries of one population exceed it at most at its rate
    (the level one feature is tested at: the family's 5% over six tests)."""
    rng = np.random.default_rng(n * m)
    alpha, exceeded, trials = FAMILY_ALPHA / (len(DRIFT_FEATURES) + 1), 0, 1500
    for _ in range(trials):
        reference = reference_from(rng.normal(size=(n, 5)), np.zeros(n, bool))
        feature = reference.features[0]
        served = np.searchsorted(feature.edges, rng.normal(size=m), side="right")
        counts = np.bincount(served, minlength=len(feature.counts))
        value = psi(feature.counts, counts)
        exceeded += value > psi_critical(n, m, len(feature.counts), alpha)
    assert exceeded / trials <= alpha


def test_psi_critical_shrinks_with_more_queries():
    assert psi_critical(40, 60, 8, 0.01) > psi_critical(400, 600, 8, 0.01)
    with pytest.raises(InvalidInputError):
        psi_critical(0, 60, 8, 0.01)


# -- the verdict ---------------------------------------------------------------------
def test_queries_like_the_judged_ones_rarely_read_drifting():
    rng = np.random.default_rng(11)
    alarms = 0
    for _ in range(200):
        reference = reference_from(_summaries(rng, 40), rng.random(40) < 0.67)
        alarms += _verdict(reference, _summaries(rng, 60)).drifting
    assert alarms / 200 <= FAMILY_ALPHA


def test_a_shifted_feature_moves_and_the_others_do_not():
    rng = np.random.default_rng(5)
    reference = reference_from(_summaries(rng, 40), rng.random(40) < 0.67)
    served = _summaries(rng, 100)
    served[:, TOKENS] += 40  # much longer queries, nothing else changed
    verdict = _verdict(reference, served)
    assert verdict.drifting and verdict.moved == ["query_tokens"]
    tokens = verdict.features[TOKENS]
    assert tokens.psi > max(PSI_SHIFT, tokens.critical) and tokens.level == "shift"
    assert verdict.n_served == 100


def test_the_positive_rate_moves_only_far_outside_the_judged_share():
    rng = np.random.default_rng(6)
    summaries = _summaries(rng, 40)
    reference = reference_from(summaries, np.arange(40) < 30)  # 0.75 judged
    window = _window(reference, summaries)
    low = compare(reference, window.counts(), 0.2).positive_rate
    assert low.moved and low.judged == 0.75 and low.low < 0.75 < low.high
    assert not compare(reference, window.counts(), 0.7).positive_rate.moved
    # many judged queries: a narrow interval, but 0.05 away is not a shift
    big = reference_from(_summaries(rng, 4000), np.arange(4000) < 3000)
    near = compare(big, _window(big, summaries).counts(), 0.70).positive_rate
    assert not (near.low <= 0.70 <= near.high) and not near.moved


# -- the served window ---------------------------------------------------------------
def test_the_window_keeps_the_last_size_queries_at_its_bound():
    rng = np.random.default_rng(8)
    reference = reference_from(_summaries(rng, 40), np.zeros(40, bool))
    served = _summaries(rng, 31)
    window = ServedWindow(reference, 30)
    for s in served[:30]:
        window.add(s)
    assert (window.n, window.seen) == (30, 30)  # at the bound: all of them
    full = _window(reference, served[:30])
    assert all(map(np.array_equal, window.counts(), full.counts()))
    window.add(served[30])  # one past: the oldest leaves
    assert (window.n, window.seen) == (30, 31)
    last = _window(reference, served[1:])
    assert all(map(np.array_equal, window.counts(), last.counts()))
    assert window.predicted_rate() == pytest.approx(served[1:, -1].mean())
    with pytest.raises(InvalidInputError):
        ServedWindow(reference, 0)


# -- the reference a fit stores -------------------------------------------------------
def _evidence(n_queries: int, seed: int) -> list[QueryEvidence]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_queries):
        scores = np.sort(rng.uniform(0.2, 0.8, 10))[::-1]
        p = 1 / (1 + np.exp(-14 * (scores - 0.6)))
        out.append(
            QueryEvidence(
                norm=float(rng.normal(5.0, 0.4)),
                n_tokens=int(rng.integers(5, 30)),
                scores=scores,
                doc_norms=rng.normal(3.0, 0.3, 10),
                doc_tokens=rng.integers(60, 256, 10),
                labels=(rng.uniform(size=10) < p).astype(float),
                lexical=LexicalEvidence(
                    bm25=rng.uniform(0, 5, 10),
                    rank=np.arange(1.0, 11.0),
                    idf_mass=6.0,
                    top=5.0,
                ),
            )
        )
    return out


@pytest.fixture(scope="module")
def fitted() -> tuple[Profile, list[QueryEvidence]]:
    evidence = _evidence(30, seed=1)
    rng = np.random.default_rng(2)
    profile = fit_profile(
        evidence,
        doc_norms=rng.normal(3.0, 0.3, 200),
        doc_tokens=rng.integers(60, 256, 200),
        model="test-model",
        method="platt",
    )
    return profile, evidence


def test_a_fit_stores_its_judged_queries_as_search_summarises_them(fitted):
    profile, evidence = fitted
    reference = profile.report.drift_reference
    assert reference is not None and reference.n_queries == 30
    assert reference.top_relevant == sum(e.labels[0] > 0 for e in evidence)
    served = []
    for e in evidence:  # what search computes for the same queries
        scored = profile.score(
            e.norm, e.n_tokens, e.scores, e.doc_norms, e.doc_tokens, e.lexical
        )
        served.append(
            query_summary(e.scores, e.n_tokens, e.lexical, scored.probabilities)
        )
    window = _window(reference, np.array(served))
    for f, counts in zip(reference.features, window.counts(), strict=True):
        np.testing.assert_array_equal(f.counts, counts)
    assert not compare(reference, window.counts(), window.predicted_rate()).drifting


def test_the_reference_round_trips_and_old_reports_load_without_it(fitted):
    profile, _ = fitted
    report = profile.report.to_jsonable()
    assert report["drift_reference"]["n_queries"] == 30
    again = Profile.from_json(json.loads(json.dumps(profile.to_json())))
    assert again.report.to_jsonable() == report
    assert FitReport.from_jsonable(report).to_jsonable() == report
    stored = profile.to_json()
    del stored["report"]["fields"]["drift_reference"]
    old = Profile.from_json(json.loads(json.dumps(stored)))
    assert old.report.drift_reference is None
    assert "drift_reference" not in old.report.to_jsonable()


def _reference_payload(fitted, change) -> dict:
    profile, _ = fitted
    payload = io.to_dict(profile.report.drift_reference)
    change(payload["fields"])
    return payload


def _feature(fields: dict, i: int = 0) -> dict:
    return fields["features"]["__tuple__"][i]["fields"]


def _arr(values: list, dtype: str) -> dict:
    return {"__ndarray__": values, "dtype": dtype, "shape": [len(values)]}


@pytest.mark.parametrize(
    ("change", "field", "rule"),
    [
        (
            lambda f: _feature(f).update(
                edges=_arr([float(i) for i in range(MAX_BINS)], "float64"),
                counts=_arr([3] * 10 + [0], "int64"),
            ),
            "features[0].fields.edges",
            f"at most {MAX_BINS - 1} edges",
        ),
        (
            lambda f: _feature(f).update(edges=_arr([0.5, 0.5, 0.6], "float64")),
            "features[0].fields.edges",
            "finite and increasing",
        ),
        (
            lambda f: _feature(f).update(counts=_arr([30], "int64")),
            "features[0].fields.counts",
            "one count per bin",
        ),
        (
            lambda f: _feature(f).update(name="colour"),
            "features[0].fields.name",
            "must be one of",
        ),
        (lambda f: f.update(n_queries=31), "fields.features", "sum to n_queries"),
        (lambda f: f.update(top_relevant=31), "fields", "top_relevant <= n_queries"),
        (
            lambda f: f["features"]["__tuple__"].append(f["features"]["__tuple__"][0]),
            "fields.features",
            "each feature at most once",
        ),
    ],
)
def test_a_bad_reference_is_refused_naming_the_field(fitted, change, field, rule):
    with pytest.raises(UnsupportedFormatError) as info:
        io.from_dict(_reference_payload(fitted, change))
    assert info.value.field is not None and info.value.field.endswith(field)
    assert rule in str(info.value)


def test_a_good_reference_decodes_as_stored(fitted):
    profile, _ = fitted
    back = io.from_dict(io.to_dict(profile.report.drift_reference))
    assert isinstance(back, DriftReference)
    assert all(isinstance(f, FeatureReference) for f in back.features)
    assert back.n_queries == profile.report.drift_reference.n_queries
