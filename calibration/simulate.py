r"""Simulated retrieval judgments drawn from the NT-list family (tests and benchmarks).

Each query retrieves the top ``k`` of a pool of candidate cosines
:math:`s \sim \mathcal N(m_q, \sigma_s^2)` with a query-level offset
:math:`m_q \sim \mathcal N(\mu_s, \sigma_m^2)`; norms and lengths are independent
standard-ish draws; labels are Bernoulli with

.. math::

    \operatorname{logit} P = e^{\alpha + \gamma_q\ell_q + \gamma_d\ell_d}
    (s - \beta_0 - \beta_q\ell_q - \beta_d\ell_d - \delta_r\log\text{rank}
    - \delta_g\,\text{gap} - \delta_{lq}\text{len}_q - \delta_{ld}\text{len}_d
    - \delta_x\text{lex} - \delta_{xr}\text{lex\_rel}
    - \delta_{xk}\log\tfrac{\text{lex\_rank}}{D+1}).

With ``lexical=True`` every query also gets BM25 evidence
(:class:`~calibration.features.LexicalEvidence`), drawn independently of the cosines:
each hit matches some query terms with probability 0.6, a match reaches a Beta(2, 3)
share of 1.6 times the query's IDF mass, and BM25 ranks interleave the hits with other
matching documents of the collection. The lexical shifts are those of
:class:`~calibration.models.ListAwareCalibrator` (negative ``delta_lex`` raises a
hit); without ``lexical`` the random stream and every draw are those of before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from calibration._typing import FloatArray, IntArray
from calibration.features import (
    LEX,
    LEXICAL_DEPTH,
    LexicalEvidence,
    stack_pair_features,
)

__all__ = ["SimulatedJudgments", "simulate_judgments"]


@dataclass(frozen=True)
class SimulatedJudgments:
    """A simulated labelled batch.

    Attributes
    ----------
    X : ndarray of shape (n_queries * k, 12)
        Pair features in ``FEATURES`` order.
    y : ndarray of shape (n_queries * k,)
        Labels (0/1 as float64).
    groups : ndarray of shape (n_queries * k,)
        Query index of each pair.
    p_true : ndarray of shape (n_queries * k,)
        The true relevance probabilities.
    params : dict
        Parameters used.
    """

    X: FloatArray
    y: FloatArray
    groups: IntArray
    p_true: FloatArray
    params: dict[str, float] = field(default_factory=dict)


def simulate_judgments(
    n_queries: int,
    *,
    k: int = 20,
    rng: np.random.Generator | int | None = None,
    alpha: float = float(np.log(25.0)),
    beta0: float = 0.62,
    gamma_q: float = 0.5,
    gamma_d: float = 0.3,
    beta_q: float = 0.03,
    beta_d: float = 0.0,
    delta_rank: float = 0.0,
    delta_gap: float = 0.0,
    delta_len_q: float = 0.0,
    delta_len_d: float = 0.0,
    ell_sd: float = 0.5,
    cos_mean: float = 0.35,
    cos_sd: float = 0.1,
    query_sd: float = 0.05,
    pool: int = 200,
    probe_link: float = 0.0,
    lexical: bool = False,
    delta_lex: float = 0.0,
    delta_lex_rel: float = 0.0,
    delta_lex_rank: float = 0.0,
) -> SimulatedJudgments:
    """Draw ``n_queries`` queries with ``k`` judged hits each from the NT-list family.

    Parameters
    ----------
    n_queries : int
        Number of queries.
    k : int, default=20
        Hits per query (top ``k`` of ``pool`` candidates).
    rng : numpy Generator, int or None, default=None
        Random source or seed.
    alpha, beta0, gamma_q, gamma_d, beta_q, beta_d : float
        NT parameters (module docstring).
    delta_rank, delta_gap, delta_len_q, delta_len_d : float
        List and length threshold shifts.
    ell_sd : float, default=0.5
        SD of the ell draws before clipping to +-1.5 (the scale of NormReference).
    cos_mean, cos_sd, query_sd : float
        Candidate cosine distribution.
    pool : int, default=200
        Candidates per query.
    probe_link : float, default=0.0
        Added to :math:`m_q` per unit of query ell, so the label-free sign probe
        sees long queries in tighter (``> 0``) or looser (``< 0``) neighbourhoods.
    lexical : bool, default=False
        Draw BM25 evidence for every query (module docstring); without it the
        lexical columns say "no lexical match".
    delta_lex, delta_lex_rel, delta_lex_rank : float
        Lexical threshold shifts (used with ``lexical=True``).

    Returns
    -------
    SimulatedJudgments
        Features, labels, groups and true probabilities.
    """
    gen = np.random.default_rng(rng)
    scores: list[FloatArray] = []
    ell_d: list[FloatArray] = []
    len_d: list[FloatArray] = []
    ell_q = np.clip(ell_sd * gen.standard_normal(n_queries), -1.5, 1.5)
    len_q = 0.5 * gen.standard_normal(n_queries)
    m = cos_mean + query_sd * gen.standard_normal(n_queries) + probe_link * ell_q
    for q in range(n_queries):
        cand = m[q] + cos_sd * gen.standard_normal(pool)
        scores.append(np.sort(cand)[::-1][:k])
        ell_d.append(np.clip(ell_sd * gen.standard_normal(k), -1.5, 1.5))
        len_d.append(0.5 * gen.standard_normal(k))
    evidence = (
        [_lexical_evidence(gen, k) for _ in range(n_queries)] if lexical else None
    )
    X, groups = stack_pair_features(scores, ell_q, ell_d, len_q, len_d, evidence)
    s, lq, ld, rank, gap, lnq, lnd, lex, lex_rel, lex_rank = X.T[: LEX + 3]
    temp = np.exp(alpha + gamma_q * lq + gamma_d * ld)
    shift = (
        beta0
        + beta_q * lq
        + beta_d * ld
        + delta_rank * np.log(rank)
        + delta_gap * gap
        + delta_len_q * lnq
        + delta_len_d * lnd
        + delta_lex * lex
        + delta_lex_rel * lex_rel
        + delta_lex_rank * np.log(lex_rank / (LEXICAL_DEPTH + 1))
    )
    p = 1.0 / (1.0 + np.exp(-temp * (s - shift)))
    y = (gen.random(p.shape[0]) < p).astype(np.float64)
    params = {
        "alpha": alpha,
        "beta0": beta0,
        "gamma_q": gamma_q,
        "gamma_d": gamma_d,
        "beta_q": beta_q,
        "beta_d": beta_d,
        "delta_rank": delta_rank,
        "delta_gap": delta_gap,
        "delta_len_q": delta_len_q,
        "delta_len_d": delta_len_d,
        "delta_lex": delta_lex,
        "delta_lex_rel": delta_lex_rel,
        "delta_lex_rank": delta_lex_rank,
    }
    return SimulatedJudgments(X=X, y=y, groups=groups, p_true=p, params=params)


def _lexical_evidence(gen: np.random.Generator, k: int) -> LexicalEvidence:
    """BM25 evidence of ``k`` hits of one query (module docstring)."""
    idf_mass = float(gen.uniform(4.0, 12.0))
    matched = gen.random(k) < 0.6
    bm25 = np.where(matched, 1.6 * gen.beta(2.0, 3.0, k) * idf_mass, 0.0)
    top = max(float(bm25.max()), idf_mass * float(gen.uniform(0.8, 1.6)))
    order = np.argsort(-bm25, kind="stable")
    # Other matching documents of the collection interleave with the hits.
    ranks = np.empty(k)
    ranks[order] = np.arange(1, k + 1) + np.cumsum(gen.poisson(1.5, k))
    ranks = np.where(matched, np.minimum(ranks, LEXICAL_DEPTH + 1), LEXICAL_DEPTH + 1)
    return LexicalEvidence(bm25=bm25, rank=ranks, idf_mass=idf_mass, top=top)
