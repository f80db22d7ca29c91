"""``normcal eval``: read a BEIR-layout dataset, embed, retrieve, evaluate, print.

The I/O around :mod:`calibration.evaluation`, which holds the maths (nested grouped
CV, few-label curve, retrieval metrics) and documents the protocol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.cli.beir import EmbeddedCorpus, HybridRetrieval
from app.cli.inputs import Qrels
from app.cli.main import selection_summary
from app.profiles import load_default_profile
from calibration.evaluation import (
    AUTO,
    EvalOptions,
    Progress,
    RankingPool,
    evaluate_calibration,
    mode_order,
    retrieval_metrics,
    zero_label,
)
from calibration.features import LEXICAL_DEPTH
from calibration.profile import Profile, QueryEvidence

__all__ = [
    "MODES",
    "Retrieved",
    "evaluate_retrieved",
    "method_table",
    "mode_table",
    "norm_lift_summary",
    "run_eval",
    "summary_table",
]

MODES = ("dense", "lexical", "rrf", "blend", "calibrated")


@dataclass(frozen=True)
class Retrieved:
    """The lists an evaluation scores, however they were made (locally or served).

    ``corpus`` holds every document the lists name (its rows are theirs); ``hybrid``
    the evaluated split's judged queries, ``fit_hybrid`` the fitting split's (or
    None: nested cross-validation); ``doc_norms``/``doc_tokens`` an unlabelled sample
    of the collection for the document-side norm reference.
    """

    corpus: EmbeddedCorpus
    hybrid: HybridRetrieval
    fit_hybrid: HybridRetrieval | None
    doc_norms: NDArray[np.float64]
    doc_tokens: NDArray[np.int64]


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
    """Embed, index, retrieve and evaluate one BEIR-layout dataset (``normcal eval``).

    Calibration pairs are the hybrid pool of ``k`` (dense top-k and BM25 top-k, the
    pool hybrid search scores); ``calibration_by_pool.dense`` repeats Platt vs auto on
    the dense top-k alone. Retrieval modes rank the hybrid pool of ``depth`` (at most
    ``LEXICAL_DEPTH``), the same pool for every mode.
    """
    from app.cli.beir import embed_corpus, hybrid_retrieve

    opts = options or EvalOptions()
    say = progress or (lambda _msg: None)
    say(f"embedding corpus of {data_dir.name} (cached under {cache_dir})")
    corpus = embed_corpus(embedder, data_dir, cache_dir)
    queries, qrels, fit_qrels = read_splits(data_dir, split, fit_split)
    qids, fit_ids = judged_ids(queries, qrels, fit_qrels)
    depth = eval_depth(opts, len(corpus.ids))
    say(f"dense and BM25 top-{depth} of {len(qids)} judged queries")

    def retrieve(ids: list[str]) -> HybridRetrieval:
        return hybrid_retrieve(
            embedder, data_dir, corpus, queries, ids, depth, cache_dir
        )

    fit_hybrid = None
    hybrid = retrieve(qids)
    if fit_split is not None:
        say(f"retrieving {len(fit_ids)} judged queries of the {fit_split!r} split")
        fit_hybrid = retrieve(fit_ids)
    lists = Retrieved(corpus, hybrid, fit_hybrid, corpus.norms, corpus.n_tokens)
    return {
        "dataset": data_dir.name,
        "model": embedder.model_name,
        **evaluate_retrieved(
            lists,
            qrels,
            fit_qrels,
            opts,
            split=split,
            fit_split=fit_split,
            progress=say,
            default_profile=_shipped_default(embedder),
        ),
    }


def read_splits(
    data_dir: Path, split: str, fit_split: str | None
) -> tuple[dict[str, str], Qrels, Qrels]:
    """The queries, the evaluated split's qrels and the fitting split's (or empty)."""
    from app.cli.inputs import read_qrels, read_queries

    fit_qrels = {} if fit_split is None else read_qrels(data_dir, fit_split)
    return read_queries(data_dir), read_qrels(data_dir, split), fit_qrels


def judged_ids(
    queries: Mapping[str, str], qrels: Qrels, fit_qrels: Qrels
) -> tuple[list[str], list[str]]:
    """Judged query ids of the evaluated split, and of the fitting split not in it."""
    qids = sorted(q for q in qrels if q in queries)
    fit_ids = sorted(q for q in fit_qrels if q in queries and q not in qrels)
    return qids, fit_ids


def eval_depth(options: EvalOptions, n_documents: int) -> int:
    """Depth of the dense and BM25 lists the evaluation ranks (Recall@100's pool)."""
    return min(max(options.depth, options.k), LEXICAL_DEPTH, n_documents)


def evaluate_retrieved(
    lists: Retrieved,
    qrels: Qrels,
    fit_qrels: Qrels,
    options: EvalOptions,
    *,
    split: str,
    fit_split: str | None,
    progress: Progress,
    default_profile: Profile | None,
    served: Profile | None = None,
) -> dict[str, Any]:
    """Every table of ``normcal eval`` from retrieved lists (:class:`Retrieved`).

    ``served``: the calibrator the collection serves, scored on the same pairs and
    pools with no judgments from them (``served``), beside what a fit would give.
    """
    corpus, hybrid = lists.corpus, lists.hybrid
    depth = hybrid.depth
    k = min(options.k, depth)
    pools = [
        RankingPool(
            query_id=qid,
            docs=[corpus.ids[r] for r in hybrid.members(i, depth)[0]],
            evidence=e,
            n_dense=int((hybrid.dense[i] >= 0).sum()),
            depth=depth,
            judged=qrels.get(qid, {}),
        )
        for i, (qid, e) in enumerate(
            zip(hybrid.query_ids, hybrid.evidence(corpus, qrels, depth), strict=True)
        )
    ]
    fit_evidence = fit_dense = None
    if lists.fit_hybrid is not None:
        fit_evidence = lists.fit_hybrid.evidence(corpus, fit_qrels, k)
        fit_dense = lists.fit_hybrid.evidence(corpus, fit_qrels, k, hybrid=False)
    evidence = hybrid.evidence(corpus, qrels, k)
    calibration = evaluate_calibration(
        evidence,
        lists.doc_norms,
        lists.doc_tokens,
        options,
        fit_evidence=fit_evidence,
        progress=progress,
        default_profile=default_profile,
        ranking=pools,
        dense_evidence=hybrid.evidence(corpus, qrels, k, hybrid=False),
        fit_dense_evidence=fit_dense,
    )
    out: dict[str, Any] = {
        "split": split,
        "fit_split": fit_split,
        "n_documents": len(lists.doc_norms),
        "pool": {
            "calibration": f"hybrid pool of {k} (dense top-{k} + BM25 top-{k})",
            "retrieval": f"hybrid pool of {depth}",
        },
        **calibration,
    }
    if served is not None:
        out["served"] = served_scores(served, evidence, pools)
        out["retrieval"]["served"] = out["served"].pop("retrieval")
    return out


def served_scores(
    profile: Profile, evidence: Sequence[QueryEvidence], pools: Sequence[RankingPool]
) -> dict[str, Any]:
    """A calibrator scored as search serves it: pairs, intervals, abstain, ranking.

    ``retrieval`` is its ``hybrid`` ranking (by its probability) of the same pools.
    """
    ranked = {}
    for pool in pools:
        e = pool.evidence
        scored = profile.score(
            e.norm, e.n_tokens, e.scores, e.doc_norms, e.doc_tokens, e.lexical
        )
        ranked[pool.query_id] = mode_order(pool, "hybrid", proba=scored.probabilities)
    return {
        "id": profile.id,
        "method": profile.method,
        "default": profile.default,
        "n_queries": None if profile.default else profile.report.n_queries,
        **zero_label(evidence, profile),
        "retrieval": retrieval_metrics(ranked, {p.query_id: p.judged for p in pools}),
    }


# -- reporting --------------------------------------------------------------------------
def _shipped_default(embedder: Any) -> Profile | None:
    """The shipped profile evaluated beside the fits, when it fits ``embedder``."""
    default = load_default_profile(embedder.model_name, embedder.model_id)
    return None if isinstance(default, str) else default.profile


def _f(value: Any, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _modes(result: Mapping[str, Any]) -> Mapping[str, Any]:
    """Retrieval metrics per mode; a report of one dense list (older) is ``dense``."""
    retrieval = result["retrieval"]
    return retrieval if "dense" in retrieval else {"dense": retrieval}


def mode_table(result: Mapping[str, Any]) -> str:
    """Markdown rows of nDCG@10 and Recall@100 per retrieval mode (same pools).

    With the calibrated ranking's paired per-query gain over each fusion +- its
    standard error, where the report has it.
    """
    modes = _modes(result)
    gains = (modes.get("calibrated") or {}).get("gain_over", {})
    lines = [
        "| mode | nDCG@10 | Recall@100 | calibrated's nDCG@10 gain ± SE |",
        "|---|---|---|---|",
    ]
    for name, m in modes.items():
        if isinstance(m, Mapping):
            gain = gains.get(name)
            against = (
                "-"
                if gain is None
                else f"{gain['gain']:+.4f} ± {_f(gain['se'])} ({gain['n_queries']} q)"
            )
            lines.append(
                f"| {name} | {_f(m.get('ndcg@10'))} | {_f(m.get('recall@100'))} "
                f"| {against} |"
            )
    pool = modes.get("pool")
    return "\n".join(lines) + ("" if pool is None else f"\n\nPool: {pool}.") + "\n"


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
    if isinstance(lift.get("query_side"), Mapping):
        out += f"; query-side only: {norm_lift_summary(lift['query_side'])}"
    return out


def _recalibrated(result: Mapping[str, Any]) -> bool:
    return bool((result.get("selection") or {}).get("recalibrated"))


def _chosen(result: Mapping[str, Any]) -> str:
    """What ``auto`` served on all data, and why when the report says."""
    why = result.get("selection")
    return selection_summary(why) if why else f"`{result['chosen']}`"


def method_table(result: Mapping[str, Any]) -> str:
    """Markdown table of one dataset: every method's held-out metrics."""
    lines = [
        f"### {result['dataset']} ({result['protocol']}, top-{result['k']}, "
        f"{result['n_queries']} queries, {result['n_pairs']} pairs)",
        "",
        mode_table(result),
        f"chosen on all data: {_chosen(result)}; per fold: "
        f"{', '.join(result['chosen_per_fold'])}",
        "",
        "| method | ECE | Brier | NLL | AUROC |",
        "|---|---|---|---|---|",
    ]
    for name, m in result["methods"].items():
        lines.append(
            f"| {name} | {_f(m['ece'])} | {_f(m['brier'])} | {_f(m['nll'])} | "
            f"{_f(m['auroc'], 3)} |"
        )
    for name, m in _unfitted(result):
        lines.append(
            f"| {name} | {_f(m['ece'])} | {_f(m['brier'])} | {_f(m['nll'])} | "
            f"{_f(m['auroc'], 3)} |"
        )
    for pool, m in result.get("calibration_by_pool", {}).items():
        lines.append(
            f"| {pool} pool: Platt → auto | "
            f"{_f(m['platt']['ece'])} → {_f(m[AUTO]['ece'])} | "
            f"{_f(m['platt']['brier'])} → {_f(m[AUTO]['brier'])} "
            f"({m['brier_change_pct']:+.1f}%) | "
            f"{_f(m['platt']['nll'])} → {_f(m[AUTO]['nll'])} | "
            f"{_f(m['platt']['auroc'], 3)} → {_f(m[AUTO]['auroc'], 3)} |"
        )
    floor = result.get("ece_noise_floor", {})
    lines += [
        "",
        f"ECE of a perfectly calibrated model at this size (noise floor): Platt "
        f"{_f(floor.get('platt'))}, auto {_f(floor.get(AUTO))}",
        f"Norm lift: {norm_lift_summary(result['norm_lift'])}",
    ]
    for name, m in _unfitted(result):
        answered = m["abstain"]["answered"]
        risk = m["abstain"]["risk"]
        lines.append(
            f"{name}: interval coverage {_f(m['interval_coverage'], 2)} (mean width "
            f"{_f(m['mean_interval_width'], 3)}); answers {100 * answered:.0f}% of "
            f"queries, {'-' if risk is None else f'{100 * risk:.0f}%'} of them with "
            "no relevant hit"
        )
    served = result.get("served")
    if served is not None and "reproduced" in served:
        lines.append(
            "Served probabilities reproduced from these lists to within "
            f"{served['reproduced']:.1g}"
        )
    if served is not None and not served["default"]:
        lines.append(
            f"The served calibrator was fitted on {served['n_queries']} judged "
            "queries: if they include these, its figures are in-sample (fit on "
            "another split, e.g. normcal fit --split train, and evaluate on test)"
        )
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


def _unfitted(result: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """What was scored with no judgments from these queries, as table rows.

    The shipped default, and (``--url``) the calibrator the collection serves.
    """
    rows = []
    if result.get("zero_label"):
        rows.append(("shipped default (no judgments)", result["zero_label"]))
    served = result.get("served")
    if served is not None:
        what = "the shipped default" if served["default"] else served["method"]
        rows.append((f"served: {served['id']} ({what})", served))
    return rows


def summary_table(results: Sequence[Mapping[str, Any]]) -> str:
    """The table of docs/evaluation.md: one row per dataset."""
    lines = [
        "| dataset | queries | nDCG@10 dense / lexical / rrf / blend / calibrated "
        "| R@100 dense / calibrated | Platt Brier / NLL / ECE / AUROC "
        "| auto Brier / NLL / ECE / AUROC | auto vs Platt Brier | chosen "
        "| norm lift (gamma +- sd) | query AUROC | ECE noise floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        p, a = r["methods"]["platt"], r["methods"][AUTO]
        modes = _modes(r)
        ndcg = " / ".join(
            _f(modes[m].get("ndcg@10"), 3) if m in modes else "-" for m in MODES
        )
        recall = " / ".join(
            _f(modes[m].get("recall@100"), 3) if m in modes else "-"
            for m in ("dense", "calibrated")
        )
        lines.append(
            f"| {r['dataset']}{'' if not r.get('fit_split') else ' (train→test)'} "
            f"| {r['n_queries']} "
            f"| {ndcg} "
            f"| {recall} "
            f"| {_f(p['brier'])} / {_f(p['nll'])} / {_f(p['ece'])} / {_f(p['auroc'], 3)} "
            f"| {_f(a['brier'])} / {_f(a['nll'])} / {_f(a['ece'])} / {_f(a['auroc'], 3)} "
            f"| {r['auto_vs_platt']['brier_change_pct']:+.1f}% "
            f"| {r['chosen']}{'+recal' if _recalibrated(r) else ''} "
            f"| {norm_lift_summary(r['norm_lift'])} "
            f"| {_f(r['query_level'].get('auroc'), 3)} "
            f"| {_f(r.get('ece_noise_floor', {}).get(AUTO), 3)} |"
        )
    return "\n".join(lines) + "\n"
