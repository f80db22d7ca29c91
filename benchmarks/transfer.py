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
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from benchmarks.eval_all import CACHE, DATA
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
from calibration.features import FEATURES, LEXICAL_FEATURES
from calibration.metrics import paired_nll_gain
from calibration.prior import AGNOSTIC_FEATURES, PRIOR_FEATURES, lodo_calibrate
from calibration.profile import QueryEvidence, build_features, single_threaded_blas
from calibration.report import to_jsonable

FloatArray = NDArray[np.float64]
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
    from app.cli.beir import embed_corpus, hybrid_retrieve
    from app.cli.inputs import read_qrels, read_queries
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
        "Zero-label (prior fitted on the other sets, its served level and width "
        "chosen on them; no judgments from the row's set). Coverage allows for each "
        "bin's sampling error (strict: the observed rate itself):",
        "",
        "| held-out set | base rate | constant Brier | Brier | Brier ÷ constant | NLL "
        "| ECE | AUROC | mean p | coverage | strict | mean width | level offset "
        "| width |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        z = r["zero_label"]
        lines.append(
            f"| {name} | {_f(z['base_rate'], 3)} | {_f(z['constant_brier'])} "
            f"| {_f(z['brier'])} | {_f(z['brier_vs_constant'], 2)} | {_f(z['nll'])} "
            f"| {_f(z['ece'])} | {_f(z['auroc'], 3)} | {_f(z['mean_p'], 3)} "
            f"| {_f(z['interval_coverage'], 2)} | {_f(z['strict_coverage'], 2)} "
            f"| {_f(z['mean_interval_width'], 3)} | {_f(z['point_offset'], 3)} "
            f"| {_f(z['width'], 2)} |"
        )
    zs = [r["zero_label"] for r in results.values()]
    ten = [r["few_label"]["10"] for r in results.values() if "10" in r["few_label"]]
    lines += [
        "",
        f"Coverage ≥ 0.8 on {sum(z['interval_coverage'] >= 0.8 for z in zs)} of "
        f"{len(zs)} sets; Brier ÷ constant ≤ 1.25 on "
        f"{sum(z['brier_vs_constant'] <= 1.25 for z in zs)}, ≤ 1.0 on "
        f"{sum(z['brier_vs_constant'] <= 1.0 for z in zs)}; prior ≤ Platt at 10 "
        f"judged queries on {sum(f['prior']['mean'] <= f['platt']['mean'] for f in ten)}"
        f" of {len(ten)}.",
    ]
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


# -- label-free level evidence (issue 26 item 2) -----------------------------------------
def collection_statistics(domain: Domain, n_docs: int) -> dict[str, float]:
    """Statistics of one collection that need no judgment (over its query lists)."""
    col = {name: FEATURES.index(name) for name in FEATURES}
    X, groups = domain.X, domain.groups
    lists = [X[groups == q] for q in np.unique(groups)]
    dense = [x[x[:, col["rank"]] <= K, col["cosine"]] for x in lists]
    return {
        "top_cosine": float(np.mean([x[:, col["cosine"]].max() for x in lists])),
        "top_gap": float(np.mean([s.max() - s.mean() for s in dense if len(s)])),
        "cosine_sd": float(np.mean([s.std() for s in dense if len(s)])),
        "pool_overlap": float(np.mean([(2 * K - len(x)) / K for x in lists])),
        "log_docs": math.log(n_docs),
        "top_lexical": float(np.mean([x[:, col["lex"]].max() for x in lists])),
    }


