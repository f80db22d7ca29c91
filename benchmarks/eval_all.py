"""Run ``normcal eval`` on the five staged retrieval sets and write the README table.

Usage (from the repo root, with ``../shared/data`` present)::

    python -m benchmarks.eval_all                    # run everything, then the table
    python -m benchmarks.eval_all --table-only       # rebuild the table from the JSONs

Each dataset is one ``normcal eval DATA_DIR --json benchmarks/out/eval/NAME.json``
(5-fold nested grouped CV on the ``test`` qrels), plus scifact fitted on ``train`` and
evaluated on ``test``. Corpus embeddings are cached in ``.normcal-cache/``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from app.ops.evaluation import summary_table

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
OUT = REPO / "benchmarks" / "out" / "eval"
DATASETS = ("scifact", "cranfield", "cisi", "cacm", "npl")
RUNS: list[tuple[str, list[str]]] = [
    *((name, []) for name in DATASETS),
    ("scifact-train-test", ["--fit-split", "train", "--split", "test"]),
]


def run(name: str, extra: list[str], data: Path, draws: int) -> None:
    dataset = name.split("-", 1)[0]
    cmd = [
        sys.executable,
        "-m",
        "app.ops.cli",
        "eval",
        str(data / dataset),
        "--json",
        str(OUT / f"{name}.json"),
        "--draws",
        str(draws),
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--draws", type=int, default=10)
    parser.add_argument("--table-only", action="store_true")
    parser.add_argument("--only", nargs="+", default=None, help="run these names")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        for name, extra in RUNS:
            if args.only is None or name in args.only:
                run(name, extra, args.data, args.draws)
    results = [
        json.loads((OUT / f"{name}.json").read_text(encoding="utf-8"))
        for name, _ in RUNS
        if (OUT / f"{name}.json").exists()
    ]
    table = "\n".join(
        [
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
