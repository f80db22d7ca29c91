"""``normcal eval``: read a BEIR-layout dataset, embed, retrieve, evaluate, print.

The I/O around :mod:`calibration.evaluation`, which holds the maths (nested grouped
CV, few-label curve, retrieval metrics) and documents the protocol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app.profiles import load_default_profile
from calibration.evaluation import (
    AUTO,
    EvalOptions,
    Progress,
    evaluate_calibration,
    retrieval_metrics,
)

__all__ = ["method_table", "norm_lift_summary", "run_eval", "summary_table"]


def run_eval(
    embedder: Any,
    data_dir: Path,
    *,
    split: str = "test",
    fit_split: str | None = None,
    cache_dir: Path | None = Path(".normcal-cache"),
    options: EvalOptions | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Embed, retrieve and evaluate one BEIR-layout dataset (``normcal eval``)."""
    from app.ops.beir import embed_corpus, read_qrels, read_queries, retrieve

    opts = options or EvalOptions()
    say = progress or (lambda _msg: None)
    say(f"embedding corpus of {data_dir.name} (cached under {cache_dir})")
    corpus = embed_corpus(embedder, data_dir, cache_dir)
    queries = read_queries(data_dir)
    qrels = read_qrels(data_dir, split)
    qids = sorted(q for q in qrels if q in queries)
    say(f"retrieving {len(qids)} judged queries over {len(corpus.ids)} documents")
    depth = min(max(opts.depth, opts.k), len(corpus.ids))
    retrieval = retrieve(embedder, corpus, queries, qids, depth)
    ranked = {
        q: [corpus.ids[r] for r in retrieval.doc_index[i] if r >= 0]
        for i, q in enumerate(retrieval.query_ids)
    }
    evidence = retrieval.evidence(corpus, qrels, opts.k)
    fit_evidence = None
    if fit_split is not None:
        fit_qrels = read_qrels(data_dir, fit_split)
        fit_ids = sorted(q for q in fit_qrels if q in queries and q not in qrels)
        say(f"retrieving {len(fit_ids)} judged queries of the {fit_split!r} split")
        fit_evidence = retrieve(embedder, corpus, queries, fit_ids, opts.k).evidence(
            corpus, fit_qrels, opts.k
        )
    calibration = evaluate_calibration(
        evidence,
        corpus.norms,
        corpus.n_tokens,
        opts,
        fit_evidence=fit_evidence,
        progress=say,
        default_profile=load_default_profile(embedder.model_name),
    )
    return {
        "dataset": data_dir.name,
        "model": embedder.model_name,
        "split": split,
        "fit_split": fit_split,
        "n_documents": len(corpus.ids),
        "retrieval": retrieval_metrics(ranked, qrels),
        **calibration,
    }


# -- reporting --------------------------------------------------------------------------
def _f(value: Any, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def norm_lift_summary(lift: Mapping[str, Any]) -> str:
    """One-line norm lift: Brier with/without norm terms and the fitted gamma +- sd."""
    with_, without = lift.get("brier_with"), lift.get("brier_without")
    pct = (
        ""
        if not with_ or not without
        else f" ({100.0 * (with_ / without - 1.0):+.1f}%)"
    )
    terms = lift.get("terms") or {}
    gamma = ", ".join(
        f"{name} {v:+.2f}±{sd:.2f}"
        for name, (v, sd) in terms.items()
        if name.startswith("gamma") and sd > 0
    )
    kept = "kept" if lift.get("norm_signal") else "not kept"
    out = f"{lift.get('base_method')}: {kept}{pct}; {gamma or 'no gamma fitted'}"
    if isinstance(lift.get("reorder"), Mapping):
        out += f"; with doc side: {norm_lift_summary(lift['reorder'])}"
    return out


def method_table(result: Mapping[str, Any]) -> str:
    """Markdown table of one dataset: every method's held-out metrics."""
    lines = [
        f"### {result['dataset']} ({result['protocol']}, top-{result['k']}, "
        f"{result['n_queries']} queries, {result['n_pairs']} pairs)",
        "",
        f"nDCG@10 {_f(result['retrieval']['ndcg@10'])}, "
        f"Recall@100 {_f(result['retrieval']['recall@100'])}; "
        f"chosen on all data: `{result['chosen']}` (per fold: "
        f"{', '.join(result['chosen_per_fold'])})",
        "",
        "| method | ECE | Brier | NLL | AUROC |",
        "|---|---|---|---|---|",
    ]
    for name, m in result["methods"].items():
        lines.append(
            f"| {name} | {_f(m['ece'])} | {_f(m['brier'])} | {_f(m['nll'])} | "
            f"{_f(m['auroc'], 3)} |"
        )
    floor = result.get("ece_noise_floor", {})
    lines += [
        "",
        f"ECE of a perfectly calibrated model at this size (noise floor): Platt "
        f"{_f(floor.get('platt'))}, auto {_f(floor.get(AUTO))}",
        f"Norm lift: {norm_lift_summary(result['norm_lift'])}",
    ]
    ql = result["query_level"]
    lines.append(
        f"Query-level confidence AUROC: {_f(ql.get('auroc'), 3)} "
        f"(max probability alone: {_f(ql.get('auroc_max_probability'), 3)})"
    )
    for n, row in result["few_label"]["sizes"].items():
        if "skipped" in row:
            continue
        lines.append(
            f"Few labels, n={n}: auto Brier {_f(row['auto']['brier'])} "
            f"(x{_f(row['auto_brier_vs_full'], 3)} of full data), "
            f"Platt {_f(row['platt']['brier'])}"
        )
    return "\n".join(lines) + "\n"


def summary_table(results: Sequence[Mapping[str, Any]]) -> str:
    """The README table: one row per dataset."""
    lines = [
        "| dataset | queries | nDCG@10 | R@100 | Platt Brier / NLL / ECE / AUROC "
        "| auto Brier / NLL / ECE / AUROC | auto vs Platt Brier | chosen "
        "| norm lift (gamma +- sd) | query AUROC | ECE noise floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        p, a = r["methods"]["platt"], r["methods"][AUTO]
        lines.append(
            f"| {r['dataset']}{'' if not r.get('fit_split') else ' (train→test)'} "
            f"| {r['n_queries']} "
            f"| {_f(r['retrieval']['ndcg@10'], 3)} "
            f"| {_f(r['retrieval']['recall@100'], 3)} "
            f"| {_f(p['brier'])} / {_f(p['nll'])} / {_f(p['ece'])} / {_f(p['auroc'], 3)} "
            f"| {_f(a['brier'])} / {_f(a['nll'])} / {_f(a['ece'])} / {_f(a['auroc'], 3)} "
            f"| {r['auto_vs_platt']['brier_change_pct']:+.1f}% "
            f"| {r['chosen']} "
            f"| {norm_lift_summary(r['norm_lift'])} "
            f"| {_f(r['query_level'].get('auroc'), 3)} "
            f"| {_f(r.get('ece_noise_floor', {}).get(AUTO), 3)} |"
        )
    return "\n".join(lines) + "\n"
