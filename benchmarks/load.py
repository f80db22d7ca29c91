"""Mixed search/upsert load against a real ``normcal serve`` on loopback.

Starts the server as a subprocess with a temporary data directory, ingests ``--docs``
documents (the scifact corpus from ``../shared/data/scifact`` split into title+lead
and remainder passages; generated text when it is absent), then runs a 90/10
search/upsert mix at each concurrency level for a bounded time and number of
requests, and prints per level: throughput, p50/p99 latency of searches and upserts,
and the error count; finally the p99/p50 ratio of searches at the highest level.
It does all that once per ``--batching`` mode (a fresh server each; a mode names
batching across requests, off or a window in ms, and optionally the backend,
precision and threads per pass, see ``benchmarks/servers.py``) and prints each
mode's throughput and search p50/p99 as ratios to the first mode's, measured in the
same run.
A pinger calls ``/healthz`` all along: its p99 under load, against its p50 on the
idle server measured first in the same run, shows whether the event loop stays free
while the CPU pool embeds (this replaces a latency assert the tests used to make).

Loopback only, bounded, stops by itself::

    python benchmarks/load.py                      # 10k docs, levels 1,4,16, 20 s each
    python benchmarks/load.py --docs 2000 --duration 5 --batching off,0,2
    python benchmarks/load.py --batching off,onnx/off,onnx/0   # torch vs onnx
    python benchmarks/load.py --batching torch/fp32/t0/0,0      # the previous default
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.cli.process import ServerProcess  # noqa: E402
from benchmarks.servers import mode_env, uses_onnx  # noqa: E402

# The same data directory as benchmarks/ingest.py (a worktree has no ../shared).
DATA = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))
SCIFACT = DATA / "scifact"
MAX_CHARS = 600  # passages of ~100-150 tokens: realistic RAG chunks
COLLECTION = "load"


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def corpus(n: int) -> tuple[list[dict[str, str]], list[str]]:
    """``n`` passages and a list of query texts."""
    docs: list[dict[str, str]] = []
    queries: list[str] = []
    if (SCIFACT / "corpus.jsonl").exists():
        with (SCIFACT / "corpus.jsonl").open(encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh]
        for row in rows:  # title + first sentences
            sents = _sentences(row.get("text") or "")
            lead = f"{row.get('title', '')}\n{' '.join(sents[:3])}".strip()
            docs.append({"id": f"{row['_id']}-a", "text": lead[:MAX_CHARS]})
        for row in rows:  # the rest of the abstract, as a second passage
            sents = _sentences(row.get("text") or "")
            if len(sents) > 3:
                rest = " ".join(sents[3:])
                docs.append({"id": f"{row['_id']}-b", "text": rest[:MAX_CHARS]})
        with (SCIFACT / "queries.jsonl").open(encoding="utf-8") as fh:
            queries = [json.loads(line)["text"] for line in fh]
    rng = random.Random(0)
    words = " ".join(d["text"] for d in docs[:500]).split() or [
        f"word{i}" for i in range(2000)
    ]
    while len(docs) < n:  # generated filler when the corpus is short or absent
        docs.append(
            {"id": f"gen-{len(docs)}", "text": " ".join(rng.choices(words, k=60))}
        )
    if not queries:
        queries = [" ".join(rng.choices(words, k=8)) for _ in range(500)]
    return docs[:n], queries


def _batches(items: list[dict[str, str]], size: int) -> Iterator[list[dict[str, str]]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


async def ingest(client: httpx.AsyncClient, docs: list[dict[str, str]]) -> float:
    started = time.perf_counter()
    r = await client.post("/v1/collections", json={"name": COLLECTION})
    r.raise_for_status()
    semaphore = asyncio.Semaphore(2)  # two batches in flight keep both workers busy

    async def put(batch: list[dict[str, str]]) -> None:
        async with semaphore:
            r = await client.put(
                f"/v1/collections/{COLLECTION}/documents", json={"documents": batch}
            )
            r.raise_for_status()

    await asyncio.gather(*(put(b) for b in _batches(docs, 64)))
    return time.perf_counter() - started


@dataclass
class LevelResult:
    concurrency: int
    seconds: float
    search_ms: list[float] = field(default_factory=list)
    upsert_ms: list[float] = field(default_factory=list)
    healthz_ms: list[float] = field(default_factory=list)
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return len(self.search_ms) + len(self.upsert_ms) + self.errors

    @staticmethod
    def pct(values: list[float], q: float) -> float:
        return float(np.percentile(values, q)) if values else float("nan")


async def healthz_ms(client: httpx.AsyncClient) -> float:
    """Milliseconds of one ``GET /healthz``."""
    started = time.perf_counter()
    r = await client.get("/healthz")
    r.raise_for_status()
    return (time.perf_counter() - started) * 1000


async def run_level(
    client: httpx.AsyncClient,
    concurrency: int,
    queries: list[str],
    pool: list[dict[str, str]],
    *,
    duration: float,
    max_requests: int,
    upsert_fraction: float,
    upsert_size: int,
    k: int,
    seed: int,
) -> LevelResult:
    result = LevelResult(concurrency, 0.0)
    deadline = time.monotonic() + duration
    issued = 0
    counter = iter(range(10**9))

    async def worker(w: int) -> None:
        nonlocal issued
        rng = random.Random(seed * 1000 + w)
        while time.monotonic() < deadline and issued < max_requests:
            issued += 1
            upsert = rng.random() < upsert_fraction
            started = time.perf_counter()
            try:
                if upsert:
                    docs = [
                        {"id": f"new-{seed}-{next(counter)}", "text": d["text"]}
                        for d in rng.sample(pool, upsert_size)
                    ]
                    r = await client.put(
                        f"/v1/collections/{COLLECTION}/documents",
                        json={"documents": docs},
                    )
                else:
                    r = await client.post(
                        f"/v1/collections/{COLLECTION}/search",
                        json={"query": rng.choice(queries), "k": k},
                    )
                ok = r.status_code == 200
                kind = str(r.status_code)
            except httpx.HTTPError as error:
                ok, kind = False, type(error).__name__
            elapsed_ms = (time.perf_counter() - started) * 1000
            if not ok:
                result.errors += 1
                result.error_kinds[kind] = result.error_kinds.get(kind, 0) + 1
            elif upsert:
                result.upsert_ms.append(elapsed_ms)
            else:
                result.search_ms.append(elapsed_ms)

    workers_done = asyncio.Event()

    async def pinger() -> None:
        while not workers_done.is_set():
            result.healthz_ms.append(await healthz_ms(client))
            await asyncio.sleep(0.05)

    async def load() -> None:
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        workers_done.set()

    started = time.perf_counter()
    await asyncio.gather(load(), pinger())
    result.seconds = time.perf_counter() - started
    return result


@dataclass
class Run:
    """One server configuration's figures."""

    label: str
    ingest_seconds: float
    idle_healthz: list[float]
    results: list[LevelResult]
    documents: int


