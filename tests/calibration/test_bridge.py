"""The bridge from evidence to probabilities lives in ``calibration``: pure and single."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scipy.special import logit

from calibration import expected_calibration_error, query_features, reliability_curve
from calibration.metrics import BINNING
from calibration.query import noisy_or
from calibration.selection import VARIANTS


@pytest.mark.slow  # starts a Python process
def test_bridge_modules_import_no_service_dependencies():
    code = (
        "import calibration.profile, calibration.evaluation, calibration.report, sys; "
        "bad = [m for m in ('fastapi', 'torch', 'faiss', 'app') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_binning_is_the_fifteen_equal_mass_bin_protocol():
    rng = np.random.default_rng(0)
    p = rng.uniform(size=500)
    y = (rng.uniform(size=500) < p).astype(float)
    assert BINNING.label == "15 equal-mass bins"
    assert BINNING.ece(y, p) == expected_calibration_error(
        y, p, n_bins=15, strategy="quantile"
    )
    curve = BINNING.curve(y, p)
    assert curve.strategy == "quantile" and len(curve.bin_edges) == 16
    assert len(reliability_curve(y, p).bin_edges) == 16  # default bin count


def test_query_features_use_the_one_noisy_or():
    p = np.array([0.7, 0.2, 0.05])
    expected = 1 - np.prod(1 - p)
    assert noisy_or(p) == pytest.approx(expected)
    assert query_features(p)[1] == pytest.approx(logit(expected))


def test_variant_names_are_the_stored_report_names():
    """Stored reports key CV scores, the norm lift and the evidence lift by these
    names (new variants are added, never renamed)."""
    names = [v.name for v in VARIANTS]
    assert names == [
        "prior",
        "platt",
        "isotonic",
        "nt-list/none",
        "nt-list/length",
        "nt",
        "nt-list/residual",
        "nt-list/length+residual",
        "nt-list/length+lexical",
        "nt-list/length+lexical+residual",
        "nt/wide",
        "nt-list/wide",
    ]
    lift = {v.lift_key: v.name for v in VARIANTS if v.lift_key}
    assert lift == {
        "none": "nt-list/none",
        "length": "nt-list/length",
        "residual": "nt-list/residual",
        "length+residual": "nt-list/length+residual",
    }
    uses_norms = {v.name for v in VARIANTS if v.norm_terms}
    assert uses_norms == {
        "nt",
        "nt/wide",
        "nt-list/residual",
        "nt-list/length+residual",
        "nt-list/length+lexical+residual",
        "nt-list/wide",
    }
    uses_lexical = {v.name for v in VARIANTS if v.lexical_terms}
    assert uses_lexical == {
        "nt-list/length+lexical",
        "nt-list/length+lexical+residual",
    }
