"""Leave-one-dataset-out transfer benchmark of the cross-domain prior (issue 9).

Usage (from the repo root, with ``../shared/data``, ``NORMCAL_SHARED_DATA`` or ``--data``)::

    python -m benchmarks.transfer --out benchmarks/out/transfer.json

For each held-out set X the prior is fitted on the other sets only (each set weighted
equally), then scored on X with no judgments from X (zero-label), and refitted from
n = 5, 10, 30 judged queries of X (several random draws, scored on X's other queries)
against Platt on the same n queries and ``auto`` fitted on all of X's judgments
(nested 5-fold grouped CV, the reference of ``normcal eval``).

Each relevance set is embedded once with the real model; its top-``K`` retrieval
evidence and the nested-CV ``auto`` predictions are cached outside git under
``~/.cache/normcal/transfer/<model>/`` (``--cache``) and reused.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from calibration import (
    NormReference,
    PlattCalibrator,
    PriorCalibrator,
    SingleClassError,
    auroc,
    brier_score,
    cross_val_predict_grouped,
    expected_calibration_error,
    fit_confidence_weight,
    fit_prior,
    interval_coverage,
    negative_log_likelihood,
    norm_lift_verdict,
    query_table,
)
from calibration.evaluation import EvalOptions, _draw_train, nested_cv
from calibration.prior import PRIOR_FEATURES
from calibration.profile import QueryEvidence, build_features, single_threaded_blas
from calibration.report import to_jsonable

FloatArray = NDArray[np.float64]
REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))
SETS = ("scifact", "cranfield", "cisi", "cacm", "npl", "cf", "time", "aila-statutes")
K = 20
CACHE = Path.home() / ".cache" / "normcal" / "transfer"
SIZES = (5, 10, 30)
TARGET_VS_FULL = {5: 1.20, 10: 1.10, 30: 1.05}
WITH_NORM = (*PRIOR_FEATURES, "ell_q")


# -- evidence cache ----------------------------------------------------------------------
def _cache_file(cache: Path, model: str, name: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model)
    return cache / slug / f"{name}.npz"


def build_cache(embedder: Any, name: str, data: Path, cache: Path) -> Path:
    """Embed one set with ``embedder`` and cache its top-``K`` evidence."""
    from app.cli.beir import embed_corpus, read_qrels, read_queries, retrieve

    path = _cache_file(cache, embedder.model_name, name)
    if path.exists():
        return path
    corpus = embed_corpus(embedder, data / name)
    queries = read_queries(data / name)
    qrels = read_qrels(data / name, "test")
    qids = sorted(q for q in qrels if q in queries)
    evidence = retrieve(embedder, corpus, queries, qids, K).evidence(corpus, qrels, K)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        path,
        model=np.array(embedder.model_name),
        query_norms=np.array([e.norm for e in evidence]),
        query_tokens=np.array([e.n_tokens for e in evidence]),
        scores=np.stack([e.scores for e in evidence]),
        doc_norms=np.stack([e.doc_norms for e in evidence]),
        doc_tokens=np.stack([e.doc_tokens for e in evidence]),
        labels=np.stack([e.labels for e in evidence if e.labels is not None]),
        corpus_norms=corpus.norms,
        corpus_tokens=corpus.n_tokens,
    )
    return path


def load_cache(
    path: Path,
) -> tuple[list[QueryEvidence], np.ndarray, np.ndarray]:
    """Evidence per judged query, and the corpus norms and token counts."""
    with np.load(path, allow_pickle=False) as z:
        evidence = [
            QueryEvidence(
                norm=float(z["query_norms"][i]),
                n_tokens=int(z["query_tokens"][i]),
                scores=z["scores"][i].astype(np.float64),
                doc_norms=z["doc_norms"][i].astype(np.float64),
                doc_tokens=z["doc_tokens"][i].astype(np.int64),
                labels=z["labels"][i].astype(np.float64),
            )
            for i in range(len(z["query_norms"]))
        ]
        return evidence, z["corpus_norms"], z["corpus_tokens"]


@dataclass(frozen=True)
class Domain:
    """One relevance set as calibration pairs (features of a label-free reference)."""

    name: str
    evidence: list[QueryEvidence]
    doc_ref: NormReference
    X: FloatArray
    y: FloatArray
    groups: NDArray[np.int64]
    offsets: NDArray[np.int64]


def load_domain(name: str, path: Path) -> Domain:
    return domain_of(name, *load_cache(path))


def domain_of(
    name: str,
    evidence: list[QueryEvidence],
    corpus_norms: np.ndarray,
    corpus_tokens: np.ndarray,
) -> Domain:
    """One set's labelled evidence as calibration pairs (label-free references)."""
    query_ref = NormReference().fit(
        np.array([e.norm for e in evidence]), np.array([e.n_tokens for e in evidence])
    )
    doc_ref = NormReference().fit(corpus_norms, corpus_tokens)
    X, groups = build_features(evidence, query_ref, doc_ref)
    y = np.concatenate([e.labels for e in evidence if e.labels is not None])
    offsets = np.concatenate([[0], np.cumsum([len(e.scores) for e in evidence])])
    return Domain(name, evidence, doc_ref, X, y, groups, offsets.astype(np.int64))


