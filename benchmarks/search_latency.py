"""HTTP search latency of the three modes (dense, lexical, hybrid) in one run.

Starts ``normcal serve`` on loopback with a temporary data directory, ingests
``--docs`` passages (scifact from ``../shared/data`` when present, generated text
otherwise; the same corpus as ``benchmarks/load.py``), then sends ``--queries``
single-query searches per mode, one at a time, interleaving the modes query by query
so that a busier or quieter moment of the machine falls on all three alike. Prints
p50/p99 per mode and their ratios to dense measured in this same run.

Loopback only, bounded, stops by itself::

    python benchmarks/search_latency.py                    # 10k docs, 300 queries
    python benchmarks/search_latency.py --docs 2000 --queries 100
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.cli.process import ServerProcess  # noqa: E402
from benchmarks.load import COLLECTION, corpus, ingest  # noqa: E402

MODES = ("dense", "lexical", "hybrid")


async def search_ms(client: httpx.AsyncClient, body: dict[str, object]) -> float:
    """Milliseconds of one search (an error stops the run: figures must be real)."""
    started = time.perf_counter()
    r = await client.post(f"/v1/collections/{COLLECTION}/search", json=body)
    elapsed = (time.perf_counter() - started) * 1000
    r.raise_for_status()
    return elapsed


async def measure(
    client: httpx.AsyncClient, queries: list[str], k: int, candidates: int | None
) -> dict[str, list[float]]:
    """Latencies per mode, the modes taking turns on each query."""
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for i, query in enumerate(queries):
        order = MODES[i % 3 :] + MODES[: i % 3]  # no mode always goes first
        for mode in order:
            body: dict[str, object] = {"query": query, "k": k, "mode": mode}
            if candidates is not None:
                body["candidates"] = candidates
            times[mode].append(await search_ms(client, body))
    return times


async def main_async(args: argparse.Namespace) -> int:
    docs, queries = corpus(args.docs)
    queries = (queries * (args.queries // max(len(queries), 1) + 1))[: args.queries]
    env = {
        "NORMCAL_WORKER_THREADS": str(args.workers),
        "NORMCAL_INDEX_TYPE": args.index,
    }
    with tempfile.TemporaryDirectory(prefix="normcal-latency-") as tmp:
        server = ServerProcess(Path(tmp) / "data", env=env).start(timeout=180)
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
                seconds = await ingest(client, docs)
                info = (await client.get(f"/v1/collections/{COLLECTION}")).json()
                print(
                    f"ingested {info['documents']} documents in {seconds:.1f}s "
                    f"(lexical_indexed={info['lexical_indexed']}, "
                    f"indexed={info['indexed']}); index={args.index}, "
                    f"workers={args.workers}, cores={os.cpu_count()}, k={args.k}, "
                    f"candidates={args.candidates or 'default'}"
                )
                await measure(client, queries[:20], args.k, args.candidates)  # warm-up
                times = await measure(client, queries, args.k, args.candidates)
        finally:
            server.stop()
    dense50, dense99 = (float(np.percentile(times["dense"], q)) for q in (50, 99))
    print(
        f"{'mode':8} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'p50/dense':>10} {'p99/dense':>10}"
    )
    for mode in MODES:
        p50, p99 = (float(np.percentile(times[mode], q)) for q in (50, 99))
        print(
            f"{mode:8} {len(times[mode]):5d} {p50:8.1f} {p99:8.1f} "
            f"{p50 / dense50:10.2f} {p99 / dense99:10.2f}"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=300, help="per mode")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--candidates", type=int, default=None)
    parser.add_argument("--workers", type=int, default=2, help="server CPU threads")
    parser.add_argument("--index", choices=["flat", "hnsw"], default="flat")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
