"""Profiles without HTTP: scoring, JSON round trip, search cuts.

How long a fit takes is measured by ``benchmarks/fit_speed.py``, not asserted here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.profiles import default_profile_path, load_default_profile
from app.schemas.search import SearchHit
from app.services.search import _cut
from benchmarks.transfer import SETS
from calibration import FORMAT_VERSION, UnsupportedFormatError
from calibration.profile import Profile, QueryEvidence, fit_profile
from calibration.report import FitReport


def synthetic_evidence(
    n_queries: int, k: int = 20, seed: int = 0
) -> list[QueryEvidence]:
    """Judged hit lists whose relevance follows cosine and rank, with realistic norms."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_queries):
        scores = np.sort(rng.uniform(0.2, 0.8, k))[::-1]
        logit = 14 * (scores - 0.62) - 0.1 * np.arange(k)
        labels = (rng.uniform(size=k) < 1 / (1 + np.exp(-logit))).astype(float)
        out.append(
            QueryEvidence(
                norm=float(rng.normal(5.0, 0.4)),
                n_tokens=int(rng.integers(8, 40)),
                scores=scores,
                doc_norms=rng.normal(3.0, 0.3, k),
                doc_tokens=rng.integers(60, 256, k),
                labels=labels,
            )
        )
    return out


@pytest.fixture(scope="module")
def profile() -> Profile:
    evidence = synthetic_evidence(300)
    rng = np.random.default_rng(1)
    return fit_profile(
        evidence,
        doc_norms=rng.normal(3.0, 0.3, 2000),
        doc_tokens=rng.integers(60, 256, 2000),
        model="test-model",
    )


def test_profile_reports_every_method(profile):
    report = profile.report
    assert set(report.cv) == {"platt", "isotonic", "nt", "nt-list"}  # no prior given
    assert profile.method in report.cv
    assert report.n_queries == 300 and report.n_pairs == 6000
    for metrics in report.cv.values():
        assert 0 <= metrics.brier <= 0.25 and 0 <= metrics.ece <= 1
    assert not profile.reorders_hits  # the service default never reorders
    json.dumps(report.to_jsonable(), allow_nan=False)  # JSON-able throughout


# Captured on branch i11-layout (before the bridge moved into calibration/): the same
# data and fit must choose the same method and give the same numbers.
SCORE_ARGS = (5.0, 12, np.linspace(0.8, 0.3, 10), np.full(10, 3.1), np.full(10, 120))
REFERENCE_FIT = (
    "nt-list",
    [
        0.9472123372635364,
        0.8472387600395579,
        0.6628692545516172,
        0.4243980619042634,
        0.22186516331679906,
        0.1010642266091637,
        0.04299801594276619,
        0.01781011222696703,
        0.007319421247122636,
        0.0030069569673316678,
    ],
)
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
EVIDENCE_COSINES = np.array([0.71, 0.64, 0.58, 0.52, 0.41])
EVIDENCE_DOC_NORMS = np.array([3.0, 2.7, 3.4, 2.9, 3.1])
EVIDENCE_DOC_TOKENS = np.array([80, 120, 200, 60, 256])
# The default profile shipped before the cross-domain prior (format 1, a scifact fit
# serving a query-level confidence model): it must still load and score the same
# probabilities.
FORMAT1_DEFAULT = (
    Path(__file__).resolve().parents[1]
    / "fixtures"
    / "profiles"
    / "all-minilm-l6-v2.format1.json"
)
REFERENCE_DEFAULT = {  # (query norm, tokens): (probabilities, the old confidence)
    (4.2, 9): (
        [
            0.6080336490383886,
            0.21182131250434394,
            0.06831218482982462,
            0.022211537650545326,
            0.003667968379872796,
        ],
        0.9305964072436702,
    ),
    (5.0, 14): (
        [
            0.610305972216594,
            0.2134191468772242,
            0.06892214700746385,
            0.02241977075249448,
            0.003703013950343961,
        ],
        0.9552896225632859,
    ),
    (6.1, 30): (
        [
            0.6142143366331014,
            0.2161959317793685,
            0.06998616642325593,
            0.022783454024569334,
            0.0037642516426575263,
        ],
        0.9827653336773582,
    ),
}


