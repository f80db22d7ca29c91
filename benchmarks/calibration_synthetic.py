"""Learning curve of held-out NLL on simulated retrieval judgments.

World: queries with 20 judged hits (top-20 of 200 candidate cosines), norms with a
modest signal (gamma_q=0.5, gamma_d=0.3, beta_q=0.03), a list effect (gap, rank) and
a sign probe the fit can read from X. For each budget of labelled queries and each
repetition, every method is fitted on the labelled queries and scored on 1000 fresh
queries. Prints a Markdown table (mean NLL +- standard error over repetitions).

    python benchmarks/calibration_synthetic.py [--reps 5] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

# Run from a checkout without installing: make the repository root importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration import (
    IsotonicCalibrator,
    ListAwareCalibrator,
    NormTemperedCalibrator,
    PlattCalibrator,
    negative_log_likelihood,
    simulate_judgments,
)

WORLD = {
    "gamma_q": 0.5,
    "gamma_d": 0.3,
    "beta_q": 0.03,
    "delta_rank": 0.01,
    "delta_gap": 0.3,
    "probe_link": 0.05,
}
BUDGETS = (10, 30, 100, 300)
METHODS = {
    "NT, theory prior": lambda: NormTemperedCalibrator(),
    "NT, flat prior": lambda: NormTemperedCalibrator(prior_width="none"),
    "Platt": lambda: PlattCalibrator(),
    "isotonic": lambda: IsotonicCalibrator(),
    "NT-list, theory prior": lambda: ListAwareCalibrator(),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    test = simulate_judgments(1000, rng=args.seed + 10_000, **WORLD)
    base = negative_log_likelihood(test.y, test.p_true)
    results: dict[tuple[str, int], list[float]] = {}
    for n in BUDGETS:
        for rep in range(args.reps):
            train = simulate_judgments(n, rng=args.seed * 1000 + n * 37 + rep, **WORLD)
            if train.y.min() == train.y.max():
                continue
            for name, make in METHODS.items():
                # Diverging flat fits are part of what is measured: score them too.
                try:
                    est = make().fit(train.X, train.y, train.groups)
                    p = est.predict_proba(test.X)
                    nll = negative_log_likelihood(test.y, p)
                except Exception as exc:
                    print(f"# {name} n={n} rep={rep}: {exc}", file=sys.stderr)
                    nll = float("nan")
                results.setdefault((name, n), []).append(nll)
    print(f"Command: `{' '.join(['python', *sys.argv])}`  ")
    print(
        f"World: {WORLD}; 20 hits/query; test set 1000 queries "
        f"({test.y.shape[0]} pairs, positive rate {test.y.mean():.3f}); "
        f"NLL of the true probabilities {base:.4f}; {args.reps} repetitions; "
        f"{time.perf_counter() - t0:.1f} s.\n"
    )
    print("| labelled queries (pairs) | " + " | ".join(METHODS) + " |")
    print("|---" * (len(METHODS) + 1) + "|")
    for n in BUDGETS:
        cells = []
        for name in METHODS:
            v = np.asarray(results.get((name, n), []), dtype=float)
            v = v[np.isfinite(v)]
            if v.size == 0:
                cells.append("n/a")
                continue
            se = v.std(ddof=1) / np.sqrt(v.size) if v.size > 1 else 0.0
            cells.append(f"{v.mean():.4f} ± {se:.4f}")
        print(f"| {n} ({n * 20}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