def full_auto(domain: Domain, path: Path) -> FloatArray:
    """Nested-CV held-out probabilities of ``auto`` on all of the set (cached)."""
    cached = path.with_name(f"{domain.name}.auto.npy")
    if cached.exists():
        out: FloatArray = np.load(cached)
        return out
    proba, _, _ = nested_cv(domain.evidence, domain.doc_ref, EvalOptions(reorder=False))
    np.save(cached, proba["auto"])
    return proba["auto"]


def _rows(domain: Domain, queries: NDArray[np.int64]) -> NDArray[np.int64]:
    return np.concatenate(
        [np.arange(domain.offsets[q], domain.offsets[q + 1]) for q in queries]
    ).astype(np.int64)


def _metrics(y: FloatArray, p: FloatArray) -> dict[str, float]:
    return {
        "brier": brier_score(y, p),
        "nll": negative_log_likelihood(y, p),
        "ece": expected_calibration_error(y, p, n_bins=15, strategy="quantile"),
        "auroc": auroc(y, p),
    }


def _mean_se(values: list[float]) -> dict[str, float]:
    v = np.asarray(values)
    se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")
    return {"mean": float(v.mean()), "se": se}


def held_out(
    target: Domain, others: list[Domain], auto_p: FloatArray, draws: int, seed: int
) -> dict[str, Any]:
    """Every figure for ``target`` from priors fitted without it."""
    sets = {d.name: (d.X, d.y) for d in others}
    prior = fit_prior(sets)
    y = target.y
    p = prior.predict_proba(target.X)
    lo, hi = prior.predict_interval(target.X)
    base = float(y.mean())
    zero = {
        **_metrics(y, p),
        "base_rate": base,
        "constant_brier": base * (1.0 - base),
        "interval_coverage": interval_coverage(y, p, lo, hi),
        "mean_interval_width": float(np.mean(hi - lo)),
        "mean_p": float(p.mean()),
    }
    out: dict[str, Any] = {
        "prior": prior.to_dict(),
        "zero_label": zero,
        "full_auto": _metrics(y, auto_p),
        "few_label": {},
    }
    rng = np.random.default_rng(seed)
    n_q = len(target.evidence)
    has_pos = np.array(
        [float(e.labels.max()) for e in target.evidence if e.labels is not None]
    )
    for n in SIZES:
        rows: dict[str, list[float]] = {
            "prior": [],
            "platt": [],
            "auto": [],
            "prior_vs_full": [],
            "width": [],
        }
        for _ in range(draws):
            train_q = _draw_train(rng, np.arange(n_q), n, has_pos)
            if train_q is None:
                continue
            test_q = np.setdiff1d(np.arange(n_q), train_q)
            tr, te = _rows(target, train_q), _rows(target, test_q)
            Xtr, ytr, gtr = target.X[tr], y[tr], target.groups[tr]
            est = PriorCalibrator(prior=prior.to_dict()).fit(Xtr, ytr, gtr)
            p_prior = est.predict_proba(target.X[te])
            lo_n, hi_n = est.predict_interval(target.X[te])
            try:
                p_platt = (
                    PlattCalibrator().fit(Xtr, ytr, gtr).predict_proba(target.X[te])
                )
            except SingleClassError:
                p_platt = np.full(len(te), np.clip(ytr.mean(), 1e-4, 1 - 1e-4))
            b_full = brier_score(y[te], auto_p[te])
            rows["prior"].append(brier_score(y[te], p_prior))
            rows["platt"].append(brier_score(y[te], p_platt))
            rows["auto"].append(b_full)
            rows["prior_vs_full"].append(rows["prior"][-1] / b_full)
            rows["width"].append(float(np.mean(hi_n - lo_n)))
        out["few_label"][str(n)] = {k: _mean_se(v) for k, v in rows.items()}
    out["norm_lift"], out["confidence_weight"] = _norm_and_confidence(target, others)
    return out


