"""Calibrator fit time: auto selection and a whole service profile vs one Platt fit.

The tests used to assert absolute fit times (under 10 s and 20 s), which fail on a
busy machine and say nothing on a fast one. This measures, in one run on the same
pairs (300 queries x 20 hits):

1. ``select_calibrator(method="auto")``: 5-fold grouped CV of every method, the norm
   variants, the refit (``calibration`` library, simulated list world);
2. ``fit_profile``: what ``POST .../calibrators`` runs (references, selection,
   abstain policy, report);
3. the baseline: one ``PlattCalibrator`` fit on the same pairs, measured here, now.

The ratios to the baseline are what to compare across machines and commits.

    python benchmarks/fit_speed.py [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

# Run from a checkout without installing: make the repository root importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration import PlattCalibrator, select_calibrator, simulate_judgments
from calibration.profile import fit_profile
from tests.services.test_calibrators_unit import synthetic_evidence

# The list world of tests/calibration/conftest.py.
WORLD = {
    "gamma_q": 0.5,
    "gamma_d": 0.3,
    "beta_q": 0.03,
    "delta_rank": 0.02,
    "delta_gap": 0.5,
    "delta_len_d": 0.02,
    "probe_link": 0.05,
}


def median_seconds(fn: Callable[[], object], reps: int) -> float:
    """Median wall time of ``reps`` calls of ``fn``."""
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    d = simulate_judgments(300, k=20, rng=20240612, **WORLD)
    evidence = synthetic_evidence(300, seed=2)
    doc_norms = np.full(100, 3.0) + np.linspace(-0.3, 0.3, 100)
    doc_tokens = np.arange(100) + 50

    baseline = median_seconds(lambda: PlattCalibrator().fit(d.X, d.y), args.reps)
    rows = {
        "select_calibrator auto (5-fold CV)": median_seconds(
            lambda: select_calibrator(d.X, d.y, d.groups), args.reps
        ),
        "fit_profile (service fit)": median_seconds(
            lambda: fit_profile(
                evidence, doc_norms=doc_norms, doc_tokens=doc_tokens, model="m"
            ),
            args.reps,
        ),
    }
    print(f"Command: `{' '.join(['python', *sys.argv])}`  ")
    print(f"300 queries x 20 hits ({d.X.shape[0]} pairs); median of {args.reps}.\n")
    print("| fit | seconds | x one Platt fit |")
    print("|---|---|---|")
    print(f"| Platt (baseline) | {baseline:.3f} | 1 |")
    for name, seconds in rows.items():
        print(f"| {name} | {seconds:.2f} | {seconds / baseline:.0f} |")


if __name__ == "__main__":
    main()
