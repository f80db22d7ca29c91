"""Leave-one-dataset-out: does a prior feature order the whole hybrid pool better? (issue 36)

Usage (from the repo root, with ``NORMCAL_SHARED_DATA`` or ``../shared/data``)::

    python -m benchmarks.fusion_lodo

For each of the fourteen sets, one cross-domain prior per feature variant is fitted on
the other thirteen sets' calibration pairs (the hybrid pool of 20, as the shipped
profile is) and, with no judgment of the held-out set, orders that set's whole hybrid
pool (the dense top 100 and the BM25 top 100, the pool ``normcal eval`` ranks). It
prints each variant's nDCG@10 (binary gains) per held-out set beside RRF's on the same
pool, and each variant's held-out NLL on the pool of 20. The variants: the shipped
features (``base``), plus the pair's RRF of its two list ranks (``+rrf``,
:data:`calibration.prior.FUSION_FEATURES`), and RRF in place of the log ranks
(``rrf-for-log-ranks``); and ``base, refitted``: the ``base`` prior refitted on the
held-out set's own judged pools of 20 (:func:`refitted`, five folds by query), as
``auto``'s few-label candidate is; ``refitted, prior past depth``: the same refits
with each rank past the deepest cosine-list and BM25-list rank of their training pairs
(their *judged depth*) clipped to it, the excess scored with the prior's slopes
(:func:`refitted`); ``refitted on whole pools``: the refits trained on the whole pools
of their four fifths (every pair judged, as the set's qrels allow), what judging deeper
in the pool would give. ``--slopes SET ...`` also prints, for those sets, each refitted
slope beside the prior's and the refit's nDCG@10 with that one slope put back to the
prior's (:func:`slope_resets`). Corpus embeddings and lists are cached under
``~/.cache/normcal/corpus``; under a minute once cached (embedding the fourteen
corpora first took 18 minutes here).
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy.special import expit

from app.api.lifespan import load_embedder
from app.cli.beir import embed_corpus, hybrid_retrieve
from app.cli.inputs import read_qrels, read_queries
from app.embedding import Embedder
from app.settings import Settings
from benchmarks.eval_all import CACHE, DATA
from benchmarks.transfer import FEATURES_SHIPPED, SETS, Domain, K, domain_of
from calibration import (
    CrossDomainPrior,
    PriorCalibrator,
    fit_prior,
    negative_log_likelihood,
)
from calibration.features import LEX_RANK, LEXICAL_DEPTH, RANK
from calibration.fusion import pair_rrf
from calibration.profile import single_threaded_blas

FOLDS = 5
REFIT = "base, refitted"
DEPTH = "refitted, prior past depth"
WHOLE = "refitted on whole pools"
DEPTH_COLUMNS = [RANK, LEX_RANK]
VARIANTS: dict[str, tuple[str, ...]] = {
    "base": FEATURES_SHIPPED,
    "+rrf": (*FEATURES_SHIPPED, "rrf"),
    "rrf-for-log-ranks": tuple(
        f for f in (*FEATURES_SHIPPED, "rrf") if f not in ("rank", "lex_rank")
    ),
}


def pools(name: str, embedder: Embedder) -> tuple[Domain, Domain, np.ndarray]:
    """A set's pool of ``K`` and its whole hybrid pool, with relevant counts per query."""
    corpus = embed_corpus(embedder, DATA / name, CACHE)
    queries = read_queries(DATA / name)
    qrels = read_qrels(DATA / name, "test")
    qids = sorted(q for q in qrels if q in queries)
    depth = min(LEXICAL_DEPTH, len(corpus.ids))
    lists = hybrid_retrieve(embedder, DATA / name, corpus, queries, qids, depth, CACHE)
    top, whole = (
        domain_of(name, lists.evidence(corpus, qrels, n), corpus.norms, corpus.n_tokens)
        for n in (K, depth)
    )
    n_relevant = np.array(
        [sum(1 for v in qrels[q].values() if v > 0) for q in lists.query_ids], float
    )
    return top, whole, n_relevant


def ndcg10(score: np.ndarray, d: Domain, n_relevant: np.ndarray) -> float:
    """Mean nDCG@10 (binary gains) of ordering each query's pool by ``score``."""
    values = []
    discount = 1.0 / np.log2(np.arange(2, 12))
    for q in range(len(d.evidence)):
        if n_relevant[q] == 0:
            continue
        rows = slice(d.offsets[q], d.offsets[q + 1])
        order = np.lexsort((d.X[rows, RANK], -score[rows]))[:10]
        dcg = float(d.y[rows][order] @ discount[: len(order)])
        values.append(dcg / float(discount[: int(min(10, n_relevant[q]))].sum()))
    return float(np.mean(values))


def refits(prior: CrossDomainPrior, top: Domain) -> list[PriorCalibrator]:
    """``prior`` refitted on four fifths of ``top``'s queries (pools of ``K``), per fold.

    Five folds by query, as :class:`PriorCalibrator` (``auto``'s few-label candidate)
    is; fold ``f`` scores the whole pools of the queries ``groups % 5 == f``.
    """
    out = []
    for fold in range(FOLDS):
        train = top.groups % FOLDS != fold
        est = PriorCalibrator(prior=prior.to_dict())
        out.append(est.fit(top.X[train], top.y[train], top.groups[train]))
    return out


