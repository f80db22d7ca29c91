"""Lexical evidence in the list-aware family, its selection and the evidence-lift report
(issue 12): simulated worlds with and without a real lexical signal."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibration import (
    FORMAT_VERSION,
    ListAwareCalibrator,
    from_dict,
    simulate_judgments,
    to_dict,
)
from calibration.features import LEX, LEX_RANK, LEX_REL, LEXICAL_DEPTH, LexicalEvidence
from calibration.profile import Profile, QueryEvidence, fit_profile
from calibration.report import FitReport
from calibration.selection import (
    EVIDENCE_LADDER,
    NEGLIGIBLE_GAIN,
    SelectionResult,
    evidence_lift,
    select_calibrator,
)

SEED = 20261201
# The list world of conftest.py, plus BM25 evidence that lowers the threshold.
LIST_WORLD = {
    "gamma_q": 0.5,
    "gamma_d": 0.3,
    "beta_q": 0.03,
    "delta_rank": 0.02,
    "delta_gap": 0.5,
    "delta_len_d": 0.02,
    "probe_link": 0.05,
}
LEXICAL_SIGNAL = {"delta_lex": -0.08, "delta_lex_rel": -0.04, "delta_lex_rank": 0.01}
# No norm and no lexical signal: only cosine and the gap matter.
PLAIN_WORLD = {"gamma_q": 0.0, "gamma_d": 0.0, "beta_q": 0.0, "delta_gap": 0.5}
GROUPS = [group for group, _ in EVIDENCE_LADDER]
FORMAT1_DEFAULT = (
    Path(__file__).resolve().parents[1]
    / "fixtures"
    / "profiles"
    / "all-minilm-l6-v2.format1.json"
)


@pytest.fixture(scope="module")
def lexical_world():
    return simulate_judgments(
        80, rng=SEED, lexical=True, **LIST_WORLD, **LEXICAL_SIGNAL
    )


@pytest.fixture(scope="module")
def noise_world():
    """BM25 columns vary but say nothing about relevance; norms are noise too."""
    return simulate_judgments(80, rng=SEED + 1, lexical=True, **PLAIN_WORLD)


@pytest.fixture(scope="module")
def chosen(lexical_world) -> SelectionResult:
    d = lexical_world
    return select_calibrator(d.X, d.y, d.groups)


@pytest.fixture(scope="module")
def chosen_in_order(lexical_world) -> SelectionResult:
    d = lexical_world
    return select_calibrator(d.X, d.y, d.groups, query_side_only=True)


def _lift(result: SelectionResult) -> dict[str, object]:
    return {g.group: g for g in result.evidence_lift}


# -- the model ---------------------------------------------------------------------


def test_lexical_shifts_have_the_sign_of_evidence_and_recover_the_world(
    lexical_world,
):
    d = lexical_world
    m = ListAwareCalibrator(use_lexical=True).fit(d.X, d.y, d.groups)
    assert m.coef_.shape == (13,) and m.reorders_hits
    assert m.delta_lex_ <= 0 and m.delta_lex_rel_ <= 0 and m.delta_lex_rank_ >= 0
    # lex and lex_rel are near-collinear: their sum is what the data identify
    total = m.delta_lex_ + m.delta_lex_rel_
    assert total == pytest.approx(
        LEXICAL_SIGNAL["delta_lex"] + LEXICAL_SIGNAL["delta_lex_rel"], abs=0.04
    )
    plain = ListAwareCalibrator().fit(d.X, d.y, d.groups)
    assert plain.coef_.shape == (10,) and not hasattr(plain, "delta_lex_")


@settings(max_examples=40, deadline=None)
@given(
    lex=st.floats(0.0, 1.5),
    more=st.floats(0.0, 0.5),
    rank=st.integers(1, LEXICAL_DEPTH + 1),
    better=st.integers(0, 50),
)
def test_more_lexical_evidence_never_lowers_the_probability(
    fitted_lexical, lex, more, rank, better
):
    x = np.array([[0.5, 0.2, -0.1, 3.0, 0.05, 0.1, -0.2, lex, lex / 2, rank]])
    y = x.copy()
    y[0, LEX] += more
    y[0, LEX_REL] = min(1.0, y[0, LEX_REL] + more)
    y[0, LEX_RANK] = max(1, rank - better)
    assert fitted_lexical.predict_proba(y)[0] >= fitted_lexical.predict_proba(x)[0]


@pytest.fixture(scope="module")
def fitted_lexical(lexical_world) -> ListAwareCalibrator:
    d = lexical_world
    return ListAwareCalibrator(use_lexical=True).fit(d.X, d.y, d.groups)


def test_without_lexical_evidence_the_lexical_model_is_the_plain_one():
    """``lexical=None`` columns (0, 0, depth + 1) give a zero design: the lexical
    model fits and scores like the lexical-free one."""
    d = simulate_judgments(80, rng=SEED + 2, **LIST_WORLD)
    assert np.all(d.X[:, LEX_RANK] == LEXICAL_DEPTH + 1)
    with_lex = ListAwareCalibrator(use_lexical=True).fit(d.X, d.y, d.groups)
    plain = ListAwareCalibrator().fit(d.X, d.y, d.groups)
    np.testing.assert_allclose(with_lex.coef_[10:], 0.0, atol=1e-12)
    np.testing.assert_allclose(
        with_lex.predict_proba(d.X), plain.predict_proba(d.X), rtol=1e-7
    )


def test_lexical_model_round_trips_and_an_old_payload_loads_unchanged(
    fitted_lexical, lexical_world
):
    X = lexical_world.X
    again = from_dict(json.loads(json.dumps(to_dict(fitted_lexical))))
    assert again.use_lexical and again.delta_lex_rank_ == fitted_lexical.delta_lex_rank_
    np.testing.assert_array_equal(
        again.predict_proba(X), fitted_lexical.predict_proba(X)
    )
    # A list model stored before lexical terms existed: no parameter, no state.
    plain = ListAwareCalibrator().fit(X, lexical_world.y, lexical_world.groups)
    old = to_dict(plain)
    del old["params"]["use_lexical"]
    loaded = from_dict(json.loads(json.dumps(old)))
    assert loaded.use_lexical is False
    np.testing.assert_array_equal(loaded.predict_proba(X), plain.predict_proba(X))


# -- selection ---------------------------------------------------------------------


def test_auto_serves_the_lexical_model_when_lexical_evidence_pays(chosen):
    lift = _lift(chosen)
    assert list(lift) == GROUPS
    lexical = lift["lexical"]
    assert lexical.verdict == "pays"
    assert (
        lexical.model == "nt-list/length+lexical" and lexical.base == "nt-list/length"
    )
    assert lexical.nll_gain > lexical.nll_gain_se > 0 and lexical.brier_change < 0
    assert lift["list"].verdict == "pays"  # the world has a strong gap effect
    assert chosen.method == "nt-list" and chosen.estimator.use_lexical
    assert chosen.estimator.reorders_hits
    # with lexical models fitted, the norm is measured on top of lexical evidence
    assert lift["residual norm"].base == "nt-list/length+lexical"


def test_without_a_lexical_signal_nothing_lexical_or_norm_is_served(noise_world):
    d = noise_world
    res = select_calibrator(d.X, d.y, d.groups)
    lift = _lift(res)
    assert lift["lexical"].verdict == "no measurable gain"
    assert lift["residual norm"].verdict == "no measurable gain"
    assert not getattr(res.estimator, "use_lexical", False)
    assert not res.uses_norms
    assert any(n.startswith("Lexical fallback") for n in res.notes)


def test_hits_keep_their_order_a_lexical_model_is_never_served(chosen_in_order):
    """Reordering disallowed: the lexical rung is still measured for the report, and
    the note says what allowing reordering would buy, but no lexical model serves."""
    res = chosen_in_order
    assert not getattr(res.estimator, "use_lexical", False)
    assert not res.estimator.reorders_hits
    lift = _lift(res)
    assert lift["lexical"].verdict == "pays"
    assert lift["residual norm"].base == "nt-list/length"
    assert any("reorder" in n and "lexical" in n for n in res.notes)


def test_a_named_nt_list_fit_without_reordering_is_not_lexical():
    d = simulate_judgments(
        40, rng=SEED + 4, lexical=True, **LIST_WORLD, **LEXICAL_SIGNAL
    )
    res = select_calibrator(d.X, d.y, d.groups, method="nt-list", query_side_only=True)
    assert res.method == "nt-list" and not res.estimator.use_lexical
    assert not res.estimator.reorders_hits


def test_unmeasurable_groups_say_why():
    d = simulate_judgments(40, rng=SEED + 3, **PLAIN_WORLD)  # no BM25 at all
    d.X[:, 1:3] = 0.0  # unit-norm embeddings
    res = select_calibrator(d.X, d.y, d.groups)
    lift = _lift(res)
    for group in ("lexical", "residual norm"):
        assert lift[group].verdict == "not measured"
        assert np.isnan(lift[group].nll_gain) and lift[group].reason
    assert lift["list"].verdict in {"pays", "no measurable gain"}


# -- the profile and its report ------------------------------------------------------


def _evidence(n_queries: int, seed: int, lexical: bool) -> list[QueryEvidence]:
    """Judged hit lists whose relevance follows cosine and (optionally) BM25."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_queries):
        scores = np.sort(rng.uniform(0.2, 0.8, 20))[::-1]
        bm25 = np.where(rng.random(20) < 0.6, rng.uniform(0.0, 8.0, 20), 0.0)
        logit = 14 * (scores - 0.62) + (0.5 * bm25 if lexical else 0.0)
        labels = (rng.uniform(size=20) < 1 / (1 + np.exp(-logit))).astype(float)
        ranks = np.where(bm25 > 0, 1 + np.argsort(np.argsort(-bm25)), LEXICAL_DEPTH + 1)
        out.append(
            QueryEvidence(
                norm=float(rng.normal(5.0, 0.4)),
                n_tokens=int(rng.integers(8, 40)),
                scores=scores,
                doc_norms=rng.normal(3.0, 0.3, 20),
                doc_tokens=rng.integers(60, 256, 20),
                labels=labels,
                lexical=LexicalEvidence(
                    bm25=bm25, rank=ranks.astype(float), idf_mass=8.0, top=9.0
                ),
            )
        )
    return out