def level_evidence(
    domains: dict[str, Domain], n_docs: dict[str, int], features: Sequence[str]
) -> dict[str, Any]:
    """Does a collection statistic predict the held-out set's level? (LODO)

    For each statistic and held-out set: the other sets' levels (from a prior fitted
    on them) are regressed on the statistic, and the held-out set is scored at the
    predicted level instead of the prior's location. Gain: held-out NLL per pair
    over the plain prior, ± one SE of the paired per-query difference (pooled over
    sets), and the number of sets it helped.
    """
    stats = {n: collection_statistics(d, n_docs[n]) for n, d in domains.items()}
    plain: dict[str, FloatArray] = {}
    moved: dict[str, dict[str, FloatArray]] = {
        s: {} for s in next(iter(stats.values()))
    }
    for name, d in domains.items():
        others = {n: (o.X, o.y) for n, o in domains.items() if n != name}
        prior = fit_prior(others, features=features)
        plain[name] = prior.predict_proba(d.X)
        levels = np.array(prior.levels)
        for stat in moved:
            x = np.array([stats[n][stat] for n in prior.domains])
            slope, intercept = np.polyfit(x, levels, 1)
            level = float(intercept + slope * stats[name][stat])
            moved[stat][name] = dataclasses.replace(
                prior, level_mean=level
            ).predict_proba(d.X)
    y = np.concatenate([d.y for d in domains.values()])
    offsets = np.cumsum([0] + [len(d.evidence) for d in domains.values()])
    codes = np.concatenate(
        [d.groups + o for d, o in zip(domains.values(), offsets, strict=False)]
    )
    base = np.concatenate(list(plain.values()))
    out: dict[str, Any] = {"statistics": stats, "candidates": {}}
    for stat, per_set in moved.items():
        gain, se = paired_nll_gain(
            np.concatenate([per_set[n] for n in domains]), base, y, codes
        )
        by_set = np.array(
            [
                negative_log_likelihood(d.y, plain[n])
                - negative_log_likelihood(d.y, per_set[n])
                for n, d in domains.items()
            ]
        )
        set_se = float(by_set.std(ddof=1) / math.sqrt(len(by_set)))
        out["candidates"][stat] = {
            "nll_gain": gain,
            "se": se,
            "set_gain": float(by_set.mean()),
            "set_se": set_se,
            "sets_helped": int((by_set > 0).sum()),
            # A level statistic acts on a whole set: the sets are its units.
            "kept": bool(gain > se and by_set.mean() > set_se),
        }
    return out


def level_table(result: dict[str, Any], n_sets: int) -> str:
    lines = [
        "Label-free level evidence, leave-one-dataset-out: held-out NLL gain per pair "
        "over the plain prior (pooled, ± one SE of the paired per-query difference; "
        "and the mean of the per-set gains ± their SE, a level statistic acting on a "
        "whole set); kept only when both clear one SE:",
        "",
        "| statistic | pooled gain (1e-3) | SE | per-set gain (1e-3) | SE "
        "| sets helped | kept |",
        "|---|---|---|---|---|---|---|",
    ]
    for stat, c in result["candidates"].items():
        lines.append(
            f"| {stat} | {1e3 * c['nll_gain']:+.1f} | {1e3 * c['se']:.1f} "
            f"| {1e3 * c['set_gain']:+.1f} | {1e3 * c['set_se']:.1f} "
            f"| {c['sets_helped']} of {n_sets} | {'yes' if c['kept'] else 'no'} |"
        )
    return "\n".join(lines)


# -- leave one model out (issue 26 item 4) ----------------------------------------------
def leave_one_model_out(
    by_model: dict[str, dict[str, Domain]], features: Sequence[str]
) -> dict[str, dict[str, dict[str, float]]]:
    """Zero-label figures of each (model, set) from priors that never saw either.

    For a held-out model, the served level and the width come from
    :func:`lodo_calibrate` over the other models' sets (each dataset held out under
    every model together); each of its sets is then scored by a prior fitted on the
    other models' *other* sets: neither the model nor the set was seen.
    """
    out: dict[str, dict[str, dict[str, float]]] = {}
    for model, domains in by_model.items():
        train = {
            f"{m}/{n}": d
            for m, ds in by_model.items()
            if m != model
            for n, d in ds.items()
        }
        dataset_of = {key: key.split("/", 1)[1] for key in train}
        sets = {key: (d.X, d.y) for key, d in train.items()}
        choice = lodo_calibrate(sets, features=features, dataset_of=dataset_of)
        out[model] = {}
        for name, d in domains.items():
            others = {k: xy for k, xy in sets.items() if dataset_of[k] != name}
            prior = fit_prior(
                others,
                features=features,
                width=choice.width,
                point_offset=choice.point_offset,
            )
            p = prior.predict_proba(d.X)
            lo, hi = prior.predict_interval(d.X)
            base = float(d.y.mean())
            out[model][name] = {
                **_metrics(d.y, p),
                "base_rate": base,
                "brier_vs_constant": brier_score(d.y, p) / (base * (1.0 - base)),
                "interval_coverage": interval_coverage(d.y, p, lo, hi),
            }
    return out


