from __future__ import annotations

import pytest

from calibration.simulate import SimulatedJudgments, simulate_judgments

SEED = 20240611


@pytest.fixture(scope="module")
def nt_world() -> SimulatedJudgments:
    """20k pairs drawn from the NT family of theory.md 4.5's recovery check."""
    return simulate_judgments(
        1000, k=20, rng=SEED, gamma_q=0.8, gamma_d=0.4, beta_q=0.1, probe_link=0.05
    )


@pytest.fixture(scope="module")
def list_world() -> SimulatedJudgments:
    """300 queries x 20 hits with modest norm signal and a strong list effect."""
    return simulate_judgments(
        300,
        k=20,
        rng=SEED + 1,
        gamma_q=0.5,
        gamma_d=0.3,
        beta_q=0.03,
        delta_rank=0.02,
        delta_gap=0.5,
        delta_len_d=0.02,
        probe_link=0.05,
    )