@pytest.fixture(scope="module")
def lexical_profile() -> Profile:
    rng = np.random.default_rng(1)
    return fit_profile(
        _evidence(80, seed=4, lexical=True),
        doc_norms=rng.normal(3.0, 0.3, 500),
        doc_tokens=rng.integers(60, 256, 500),
        model="test-model",
        allow_reorder=True,
    )


def test_profile_report_carries_the_evidence_lift(lexical_profile):
    report = lexical_profile.report.to_jsonable()
    lift = report["evidence_lift"]
    assert [g["group"] for g in lift] == GROUPS
    assert set(lift[0]) == {
        "group",
        "model",
        "base",
        "nll_gain",
        "nll_gain_se",
        "brier_change",
        "verdict",
        "reason",
    }
    assert next(g for g in lift if g["group"] == "lexical")["verdict"] == "pays"
    json.dumps(report, allow_nan=False)
    assert lexical_profile.reorders_hits and lexical_profile.estimator.use_lexical
    # stored, read back, scored identically, report unchanged
    again = Profile.from_json(json.loads(json.dumps(lexical_profile.to_json())))
    assert again.report.to_jsonable() == report
    e = _evidence(1, seed=9, lexical=True)[0]
    args = (e.norm, e.n_tokens, e.scores, e.doc_norms, e.doc_tokens)
    for lexical in (e.lexical, None):
        a, b = lexical_profile.score(*args, lexical), again.score(*args, lexical)
        np.testing.assert_array_equal(a.probabilities, b.probabilities)
    # the untyped JSON form (format 1) reads back the block too
    assert FitReport.from_jsonable(report).to_jsonable() == report


