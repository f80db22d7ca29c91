"""The served-query windows (``app.services.drift``) and the drift settings' bounds.

No model: the profiles are the shipped default, and copies of it given a reference
of made-up judged queries (the statistics are ``tests/calibration/test_drift.py``'s).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from app.services.drift import VERDICT_EVERY, DriftMonitor
from app.settings import Settings
from calibration.drift import DRIFT_FEATURES, reference_from
from calibration.profile import Profile

DEFAULT = Path(__file__).resolve().parents[2] / "app/profiles/all-minilm-l6-v2.json"
MIN_QUERIES = 20


@pytest.fixture(scope="module")
def default() -> Profile:
    return Profile.from_json(json.loads(DEFAULT.read_text(encoding="utf-8")))


def _summaries(n: int, seed: int, tokens: float = 12.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = np.column_stack(
        [
            rng.normal(0.5, 0.08, n),
            rng.gamma(2.0, 0.03, n),
            rng.normal(tokens, 2.0, n),
            rng.beta(1.0, 3.0, n),
            rng.beta(4.0, 2.0, n),
        ]
    )
    return list(rows)


def _fitted(default: Profile, calibrator_id: str) -> Profile:
    """The default profile as if fitted on 40 judged queries of this collection."""
    reference = reference_from(np.array(_summaries(40, seed=1)), np.arange(40) < 27)
    report = replace(default.report, drift_reference=reference)
    return replace(default, id=calibrator_id, default=False, report=report)


def test_no_window_without_judged_queries(default):
    monitor = DriftMonitor(100, MIN_QUERIES)
    monitor.observe("kb", default, _summaries(50, seed=2))
    monitor.observe("kb", None, _summaries(50, seed=2))
    old = replace(default, id="old", default=False)  # fitted before references
    monitor.observe("kb", old, _summaries(50, seed=2))
    assert monitor.verdict("kb", old) is None and monitor.samples() == []
    assert monitor.measure("kb", old).n_queries == 0


def test_a_verdict_from_the_minimum_on(default):
    monitor = DriftMonitor(100, MIN_QUERIES)
    fitted = _fitted(default, "a")
    served = _summaries(MIN_QUERIES, seed=3)
    monitor.observe("kb", fitted, served[:-1])
    measured = monitor.measure("kb", fitted)
    assert (measured.n_queries, measured.verdict) == (MIN_QUERIES - 1, None)
    assert monitor.verdict("kb", fitted) is None and measured.since is not None
    monitor.observe("kb", fitted, served[-1:])
    assert monitor.verdict("kb", fitted) == "ok"
    (name, drifting, psi), *_ = monitor.samples()
    assert (name, drifting, set(psi)) == ("kb", False, set(DRIFT_FEATURES))


def test_the_cached_verdict_is_refreshed_every_few_queries(default):
    monitor = DriftMonitor(MIN_QUERIES, MIN_QUERIES)
    fitted = _fitted(default, "a")
    monitor.observe("kb", fitted, _summaries(MIN_QUERIES, seed=4))
    assert monitor.verdict("kb", fitted) == "ok"
    long_queries = _summaries(MIN_QUERIES, seed=5, tokens=200.0)
    monitor.observe("kb", fitted, long_queries[: VERDICT_EVERY - 1])
    assert monitor.verdict("kb", fitted) == "ok"  # cached
    assert monitor.measure("kb", fitted).verdict.drifting  # measured afresh
    monitor.observe("kb", fitted, long_queries[VERDICT_EVERY - 1 :])
    assert monitor.verdict("kb", fitted) == "drifting"


def test_another_calibrator_starts_a_new_window(default):
    monitor = DriftMonitor(100, MIN_QUERIES)
    first, second = _fitted(default, "a"), _fitted(default, "b")
    monitor.observe("kb", first, _summaries(30, seed=6))
    monitor.observe("kb", second, _summaries(5, seed=7))
    assert monitor.measure("kb", first).n_queries == 0
    assert monitor.verdict("kb", first) is None
    assert monitor.measure("kb", second).n_queries == 5
    monitor.observe("kb", default, _summaries(5, seed=8))  # back to the default
    assert monitor.measure("kb", second).n_queries == 0
    monitor.observe("other", first, _summaries(30, seed=9))
    monitor.forget("other")
    assert monitor.samples() == []


@pytest.mark.parametrize(
    ("window", "minimum", "field"),
    [
        (9, 9, "drift_window"),
        (100_001, 50, "drift_window"),
        (100, 9, "drift_min_queries"),
        (100, 101, "drift_min_queries"),
    ],
)
def test_drift_settings_one_past_their_bounds_are_refused(
    tmp_path, window, minimum, field
):
    with pytest.raises(ValidationError) as info:
        Settings(data_dir=tmp_path, drift_window=window, drift_min_queries=minimum)
    assert field in str(info.value)


@pytest.mark.parametrize(("window", "minimum"), [(10, 10), (100_000, 100_000)])
def test_drift_settings_at_their_bounds_are_accepted(tmp_path, window, minimum):
    settings = Settings(
        data_dir=tmp_path, drift_window=window, drift_min_queries=minimum
    )
    assert (settings.drift_window, settings.drift_min_queries) == (window, minimum)