def assert_coherent(p, confidence):
    """Issue 9: at least the largest hit probability, at most their sum (and 1)."""
    assert max(p) - 1e-12 <= confidence <= min(1.0, float(np.sum(p))) + 1e-12


def test_fit_chooses_and_scores_as_before_the_move(profile):
    """Same method and probabilities; the confidence is now the coherent one."""
    method, probabilities = REFERENCE_FIT
    scored = profile.score(*SCORE_ARGS)
    assert profile.method == method
    np.testing.assert_allclose(scored.probabilities, probabilities, rtol=1e-9)
    assert_coherent(scored.probabilities, scored.confidence)
    assert profile.query_model is None and 0 <= profile.confidence_weight <= 1


def _score_reference_evidence(profile):
    return {
        key: profile.score(
            *key, EVIDENCE_COSINES, EVIDENCE_DOC_NORMS, EVIDENCE_DOC_TOKENS
        )
        for key in REFERENCE_DEFAULT
    }


def _format1_default() -> Profile:
    return Profile.from_json(json.loads(FORMAT1_DEFAULT.read_text(encoding="utf-8")))


def test_format1_default_profile_scores_as_before_the_move():
    """Probabilities unchanged; the old served confidence broke the bounds (e.g. 0.93
    from hits summing to 0.91), so the noisy-OR is served instead and the threshold
    certified on the old confidence no longer counts as certified."""
    profile = _format1_default()
    assert profile.default and profile.query_model is not None
    assert profile.abstain_policy is not None and profile.abstain_policy.certified
    assert profile.certified_policy is None
    for key, scored in _score_reference_evidence(profile).items():
        probabilities, old_confidence = REFERENCE_DEFAULT[key]
        np.testing.assert_allclose(scored.probabilities, probabilities, rtol=1e-12)
        assert_coherent(scored.probabilities, scored.confidence)
        assert old_confidence > sum(probabilities)  # what issue 9 found
        assert scored.confidence == pytest.approx(
            1 - np.prod(1 - np.array(probabilities)), rel=1e-9
        )


def test_shipped_default_profile_is_the_cross_domain_prior():
    """Format 3, the prior at zero labels: intervals, no certified threshold."""
    data = json.loads(default_profile_path(DEFAULT_MODEL).read_text(encoding="utf-8"))
    assert data["format"] == 3
    default = load_default_profile(DEFAULT_MODEL, data["model_id"])
    assert not isinstance(default, str) and default.agnostic_because is None
    profile = default.profile
    assert profile.default and profile.method == "prior"
    assert profile.prior is not None and len(profile.prior.domains) == len(SETS)
    assert profile.prior.level_df is not None and profile.prior.width > 1.0
    assert profile.certified_policy is None
    for scored in _score_reference_evidence(profile).values():
        assert scored.intervals is not None and scored.confidence_interval is not None
        lo, hi = scored.intervals
        assert np.all(lo <= scored.probabilities) and np.all(scored.probabilities <= hi)
        assert_coherent(scored.probabilities, scored.confidence)
        c_lo, c_hi = scored.confidence_interval
        assert c_lo <= scored.confidence <= c_hi
        assert scored.abstain is (c_hi < 0.5)  # the conservative rule


def test_shipped_default_profile_of_the_untyped_report_format_loads():
    """The old shipped JSON (format 1) keeps its report dict; it reads back unchanged."""
    data = json.loads(FORMAT1_DEFAULT.read_text(encoding="utf-8"))
    assert data["format"] == 1 and "format_version" not in data["report"]
    profile = Profile.from_json(data)
    assert isinstance(profile.report, FitReport)
    assert profile.report.to_jsonable() == data["report"]
    assert (
        profile.report.cv[profile.method].nll
        == data["report"]["cv"][profile.method]["nll"]
    )
    # written in today's format and read again, it scores identically
    again = Profile.from_json(json.loads(json.dumps(profile.to_json())))
    for key, scored in _score_reference_evidence(again).items():
        np.testing.assert_array_equal(
            scored.probabilities, _score_reference_evidence(profile)[key].probabilities
        )
    assert again.report.to_jsonable() == data["report"]