def _label(mode: str) -> str:
    env = mode_env(mode)
    batching = env.get("NORMCAL_EMBED_BATCHING") != "false"
    window = env.get("NORMCAL_EMBED_BATCH_WINDOW_MS", "0")
    on = f"batching on, window {window} ms" if batching else "batching off"
    return f"{mode}: {on}"


async def run_mode(
    args: argparse.Namespace,
    mode: str,
    docs: list[dict[str, str]],
    queries: list[str],
    onnx_path: Path | None = None,
) -> Run:
    """Start a server in ``mode``, ingest, warm up, then run every level."""
    levels = [int(x) for x in args.levels.split(",")]
    env = {
        "NORMCAL_WORKER_THREADS": str(args.workers),
        "NORMCAL_INDEX_TYPE": args.index,
        **mode_env(mode, onnx_path),
    }
    with tempfile.TemporaryDirectory(prefix="normcal-load-") as tmp:
        server = ServerProcess(Path(tmp) / "data", env=env).start(timeout=180)
        try:
            limits = httpx.Limits(max_connections=max(levels) + 4)
            async with httpx.AsyncClient(
                base_url=server.url, timeout=120, limits=limits
            ) as client:
                seconds = await ingest(client, docs)
                print(
                    f"[{_label(mode)}] ingested {len(docs)} documents in "
                    f"{seconds:.1f}s ({len(docs) / seconds:.0f} docs/s)",
                    flush=True,
                )
                await run_level(  # warm-up, not reported
                    client,
                    2,
                    queries,
                    docs,
                    duration=2,
                    max_requests=50,
                    upsert_fraction=args.upsert_fraction,
                    upsert_size=args.upsert_size,
                    k=args.k,
                    seed=99,
                )
                idle_healthz = [await healthz_ms(client) for _ in range(50)]
                results = []
                for i, level in enumerate(levels):
                    results.append(
                        await run_level(
                            client,
                            level,
                            queries,
                            docs,
                            duration=args.duration,
                            max_requests=args.max_requests,
                            upsert_fraction=args.upsert_fraction,
                            upsert_size=args.upsert_size,
                            k=args.k,
                            seed=i,
                        )
                    )
                info = (await client.get(f"/v1/collections/{COLLECTION}")).json()
        finally:
            server.stop()
    return Run(_label(mode), seconds, idle_healthz, results, info["documents"])


