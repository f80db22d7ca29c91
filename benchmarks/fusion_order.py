"""The calibrated ranking against plain fusions, per set (issue 36, part 2).

Usage (from the repo root, with ``NORMCAL_SHARED_DATA`` or ``../shared/data``)::

    python -m benchmarks.fusion_order --out /tmp/after            # run, then the table
    python -m benchmarks.fusion_order --out /tmp/after --table-only
    python -m benchmarks.fusion_order --src /tmp/main-src --out /tmp/before  # another tree
    python -m benchmarks.fusion_order --out /tmp/served --depth 20 --jobs 2  # served pool

Each set is one ``normcal eval DATA --split test`` (5-fold nested grouped CV; the
few-label curve cut to one draw at 5 queries and no query-side row, which this table
does not read), run from ``--src`` (default: this repository, so the same command
measures an older tree exported with ``git archive``). Lexical-heavy variants of the
shared sets (:mod:`benchmarks.variants`) are derived under ``~/.cache/normcal/``.
Corpus embeddings are cached in ``~/.cache/normcal/corpus``.

The table: nDCG@10 of dense, BM25, RRF, the tuned blend and the calibrated ranking
(the hybrid pool ordered by ``auto``'s held-out probabilities) on the same pools; the
served (``auto``) map's held-out ECE and its noise floor; and the targets —
calibrated >= max(dense, RRF), and >= blend - 0.005 — with the calibrated ranking's
paired per-query gain over RRF and over the blend +- its standard error, so that a
miss smaller than the queries' spread reads as such. ``--depth 20`` ranks the pool a
search serves by default (its ``candidates``) instead of the dense and BM25 top-100.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.variants import VARIANTS, derive

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))
CACHE = Path.home() / ".cache" / "normcal" / "corpus"
SETS = (  # smallest first
    "adi",
    "med",
    "csfcube",
    "lisa",
    "aila-statutes",
    "cacm",
    "cisi",
    "time",
    "npl",
    "cf",
    "cranfield",
    "semeval2015-cqa",
    "scifact",
    "cosqa",
    "cacm-titles-rare",
    "cranfield-titles-rare",
)
BLEND_SLACK = 0.005


def run(name: str, src: Path, out: Path, depth: int) -> None:
    data = derive(name, DATA) if name in VARIANTS else DATA / name
    cmd = [
        sys.executable,
        "-m",
        "app.cli",
        "eval",
        str(data),
        "--split",
        "test",
        "--few-label",
        "5",
        "--draws",
        "1",
        "--no-query-side",
        *(["--depth", str(depth)] if depth != 100 else []),  # older trees lack it
        "--cache-dir",
        str(CACHE),
        "--json",
        str(out / f"{name}.json"),
    ]
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    done = subprocess.run(
        cmd, cwd=src, env=env, check=False, capture_output=True, text=True
    )
    (out / f"{name}.log").write_text(done.stderr, encoding="utf-8")
    print(
        f"{name}: exit {done.returncode} in {time.perf_counter() - started:.0f}s",
        file=sys.stderr,
        flush=True,
    )


def _find(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            if (found := _find(v, key)) is not None:
                return found
    return None


def _against(ret: dict[str, Any], mode: str) -> str:
    """The calibrated ranking's paired gain over ``mode`` +- its SE (newer reports)."""
    gain = ret["calibrated"].get("gain_over", {}).get(mode)
    if gain is None:
        return "-"
    se = "-" if gain["se"] is None else f"{gain['se']:.3f}"
    return f"{gain['gain']:+.3f} ± {se}"


def _verdict(ret: dict[str, Any], met: bool, mode: str) -> str:
    """``met``, or ``missed`` and whether the gap is within one standard error."""
    if met:
        return "met"
    gain = ret["calibrated"].get("gain_over", {}).get(mode)
    if gain is None or gain["se"] is None:
        return "missed"
    return "missed (within 1 SE)" if -gain["gain"] <= gain["se"] else "missed"


def row(name: str, report: dict[str, Any]) -> str:
    ret = _find(report, "retrieval")
    nd = {m: ret[m]["ndcg@10"] for m in ("dense", "lexical", "rrf", "blend")}
    cal = ret["calibrated"]["ndcg@10"]
    ece = _find(report, "methods")["auto"]["ece"]
    floor = _find(report, "ece_noise_floor")["auto"]
    best = max(("dense", "rrf"), key=lambda m: nd[m])
    fusion = _verdict(ret, cal >= nd[best], best)
    blend = "met" if cal >= nd["blend"] - BLEND_SLACK else "missed"
    folds = ",".join(_find(report, "chosen_per_fold"))
    return (
        f"| {name} | {nd['dense']:.3f} | {nd['lexical']:.3f} | {nd['rrf']:.3f} | "
        f"{nd['blend']:.3f} | **{cal:.3f}** | {_against(ret, 'rrf')} | "
        f"{_against(ret, 'blend')} | {ece:.4f} ({ece / floor:.1f}x) | "
        f"{fusion} | {blend} | {folds} |"
    )


def table(out: Path) -> str:
    lines = [
        "| set | dense | BM25 | RRF | blend | calibrated | - RRF ± SE | - blend ± SE "
        "| served ECE (x floor) | >= max(dense, RRF) | >= blend - 0.005 "
        "| auto per fold |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in SETS:
        path = out / f"{name}.json"
        if path.exists():
            lines.append(row(name, json.loads(path.read_text(encoding="utf-8"))))
        else:
            lines.append(f"| {name} | not run |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--src", type=Path, default=REPO)
    parser.add_argument("--sets", nargs="+", default=list(SETS))
    parser.add_argument(
        "--depth",
        type=int,
        default=100,
        help="normcal eval --depth: the lists' depth whose pool every mode reorders "
        "(a search's default pool is 20 + 20)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="sets evaluated at once")
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        src = args.src.resolve()
        with ThreadPoolExecutor(args.jobs) as pool:  # each set is a subprocess
            list(pool.map(lambda name: run(name, src, args.out, args.depth), args.sets))
    print(table(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
