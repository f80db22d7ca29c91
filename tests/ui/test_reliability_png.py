"""The reliability diagram is drawn from the report's bins, never per point."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from app.ui.report import _bins, reliability_png
from calibration.metrics import BINNING, ReliabilityCurve
from calibration.profile import Profile

DEFAULT = Path(__file__).resolve().parents[2] / "app/profiles/all-minilm-l6-v2.json"


def _profile_with(curve: ReliabilityCurve) -> Profile:
    profile = Profile.from_json(json.loads(DEFAULT.read_text(encoding="utf-8")))
    return replace(profile, report=replace(profile.report, reliability=curve))


def _curve(n: int) -> ReliabilityCurve:
    p = np.linspace(0.0, 1.0, n)
    return ReliabilityCurve(
        mean_predicted=p,
        observed_frequency=p,
        counts=np.ones(n, dtype=np.int64),
        bin_edges=np.linspace(0.0, 1.0, BINNING.n_bins + 1),
        strategy="quantile",
    )


def test_a_curve_of_its_bins_is_drawn_as_is():
    curve = _profile_with(_curve(BINNING.n_bins)).report.reliability
    predicted, observed, counts = _bins(curve)
    assert predicted == curve.mean_predicted.tolist() and counts == [1.0] * 15
    assert observed == curve.observed_frequency.tolist()


def test_a_long_stored_curve_is_merged_into_the_bins_count_weighted():
    # 150,000 points (a profile stored before imports were checked): 15 points drawn.
    predicted, observed, counts = _bins(_curve(150_000))
    assert len(predicted) == len(observed) == len(counts) == BINNING.n_bins
    assert sum(counts) == 150_000
    assert np.all(np.diff(predicted) > 0) and 0.0 <= predicted[0] < predicted[-1] <= 1.0
    png = reliability_png(_profile_with(_curve(150_000)))
    assert png.startswith(b"\x89PNG")


def test_garbage_in_a_stored_curve_draws_an_empty_diagram():
    bad = replace(_curve(3), counts="abc")  # type: ignore[arg-type]
    assert _bins(bad) == ([], [], [])
    nan = replace(_curve(3), mean_predicted=np.array([np.nan, 0.5, 1.0]))
    assert len(_bins(nan)[0]) == 2
    assert reliability_png(_profile_with(bad)).startswith(b"\x89PNG")