def test_a_profile_fits_and_scores_without_lexical_evidence():
    rng = np.random.default_rng(2)
    evidence = [
        QueryEvidence(**{**e.__dict__, "lexical": None})
        for e in _evidence(40, seed=5, lexical=False)
    ]
    profile = fit_profile(
        evidence,
        doc_norms=rng.normal(3.0, 0.3, 500),
        doc_tokens=rng.integers(60, 256, 500),
        model="test-model",
        allow_reorder=True,
    )
    lift = {g.group: g for g in profile.report.evidence_lift or ()}
    assert lift["lexical"].verdict == "not measured"
    assert not getattr(profile.estimator, "use_lexical", False)
    e = evidence[0]
    scored = profile.score(e.norm, e.n_tokens, e.scores, e.doc_norms, e.doc_tokens)
    assert np.all((scored.probabilities >= 0) & (scored.probabilities <= 1))


def test_reports_stored_without_the_evidence_lift_still_load(lexical_profile):
    """Versioned reports and the untyped dicts of format 1 written before the block
    existed load with ``evidence_lift=None`` and show no such key."""
    stored = lexical_profile.to_json()
    del stored["report"]["fields"]["evidence_lift"]
    old = Profile.from_json(json.loads(json.dumps(stored)))
    assert stored["report"]["format_version"] == FORMAT_VERSION
    assert old.report.evidence_lift is None
    assert "evidence_lift" not in old.report.to_jsonable()
    untyped = old.report.to_jsonable()
    assert FitReport.from_jsonable(untyped).to_jsonable() == untyped


def test_the_shipped_format1_profile_loads_as_a_lexical_free_list_model():
    """Stored before lexical terms: ``use_lexical`` absent, the report has no block."""
    data = json.loads(FORMAT1_DEFAULT.read_text(encoding="utf-8"))
    assert "use_lexical" not in data["estimator"]["params"]
    profile = Profile.from_json(data)
    assert isinstance(profile.estimator, ListAwareCalibrator)
    assert profile.estimator.use_lexical is False and not profile.reorders_hits
    assert profile.report.evidence_lift is None
    assert profile.report.to_jsonable() == data["report"]


def test_a_gain_at_optimiser_noise_does_not_pay():
    """Two fits that differ only by terms ending at zero differ by ~1e-7 nats per
    pair with an even smaller SE; that is no gain (seen with noise BM25 columns)."""
    rng = np.random.default_rng(0)
    codes = np.repeat(np.arange(50), 10)
    y = (rng.random(500) < 0.3).astype(float)
    base = np.full(500, 0.3)
    nudged = base + np.where(y == 1, 1e-7, -1e-7)  # better on every pair, by nothing
    oof = dict.fromkeys(("platt", "nt-list/none", "nt-list/length"), base)
    oof["nt-list/length+lexical"] = nudged
    lift = {g.group: g for g in evidence_lift(oof, y, codes)}
    lexical = lift["lexical"]
    assert 0 < lexical.nll_gain_se < lexical.nll_gain < NEGLIGIBLE_GAIN
    assert lexical.verdict == "no measurable gain" and "negligible" in lexical.reason
    assert lift["residual norm"].verdict == "not measured"