def print_run(run: Run) -> None:
    pct = LevelResult.pct
    print(f"\n{run.label}; final collection: {run.documents} docs")
    print(
        "\n| concurrency | requests | req/s | search p50 ms | search p99 ms "
        "| upsert p50 ms | upsert p99 ms | healthz p99 ms | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in run.results:
        print(
            f"| {r.concurrency} | {r.requests} | {r.requests / r.seconds:.1f} "
            f"| {pct(r.search_ms, 50):.1f} | {pct(r.search_ms, 99):.1f} "
            f"| {pct(r.upsert_ms, 50):.1f} | {pct(r.upsert_ms, 99):.1f} "
            f"| {pct(r.healthz_ms, 99):.1f} "
            f"| {r.errors}{' ' + str(r.error_kinds) if r.errors else ''} |"
        )
    top = run.results[-1]
    idle = pct(run.idle_healthz, 50)
    print(
        f"\n/healthz p99 under load at concurrency {top.concurrency}: "
        f"{pct(top.healthz_ms, 99) / idle:.1f} x its idle p50 ({idle:.1f} ms); "
        f"search p99/p50: {pct(top.search_ms, 99) / pct(top.search_ms, 50):.2f}"
    )


def print_ratios(base: Run, other: Run) -> None:
    """``other`` against ``base`` at every level: throughput, search p50 and p99."""
    pct = LevelResult.pct
    print(f"\n{other.label} / {base.label}:")
    print("\n| concurrency | req/s ratio | search p50 ratio | search p99 ratio |")
    print("|---|---|---|---|")
    for b, o in zip(base.results, other.results, strict=True):
        print(
            f"| {b.concurrency} "
            f"| {(o.requests / o.seconds) / (b.requests / b.seconds):.2f} "
            f"| {pct(o.search_ms, 50) / pct(b.search_ms, 50):.2f} "
            f"| {pct(o.search_ms, 99) / pct(b.search_ms, 99):.2f} |"
        )


async def main_async(args: argparse.Namespace) -> int:
    docs, queries = corpus(args.docs)
    modes = args.batching.split(",")
    print(
        f"{len(docs)} documents; index={args.index}, workers={args.workers}, "
        f"cores={os.cpu_count()}; modes: {', '.join(_label(m) for m in modes)}"
    )
    with tempfile.TemporaryDirectory(prefix="normcal-load-onnx-") as tmp:
        onnx_path = None
        if uses_onnx(modes):
            from app.embedding.onnx_export import export_onnx
            from app.settings import default_model_path

            onnx_path = export_onnx(default_model_path(), Path(tmp) / "onnx")
        runs = [await run_mode(args, mode, docs, queries, onnx_path) for mode in modes]
    print(
        f"\nmix: {1 - args.upsert_fraction:.0%} search (k={args.k}) / "
        f"{args.upsert_fraction:.0%} upsert ({args.upsert_size} docs); "
        f"{args.duration:.0f}s per level"
    )
    for run in runs:
        print_run(run)
    for run in runs[1:]:
        print_ratios(runs[0], run)
    pct = LevelResult.pct
    total_errors = sum(r.errors for run in runs for r in run.results)
    worst = max(
        pct(run.results[-1].search_ms, 99) / pct(run.results[-1].search_ms, 50)
        for run in runs
    )
    print(
        f"\nworst search p99/p50 at the highest level: {worst:.2f} (target < 10); "
        f"errors: {total_errors} (target 0)"
    )
    return 0 if total_errors == 0 and worst < 10 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--levels", default="1,4,16")
    parser.add_argument("--duration", type=float, default=20.0, help="s per level")
    parser.add_argument("--max-requests", type=int, default=20_000, help="per level")
    parser.add_argument("--upsert-fraction", type=float, default=0.1)
    parser.add_argument("--upsert-size", type=int, default=4)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2, help="server CPU threads")
    parser.add_argument("--index", choices=["flat", "hnsw"], default="flat")
    parser.add_argument(
        "--batching",
        default="off,0",
        help="server modes compared in one run, the first is the baseline: 'off', "
        "or a batch window in ms (batching on), with optional parts joined by / "
        "(benchmarks/servers.py), e.g. off,0,2 or torch/fp32/t0/0,0,onnx/0",
    )
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