def _norm_and_confidence(
    target: Domain, others: list[Domain]
) -> tuple[dict[str, Any], float]:
    """Residual query norm in the prior: kept only by the one-SE rule (issue 9 item 6).

    Both variants are few-label fits on ``target`` by 5-fold grouped CV from priors
    fitted on ``others``; the norm-free held-out probabilities also fit the weight of
    the coherent query confidence.
    """
    sets = {d.name: (d.X, d.y) for d in others}
    oof = {}
    for key, feats in (("with", WITH_NORM), ("without", PRIOR_FEATURES)):
        prior = fit_prior(sets, features=feats)
        oof[key] = cross_val_predict_grouped(
            PriorCalibrator(prior=prior.to_dict()), target.X, target.y, target.groups
        )
    verdict = norm_lift_verdict(target.y, oof["with"], oof["without"], target.groups)
    _, hit, _ = query_table(oof["without"], target.groups, target.X[:, 1], target.y)
    assert hit is not None
    weight = fit_confidence_weight(oof["without"], target.groups, hit)
    return dataclasses.asdict(verdict), weight


# -- report ------------------------------------------------------------------------------
def _f(x: float, d: int = 4) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.{d}f}"


def tables(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "Zero-label (prior fitted on the other seven sets, no judgments from the row's set):",
        "",
        "| held-out set | base rate | constant Brier | Brier | NLL | ECE | AUROC | mean p "
        "| interval coverage | mean width |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        z = r["zero_label"]
        lines.append(
            f"| {name} | {_f(z['base_rate'], 3)} | {_f(z['constant_brier'])} "
            f"| {_f(z['brier'])} | {_f(z['nll'])} | {_f(z['ece'])} | {_f(z['auroc'], 3)} "
            f"| {_f(z['mean_p'], 3)} | {_f(z['interval_coverage'], 2)} "
            f"| {_f(z['mean_interval_width'], 3)} |"
        )
    lines += [
        "",
        "Few-label Brier (mean ± se over draws, on the set's other queries): prior "
        "fitted on n judged queries vs Platt on the same n vs `auto` on all judgments "
        "(nested CV, same pairs); ratio = prior / full-data auto (target ≤ 1.20, 1.10, "
        "1.05 at n = 5, 10, 30):",
        "",
        "| held-out set | n | prior | Platt | full-data auto | ratio | prior ≤ Platt "
        "| ratio on target | interval width |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        for n in SIZES:
            f = r["few_label"][str(n)]
            ratio = f["prior_vs_full"]["mean"]
            lines.append(
                f"| {name} | {n} | {_f(f['prior']['mean'])} ± {_f(f['prior']['se'])} "
                f"| {_f(f['platt']['mean'])} ± {_f(f['platt']['se'])} "
                f"| {_f(f['auto']['mean'])} | {_f(ratio, 3)} "
                f"| {'yes' if f['prior']['mean'] <= f['platt']['mean'] else 'NO'} "
                f"| {'yes' if ratio <= TARGET_VS_FULL[n] else 'NO'} "
                f"| {_f(f['width']['mean'], 3)} |"
            )
    lines += [
        "",
        "Residual query norm (ell_q) in the prior, 5-fold grouped CV of the prior fit "
        "on each set, one-SE rule; and the fitted weight of the coherent confidence "
        "(0 = max p, 1 = noisy-OR):",
        "",
        "| held-out set | NLL without | NLL with | verdict | confidence weight |",
        "|---|---|---|---|---|",
    ]
    for name, r in results.items():
        v = r["norm_lift"]
        lines.append(
            f"| {name} | {_f(v['nll_without'])} | {_f(v['nll_with'])} | {v['verdict']} "
            f"| {_f(r['confidence_weight'], 2)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--out", type=Path, help="write the JSON results here")
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sets", nargs="+", default=list(SETS))
    args = parser.parse_args(argv)
    from app.api.lifespan import load_embedder
    from app.settings import Settings

    settings = Settings()
    embedder = None
    paths = {}
    for name in args.sets:
        path = _cache_file(args.cache, settings.model_name, name)
        if not path.exists():
            embedder = embedder or load_embedder(settings)
            path = build_cache(embedder, name, args.data, args.cache)
        paths[name] = path
    domains = {name: load_domain(name, paths[name]) for name in args.sets}
    results: dict[str, dict[str, Any]] = {}
    with single_threaded_blas():
        for name, target in domains.items():
            print(f"held out: {name}", file=sys.stderr, flush=True)
            auto_p = full_auto(target, paths[name])
            others = [d for n, d in domains.items() if n != name]
            results[name] = held_out(target, others, auto_p, args.draws, args.seed)
    print(tables(results))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "model": settings.model_name,
            "k": K,
            "draws": args.draws,
            "sets": results,
        }
        args.out.write_text(
            json.dumps(to_jsonable(payload), indent=2, allow_nan=False) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
