"""Embedding threads beside a busy neighbour: intra-op threads x passes in parallel.

normcal shares its host with a RAG application. A forward pass split over several
intra-op threads synchronises at every operator; when a neighbour keeps the cores
busy, the scheduler deschedules one of them and the others wait for it. This measures,
in a fresh subprocess per configuration (thread settings are process-wide), with and
without a CPU hog beside it (``--hog`` busy-loop processes, started and stopped here):

- search: p50/p99 of single-query embeds, one at a time, from a worker thread (as the
  server's CPU pool runs them);
- ingest: docs/s and CPU seconds per document of ``--docs`` scifact abstracts,
  embedded in chunks of 32 by ``lanes`` worker threads at once.

Configurations are ``THREADSxLANES[:BACKEND]`` (``2x1`` is two intra-op threads, one
pass at a time; ``1x2`` one thread per pass, two passes at once), run interleaved over
``--rounds`` rounds; figures are medians over rounds.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/threads.py [--configs 2x1,1x1,1x2]
[--hog 2] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DATA = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(config: str, docs: int, queries: int, onnx_path: str | None) -> dict:
    """Measure one configuration in this (fresh) process."""
    from app.api.lifespan import load_embedder
    from app.cli.inputs import read_corpus
    from app.settings import Settings

    shape, _, backend = config.partition(":")
    threads, lanes = (int(x) for x in shape.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            data_dir=Path(tmp),
            embedding_backend=backend or "torch",
            embed_threads=threads,
            embed_precision=os.environ.get("BENCH_PRECISION", "fp32"),
            onnx_path=Path(onnx_path) if onnx_path else None,
        )
        embedder = load_embedder(settings)
    texts = [d["text"] for d in read_corpus(DATA / "scifact", docs)]
    with (DATA / "scifact" / "queries.jsonl").open() as fh:
        qs = [json.loads(line)["text"] for line in fh][:queries]
    with ThreadPoolExecutor(max(lanes, 1)) as pool:
        pool.submit(embedder.embed, texts[:32], "document").result()  # warm-up
        latencies = []
        for q in qs:
            started = time.perf_counter()
            pool.submit(embedder.embed, [q], "query").result()
            latencies.append(time.perf_counter() - started)
        chunks = [texts[i : i + 32] for i in range(0, len(texts), 32)]
        cpu, wall = _cpu(), time.perf_counter()
        list(pool.map(lambda c: embedder.embed(c, "document"), chunks))
        wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    ms = np.asarray(latencies) * 1000
    return {
        "search_p50_ms": float(np.percentile(ms, 50)),
        "search_p99_ms": float(np.percentile(ms, 99)),
        "ingest_docs_per_s": len(texts) / wall,
        "ingest_cpu_ms_per_doc": cpu / len(texts) * 1000,
    }


def _spin() -> None:
    while True:
        pass


def measure(config: str, args: argparse.Namespace, onnx: Path | None) -> dict:
    cmd = [sys.executable, __file__, "--child", config, "--docs", str(args.docs)]
    cmd += ["--queries", str(args.queries)]
    if onnx is not None:
        cmd += ["--onnx-path", str(onnx)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="2x1,1x1,1x2")
    parser.add_argument("--hog", type=int, default=2, help="busy-loop processes")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--docs", type=int, default=128)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--onnx-path", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.docs, args.queries, args.onnx_path)))
        return 0
    if not (DATA / "scifact" / "corpus.jsonl").exists():
        print(f"needs {DATA}/scifact", file=sys.stderr)
        return 2
    configs = args.configs.split(",")
    load_before = os.getloadavg()
    results: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        onnx = None
        if any(c.endswith(":onnx") for c in configs):
            from app.embedding.onnx_export import export_onnx
            from app.settings import default_model_path

            onnx = export_onnx(default_model_path(), Path(tmp) / "onnx")
        for _ in range(args.rounds):
            for hog in (0, args.hog):
                hogs = [multiprocessing.Process(target=_spin) for _ in range(hog)]
                for p in hogs:
                    p.start()
                try:
                    for config in configs:
                        results.setdefault((config, hog), []).append(
                            measure(config, args, onnx)
                        )
                finally:
                    for p in hogs:
                        p.terminate()
                        p.join()
    print(
        f"cores={os.cpu_count()}, load average before {load_before[0]:.1f}, "
        f"after {os.getloadavg()[0]:.1f}; {args.rounds} rounds, medians"
    )
    print(
        "\n| threads x lanes | hog | search p50 ms | search p99 ms | ingest docs/s "
        "| ingest CPU ms/doc |"
    )
    print("|---|---|---|---|---|---|")
    for (config, hog), runs in results.items():
        med = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
        print(
            f"| {config} | {hog} | {med['search_p50_ms']:.1f} | "
            f"{med['search_p99_ms']:.1f} | {med['ingest_docs_per_s']:.1f} | "
            f"{med['ingest_cpu_ms_per_doc']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
