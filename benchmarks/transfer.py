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
from collections.abc import Sequence
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
from calibration.features import LEXICAL_FEATURES
from calibration.prior import PRIOR_FEATURES, lodo_calibrate
from calibration.profile import QueryEvidence, build_features, single_threaded_blas
from calibration.report import to_jsonable

FloatArray = NDArray[np.float64]
REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))
SETS = (
    "scifact",
    "cranfield",
    "cisi",
    "cacm",
    "npl",
    "cf",
    "time",
    "aila-statutes",
    "med",
    "adi",
    "lisa",
    "cosqa",
    "csfcube",
    "semeval2015-cqa",
)
K = 20
CACHE = Path.home() / ".cache" / "normcal" / "corpus"
SIZES = (5, 10, 30)
MIN_TEST_QUERIES = 5  # a few-label size is skipped when it leaves fewer to score on
TARGET_VS_FULL = {5: 1.20, 10: 1.10, 30: 1.05}
FEATURES_SHIPPED = (*PRIOR_FEATURES, *LEXICAL_FEATURES)
"""Features of the shipped default profile (scripts/fit_default_profile.py)."""


# -- the sets as the service sees them ---------------------------------------------------
def hybrid_domains(
    embedder: Any, names: Sequence[str], data: Path, cache: Path
) -> dict[str, tuple[Domain, Any]]:
    """Each set's judged queries on the hybrid pool of ``K``, and its embedded corpus.

    The pool is what the service scores (the exact cosine top-``K`` and the BM25
    top-``K``, every hit with its lexical evidence, as ``normcal eval``). Corpus
    embeddings and the dense/BM25 lists are cached under ``cache`` (shared with
    ``benchmarks/eval_all.py``); a missing set is embedded with ``embedder``.
    """
    from app.cli.beir import embed_corpus, hybrid_retrieve, read_qrels, read_queries
    from calibration.features import LEXICAL_DEPTH

    out = {}
    for name in names:
        corpus = embed_corpus(embedder, data / name, cache)
        queries = read_queries(data / name)
        qrels = read_qrels(data / name, "test")
        qids = sorted(q for q in qrels if q in queries)
        depth = min(LEXICAL_DEPTH, len(corpus.ids))
        hybrid = hybrid_retrieve(
            embedder, data / name, corpus, queries, qids, depth, cache
        )
        evidence = hybrid.evidence(corpus, qrels, K)
        out[name] = (domain_of(name, evidence, corpus.norms, corpus.n_tokens), corpus)
    return out


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


def full_auto(domain: Domain, cached: Path) -> FloatArray:
    """Nested-CV held-out probabilities of ``auto`` on all of the set (cached)."""
    if cached.exists():
        out: FloatArray = np.load(cached)
        return out
    proba, _, _ = nested_cv(domain.evidence, domain.doc_ref, EvalOptions())
    cached.parent.mkdir(parents=True, exist_ok=True)
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
    target: Domain,
    others: list[Domain],
    auto_p: FloatArray,
    draws: int,
    seed: int,
    features: Sequence[str],
) -> dict[str, Any]:
    """Every figure for ``target`` from priors fitted without it.

    The served level and the interval width are chosen by :func:`lodo_calibrate` on
    the *other* sets only (nested leave-one-dataset-out), so every zero-label figure
    here is out of domain.
    """
    sets = {d.name: (d.X, d.y) for d in others}
    choice = lodo_calibrate(sets, features=features)
    prior = fit_prior(
        sets,
        features=features,
        width=choice.width,
        point_offset=choice.point_offset,
    )
    y = target.y
    p = prior.predict_proba(target.X)
    lo, hi = prior.predict_interval(target.X)
    base = float(y.mean())
    zero = {
        **_metrics(y, p),
        "base_rate": base,
        "constant_brier": base * (1.0 - base),
        "brier_vs_constant": brier_score(y, p) / (base * (1.0 - base)),
        "interval_coverage": interval_coverage(y, p, lo, hi),
        "strict_coverage": interval_coverage(y, p, lo, hi, alpha=0.0),
        "mean_interval_width": float(np.mean(hi - lo)),
        "mean_p": float(p.mean()),
        "width": choice.width,
        "point_offset": choice.point_offset,
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
        if n_q - n < MIN_TEST_QUERIES:
            continue  # too few queries left to score on
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
    out["norm_lift"], out["confidence_weight"] = _norm_and_confidence(
        target, others, features
    )
    return out


def _norm_and_confidence(
    target: Domain, others: list[Domain], features: Sequence[str]
) -> tuple[dict[str, Any], float]:
    """Residual query norm in the prior: kept only by the one-SE rule (issue 9 item 6).

    Both variants are few-label fits on ``target`` by 5-fold grouped CV from priors
    fitted on ``others``; the norm-free held-out probabilities also fit the weight of
    the coherent query confidence.
    """
    sets = {d.name: (d.X, d.y) for d in others}
    oof = {}
    with_norm = (*features, "ell_q")
    for key, feats in (("with", with_norm), ("without", tuple(features))):
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
            if str(n) not in r["few_label"]:
                continue
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
    parser.add_argument(
        "--features", nargs="+", default=list(FEATURES_SHIPPED), help="prior features"
    )
    args = parser.parse_args(argv)
    from app.api.lifespan import load_embedder
    from app.settings import Settings

    settings = Settings()
    embedder = load_embedder(settings)
    domains = {
        name: d
        for name, (d, _) in hybrid_domains(
            embedder, args.sets, args.data, args.cache
        ).items()
    }
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", settings.model_name)
    results: dict[str, dict[str, Any]] = {}
    with single_threaded_blas():
        for name, target in domains.items():
            print(f"held out: {name}", file=sys.stderr, flush=True)
            auto_p = full_auto(target, args.cache / "auto" / f"{slug}-{name}.npy")
            others = [d for n, d in domains.items() if n != name]
            results[name] = held_out(
                target, others, auto_p, args.draws, args.seed, args.features
            )
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
