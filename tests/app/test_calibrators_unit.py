"""Profiles without HTTP: scoring, JSON round trip, search cuts.

How long a fit takes is measured by ``benchmarks/fit_speed.py``, not asserted here.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.api.schemas.search import SearchHit
from app.calibrators import Profile, QueryEvidence, fit_profile
from app.service import _cut


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
    assert set(report["cv"]) == {"platt", "isotonic", "nt", "nt-list"}
    assert profile.method in report["cv"]
    assert report["n_queries"] == 300 and report["n_pairs"] == 6000
    for metrics in report["cv"].values():
        assert 0 <= metrics["brier"] <= 0.25 and 0 <= metrics["ece"] <= 1
    assert not profile.reorders_hits  # the service default never reorders
    json.dumps(report)  # JSON-able throughout


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
    assert again.report == json.loads(json.dumps(profile.report))


def test_unsupported_profile_format_is_rejected(profile):
    from calibration import UnsupportedFormatError

    data = profile.to_json() | {"format": 99}
    with pytest.raises(UnsupportedFormatError):
        Profile.from_json(data)


def _hits(probs):
    return [
        SearchHit(
            id=str(i), score=0.0, probability=p, norm=1.0, n_tokens=1, metadata={}
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
