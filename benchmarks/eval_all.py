"""Run ``normcal eval`` on the eight staged relevance sets and write the tables of docs/evaluation.md.

Usage (from the repo root, with ``../shared/data`` or ``NORMCAL_SHARED_DATA``)::

    python -m benchmarks.eval_all                    # run everything, then the tables
    python -m benchmarks.eval_all --table-only       # rebuild the tables from the JSONs

Each dataset is one ``normcal eval DATA_DIR --json benchmarks/out/eval/NAME.json``
(5-fold nested grouped CV on the ``test`` qrels), plus scifact fitted on ``train`` and
evaluated on ``test``. Corpus embeddings and the dense/BM25 lists are cached in
``~/.cache/normcal/corpus`` (``--cache-dir``). ``benchmarks/out/eval/hybrid.md`` (and
``hybrid.json``) hold the issue-12 table and its targets: per set nDCG@10 of every
retrieval mode on the same pools, Platt-on-cosine vs ``auto`` Brier on the hybrid pool,
and ECE on both pools.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from app.cli.evaluation import MODES, summary_table

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))
OUT = REPO / "benchmarks" / "out" / "eval"
CACHE = Path.home() / ".cache" / "normcal" / "corpus"
DATASETS = (
    "scifact",
    "cranfield",
    "cisi",
    "cacm",
    "npl",
    "cf",
    "time",
    "aila-statutes",
)
RUNS: list[tuple[str, list[str]]] = [
    # --split test named: the CLI's default is train where a set has one (scifact).
    *((name, ["--split", "test"]) for name in DATASETS),
    ("scifact-train-test", ["--fit-split", "train", "--split", "test"]),
]


def run(name: str, extra: list[str], data: Path, draws: int, cache: Path) -> None:
    dataset = name.removesuffix("-train-test")
    cmd = [
        sys.executable,
        "-m",
        "app.cli",
        "eval",
        str(data / dataset),
        "--json",
        str(OUT / f"{name}.json"),
        "--draws",
        str(draws),
        "--cache-dir",
        str(cache),
        *extra,
    ]
    print("$", " ".join(cmd[2:]), file=sys.stderr, flush=True)
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, check=False, capture_output=True, text=True)
    (OUT / f"{name}.md").write_text(done.stdout, encoding="utf-8")
    (OUT / f"{name}.log").write_text(done.stderr, encoding="utf-8")
    print(
        f"{name}: exit {done.returncode} in {time.perf_counter() - started:.0f}s",
        file=sys.stderr,
        flush=True,
    )


def few_label_table(results: list[dict]) -> str:
    lines = [
        "| dataset | labelled queries | auto Brier (sd) | Platt Brier | auto NLL "
        "| Platt NLL | auto Brier / its full-data Brier (worst draw) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        label = r["dataset"] + (" (train→test)" if r.get("fit_split") else "")
        for n, row in r["few_label"]["sizes"].items():
            if "skipped" in row:
                continue
            a, p = row["auto"], row["platt"]
            lines.append(
                f"| {label} | {n} | {a['brier']:.4f} ({a['brier_sd'] or 0:.4f}) "
                f"| {p['brier']:.4f} | {a['nll']:.4f} | {p['nll']:.4f} "
                f"| {row['auto_brier_vs_full']:.3f} ({row['auto_brier_vs_full_max']:.3f}) |"
            )
    return "\n".join(lines) + "\n"


def methods_table(results: list[dict]) -> str:
    names = list(results[0]["methods"])
    lines = [
        "| dataset | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for r in results:
        label = r["dataset"] + (" (train→test)" if r.get("fit_split") else "")
        cells = [
            f"{r['methods'][m]['brier']:.4f} / {r['methods'][m]['nll']:.4f}"
            if m in r["methods"]
            else "-"
            for m in names
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def tercile_table(results: list[dict]) -> str:
    lines = [
        "| dataset | Platt ECE by ell_q tercile (low/mid/high) | Platt mean gap "
        "| auto ECE by tercile | auto mean gap |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        t = r["reliability_by_norm_tercile"]

        def fmt(values: list[float | None], sign: str = "+") -> str:
            return " / ".join("-" if v is None else f"{v:{sign}.3f}" for v in values)

        label = r["dataset"] + (" (train→test)" if r.get("fit_split") else "")
        lines.append(
            f"| {label} | {fmt(t['platt']['ece'], '')} | {fmt(t['platt']['mean_gap'])} "
            f"| {fmt(t['auto']['ece'], '')} | {fmt(t['auto']['mean_gap'])} |"
        )
    return "\n".join(lines) + "\n"


def hybrid_rows(results: list[dict]) -> list[dict]:
    """Per set: nDCG@10 per mode, Brier/ECE of Platt vs auto per pool, the targets."""
    rows = []
    for r in results:
        modes = r["retrieval"]
        ndcg = {
            m: modes[m]["ndcg@10"]
            for m in (*MODES, "calibrated/query-side")
            if m in modes
        }
        pools = r["calibration_by_pool"]
        hyb, dense = pools["hybrid"], pools["dense"]
        rows.append(
            {
                "dataset": r["dataset"]
                + (" (train→test)" if r.get("fit_split") else ""),
                "ndcg@10": ndcg,
                "recall@100": {m: modes[m]["recall@100"] for m in ndcg},
                "blend_weights": modes["blend"]["cosine_weight_per_fold"],
                "hybrid": hyb,
                "dense": dense,
                "calibrated_wins": ndcg["calibrated"]
                >= max(ndcg["dense"], ndcg["rrf"]),
                "brier_10pct_below": hyb["brier_change_pct"] <= -10.0,
                "brier_above": hyb["brier_change_pct"] > 0.0,
                "ece_no_worse": hyb["auto"]["ece"] <= dense["auto"]["ece"],
            }
        )
    return rows


def hybrid_table(rows: list[dict]) -> str:
    """The issue-12 table (markdown) with the target counts underneath."""
    lines = [
        "| dataset | nDCG@10 dense | lexical | rrf | blend | calibrated "
        "| calibrated/query-side | Brier Platt → auto (hybrid pool) | change "
        "| ECE Platt → auto (hybrid) | ECE Platt → auto (dense pool) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        n, h, d = row["ndcg@10"], row["hybrid"], row["dense"]
        cells = [
            f"{n[m]:.3f}" if n.get(m) is not None else "-"
            for m in (*MODES, "calibrated/query-side")
        ]
        lines.append(
            f"| {row['dataset']} | "
            + " | ".join(cells)
            + f" | {h['platt']['brier']:.4f} → {h['auto']['brier']:.4f} "
            f"| {h['brier_change_pct']:+.1f}% "
            f"| {h['platt']['ece']:.4f} → {h['auto']['ece']:.4f} "
            f"| {d['platt']['ece']:.4f} → {d['auto']['ece']:.4f} |"
        )
    sets = [r for r in rows if "train→test" not in r["dataset"]]
    lines += [
        "",
        f"Targets over the {len(sets)} nested-CV sets: calibrated nDCG@10 ≥ max(dense, "
        f"RRF) on {sum(r['calibrated_wins'] for r in sets)} (target ≥ 6 of 8); auto "
        f"Brier ≥ 10% below Platt-on-cosine on "
        f"{sum(r['brier_10pct_below'] for r in sets)} (target ≥ 4 of 8), above it on "
        f"{sum(r['brier_above'] for r in sets)} (target 0); auto ECE on the hybrid pool "
        f"≤ auto ECE on the dense pool on {sum(r['ece_no_worse'] for r in sets)}.",
        "",
        "Pools: calibration pairs are the hybrid pool of 20 (dense top-20 + BM25 top-20, "
        "calibration.fusion.candidate_pool); every retrieval mode reorders the same "
        "hybrid pool of 100 per query (so dense and BM25 keep their exact top-100). "
        "Blend weight: grouped CV (tuned on the other outer folds' queries). "
        "calibrated: auto's out-of-fold probability from the same nested CV.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--draws", type=int, default=10)
    parser.add_argument("--cache-dir", type=Path, default=CACHE)
    parser.add_argument("--table-only", action="store_true")
    parser.add_argument("--only", nargs="+", default=None, help="run these names")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        for name, extra in RUNS:
            if args.only is None or name in args.only:
                run(name, extra, args.data, args.draws, args.cache_dir)
    results = [
        json.loads((OUT / f"{name}.json").read_text(encoding="utf-8"))
        for name, _ in RUNS
        if (OUT / f"{name}.json").exists()
    ]
    rows = hybrid_rows(results)
    hybrid = hybrid_table(rows)
    (OUT / "hybrid.md").write_text(hybrid, encoding="utf-8")
    (OUT / "hybrid.json").write_text(
        json.dumps(rows, indent=1) + "\n", encoding="utf-8"
    )
    table = "\n".join(
        [
            hybrid,
            summary_table(results),
            "Brier / NLL of every method (held-out):\n",
            methods_table(results),
            "Reliability by query-norm tercile (ECE, and mean predicted - observed):\n",
            tercile_table(results),
            "Few labels (random draws of n labelled queries, evaluated on held-out "
            "queries):\n",
            few_label_table(results),
        ]
    )
    (OUT / "table.md").write_text(table, encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