def test_stored_profile_of_the_untyped_report_format_loads(profile):
    """A profile stored before reports were typed: format 1, report a plain dict."""
    stored = json.loads(json.dumps(profile.to_json()))
    stored |= {"format": 1, "report": profile.report.to_jsonable()}
    old = Profile.from_json(json.loads(json.dumps(stored)))
    a, b = profile.score(*SCORE_ARGS), old.score(*SCORE_ARGS)
    np.testing.assert_array_equal(a.probabilities, b.probabilities)
    assert a.confidence == b.confidence and a.abstain == b.abstain
    assert old.report.to_jsonable() == stored["report"]
    assert (
        old.report.norm_lift.variants.keys() == profile.report.norm_lift.variants.keys()
    )


def test_stored_report_is_versioned(profile):
    stored = profile.to_json()["report"]
    assert stored["class"] == "FitReport" and stored["format_version"] == FORMAT_VERSION
    with pytest.raises(UnsupportedFormatError):
        Profile.from_json(
            profile.to_json() | {"report": stored | {"format_version": 99}}
        )


def test_scores_are_probabilities_and_keep_cosine_order(profile):
    rng = np.random.default_rng(3)
    scores = np.sort(rng.uniform(0.1, 0.9, 15))[::-1]
    scored = profile.score(
        5.0, 12, scores, rng.normal(3, 0.3, 15), rng.integers(60, 256, 15)
    )
    p = scored.probabilities
    assert p.dtype == np.float64 and np.all((p >= 0) & (p <= 1))
    assert np.all(np.diff(p) <= 1e-12)  # non-increasing along the cosine order
    assert 0 <= scored.confidence <= 1 and isinstance(scored.abstain, bool)
    empty = profile.score(5.0, 12, np.zeros(0), np.zeros(0), np.zeros(0, np.int64))
    assert empty.abstain and empty.confidence == 0.0


def test_json_round_trip_scores_identically(profile):
    again = Profile.from_json(json.loads(json.dumps(profile.to_json())))
    args = (4.7, 20, np.linspace(0.8, 0.3, 10), np.full(10, 3.1), np.full(10, 120))
    a, b = profile.score(*args), again.score(*args)
    np.testing.assert_array_equal(a.probabilities, b.probabilities)
    assert a.confidence == b.confidence and a.abstain == b.abstain
    assert again.report.to_jsonable() == profile.report.to_jsonable()


def test_unsupported_profile_format_is_rejected(profile):
    data = profile.to_json() | {"format": 99}
    with pytest.raises(UnsupportedFormatError):
        Profile.from_json(data)


def _hits(probs):
    return [
        SearchHit(
            id=str(i),
            score=0.0,
            bm25=0.0,
            probability=p,
            norm=1.0,
            n_tokens=1,
            metadata={},
        )
        for i, p in enumerate(probs)
    ]


@pytest.mark.parametrize(
    ("probs", "min_p", "target", "expected"),
    [
        ([0.9, 0.6, 0.3, 0.1], None, None, ["0", "1", "2", "3"]),
        ([0.9, 0.6, 0.3, 0.1], 0.3, None, ["0", "1", "2"]),
        ([0.9, 0.6, 0.3, 0.1], None, 0.6, ["0", "1", "2"]),  # mean 0.6 exactly
        ([0.9, 0.6, 0.3, 0.1], None, 0.61, ["0", "1"]),
        ([0.4, 0.9, 0.9], None, 0.7, ["0", "1", "2"]),  # longest prefix, not first
        ([0.2, 0.1], None, 0.5, []),
        ([0.9, 0.6, 0.3, 0.1], 0.5, 0.9, ["0"]),
    ],
)
def test_min_probability_and_target_precision(probs, min_p, target, expected):
    assert [h.id for h in _cut(_hits(probs), min_p, target)] == expected