def refitted(
    prior: CrossDomainPrior, top: Domain, whole: Domain
) -> tuple[np.ndarray, np.ndarray]:
    """Whole-pool probabilities of the refits, as fitted and with the prior past depth.

    The second: each pair's ranks clipped to the fold's judged depth (the deepest
    cosine-list and BM25-list rank among its training pairs) for the refit's
    coefficients, the excess (standardised log rank past the depth) scored with the
    prior's slopes, so the refit is unchanged within the depth and the prior orders
    what lies beyond it.
    """
    plain, deep = np.zeros((2, len(whole.y)))
    mean, _ = prior.prior_mean_sd()
    for fold, est in enumerate(refits(prior, top)):
        train, test = top.groups % FOLDS != fold, whole.groups % FOLDS == fold
        X = whole.X[test]
        plain[test] = est.predict_proba(X)
        depth = top.X[train][:, DEPTH_COLUMNS].max(axis=0)
        clipped = X.copy()
        clipped[:, DEPTH_COLUMNS] = np.minimum(X[:, DEPTH_COLUMNS], depth)
        beyond = (prior.standardise(X) - prior.standardise(clipped)) @ mean
        deep[test] = expit(est.decision_function(clipped) + beyond)
    return plain, deep


def slope_resets(
    prior: CrossDomainPrior, top: Domain, whole: Domain, n_relevant: np.ndarray
) -> list[tuple[str, float, float, float]]:
    """Per feature: the prior's slope, the refits' mean slope, and the refits' nDCG@10
    with that one slope put back to the prior's (standardised units)."""
    mean, _ = prior.prior_mean_sd()
    fitted = refits(prior, top)
    out = []
    for j, name in enumerate(prior.features, start=1):
        score = np.zeros(len(whole.y))
        for fold, est in enumerate(fitted):
            test = whole.groups % FOLDS == fold
            coef = est.coef_.copy()
            coef[j] = mean[j]
            score[test] = prior.standardise(whole.X[test]) @ coef
        refit_slope = float(np.mean([e.coef_[j] for e in fitted]))
        out.append((name, mean[j], refit_slope, ndcg10(score, whole, n_relevant)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="+", default=list(SETS))
    parser.add_argument("--slopes", nargs="*", default=[], choices=SETS)
    args = parser.parse_args(argv)
    embedder = load_embedder(Settings())
    with single_threaded_blas():
        data = {name: pools(name, embedder) for name in SETS}
        names = [*VARIANTS, REFIT, DEPTH, WHOLE]
        nll_names = list(VARIANTS)
        print(
            f"| held-out set | RRF | {' | '.join(names)} | NLL@20 {' / '.join(nll_names)} |"
        )
        print("|---|---|" + "---|" * len(names) + "---|")
        totals: dict[str, list[float]] = {n: [] for n in ["RRF", *names]}
        for name in args.sets:
            top, whole, n_relevant = data[name]
            others = {k: (v[0].X, v[0].y) for k, v in data.items() if k != name}
            ranked = {"RRF": ndcg10(pair_rrf(whole.X), whole, n_relevant)}
            nll = []
            for variant, features in VARIANTS.items():
                prior = fit_prior(others, features=features)
                ranked[variant] = ndcg10(
                    prior.predict_proba(whole.X), whole, n_relevant
                )
                if variant == "base":
                    refit, deep = refitted(prior, top, whole)
                    ranked[REFIT] = ndcg10(refit, whole, n_relevant)
                    ranked[DEPTH] = ndcg10(deep, whole, n_relevant)
                    refit, _ = refitted(prior, whole, whole)
                    ranked[WHOLE] = ndcg10(refit, whole, n_relevant)
                nll.append(negative_log_likelihood(top.y, prior.predict_proba(top.X)))
            for k, v in ranked.items():
                totals[k].append(v)
            cells = " | ".join(f"{ranked[n]:.3f}" for n in names)
            print(
                f"| {name} | {ranked['RRF']:.3f} | {cells} | "
                f"{' / '.join(f'{v:.4f}' for v in nll)} |",
                flush=True,
            )
        means = " | ".join(f"{np.mean(totals[n]):.4f}" for n in names)
        print(f"| mean | {np.mean(totals['RRF']):.4f} | {means} | |")
        if args.slopes:
            print(
                "\n| set | feature | prior slope | refitted | nDCG@10 with it reset |"
            )
            print("|---|---|---|---|---|")
        for name in args.slopes:
            top, whole, n_relevant = data[name]
            others = {k: (v[0].X, v[0].y) for k, v in data.items() if k != name}
            prior = fit_prior(others, features=VARIANTS["base"])
            for feature, was, now, nd in slope_resets(prior, top, whole, n_relevant):
                print(f"| {name} | {feature} | {was:.3f} | {now:.3f} | {nd:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