def lomo_table(result: dict[str, dict[str, dict[str, float]]], label: str) -> str:
    lines = [
        f"Leave one model out ({label}): zero-label figures of each model's sets from "
        "priors fitted on the other models' other sets:",
        "",
        "| held-out model | sets | mean NLL | mean AUROC | coverage ≥ 0.8 "
        "| Brier ÷ constant ≤ 1.25 | ≤ 1.0 | worst Brier ÷ constant |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, per_set in result.items():
        r = list(per_set.values())
        ratios = [x["brier_vs_constant"] for x in r]
        lines.append(
            f"| {model} | {len(r)} | {np.mean([x['nll'] for x in r]):.4f} "
            f"| {np.mean([x['auroc'] for x in r]):.3f} "
            f"| {sum(x['interval_coverage'] >= 0.8 for x in r)} "
            f"| {sum(v <= 1.25 for v in ratios)} | {sum(v <= 1.0 for v in ratios)} "
            f"| {max(ratios):.2f} ({max(per_set, key=lambda n: per_set[n]['brier_vs_constant'])}) |"
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
    parser.add_argument(
        "--model", help="the model whose sets are held out (default: the service's)"
    )
    parser.add_argument(
        "--models",
        nargs="*",
        default=[],
        help="other embedding models (benchmarks.models) for leave-one-model-out",
    )
    parser.add_argument(
        "--cached-only",
        action="store_true",
        help="--models: only the sets already embedded under that model",
    )
    args = parser.parse_args(argv)
    from app.api.lifespan import load_embedder
    from app.cli.beir import corpus_is_cached
    from app.settings import Settings
    from benchmarks.models import load_model

    embedder = load_model(args.model) if args.model else load_embedder(Settings())
    loaded = hybrid_domains(embedder, args.sets, args.data, args.cache)
    domains = {name: d for name, (d, _) in loaded.items()}
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", embedder.model_name)
    results: dict[str, dict[str, Any]] = {}
    payload: dict[str, Any] = {
        "model": embedder.model_name,
        "k": K,
        "draws": args.draws,
        "sets": results,
    }
    with single_threaded_blas():
        for name, target in domains.items():
            print(f"held out: {name}", file=sys.stderr, flush=True)
            auto_p = full_auto(target, args.cache / "auto" / f"{slug}-{name}.npy")
            others = [d for n, d in domains.items() if n != name]
            results[name] = held_out(
                target, others, auto_p, args.draws, args.seed, args.features
            )
        print(tables(results))
        n_docs = {name: len(corpus.ids) for name, (_, corpus) in loaded.items()}
        payload["level_evidence"] = level_evidence(domains, n_docs, args.features)
        print("\n" + level_table(payload["level_evidence"], len(domains)))
        if args.models:
            by_model = {embedder.model_name: domains}
            for model in args.models:
                other = load_model(model)
                names = [
                    n
                    for n in args.sets
                    if not args.cached_only
                    or corpus_is_cached(other, args.data / n, args.cache)
                ]
                print(f"model: {other.model_name} {names}", file=sys.stderr)
                by_model[other.model_name] = {
                    name: d
                    for name, (d, _) in hybrid_domains(
                        other, names, args.data, args.cache
                    ).items()
                }
            payload["leave_one_model_out"] = {}
            for label, features in (
                ("model-agnostic features", AGNOSTIC_FEATURES),
                ("the default model's features", tuple(args.features)),
            ):
                lomo = leave_one_model_out(by_model, features)
                payload["leave_one_model_out"][label] = lomo
                print("\n" + lomo_table(lomo, label))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(to_jsonable(payload), indent=2, allow_nan=False) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
