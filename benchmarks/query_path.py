"""Where a query's time goes before the collection: the forward pass, and the hand-off.

Two measurements, in this process, one intra-op thread, the npl queries embedded one
at a time (as searches do), interleaved over ``--rounds`` rounds:

1. CPU per query of the torch backend with ``NORMCAL_EMBED_PRECISION`` fp32 (every
   text through the eager model), mixed (eager, feed-forward layers in bf16) and auto
   (on a CPU: queries through the graph traced at the chosen precision, if its
   self-check passed);
2. wall time per query of the auto model called directly, from one CPU-pool job per
   query (what the server does: the event loop hands each pass to a pool thread and
   waits), and from one pool job for all of them; and the pool's own round trip with
   an empty job. The difference between the first two is what a hand-off costs the
   model here, beyond the round trip;
3. thread CPU per query of the auto model, one query after another as in (1), and
   after a pause of ``--pause-ms`` before each query, sleeping or spinning: what a
   served pass pays that an in-process loop does not (a served pass waits for the
   next request; ``benchmarks/peers.py``'s raw peer encodes back to back).

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/query_path.py [--rounds 4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from app.collections.index import limit_threads  # noqa: E402
from app.concurrency import CpuPool  # noqa: E402
from app.embedding import SentenceTransformerEmbedder  # noqa: E402
from app.settings import default_model_path  # noqa: E402

DATA = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))


def queries() -> list[str]:
    path = DATA / "npl" / "queries.jsonl"
    if not path.is_file():
        raise SystemExit(f"needs {path} (NORMCAL_SHARED_DATA)")
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line)["text"] for line in lines]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pause-ms", type=float, default=5.0)
    args = parser.parse_args()
    texts = queries()
    models = {
        p: SentenceTransformerEmbedder(
            default_model_path(), model_name="m", precision=p, threads=1
        )
        for p in ("fp32", "mixed", "auto")
    }
    print(f"auto: {models['auto'].precision_choice.reason}\n")
    cpu = dict.fromkeys(models, 0.0)
    for _ in range(args.rounds):
        for p, model in models.items():
            started = time.process_time()
            for text in texts:
                model.embed([text], "query")
            cpu[p] += time.process_time() - started
    n = args.rounds * len(texts)
    print(f"| {len(texts)} npl queries x {args.rounds} rounds | CPU ms per query |")
    print("|---|---|")
    for p, seconds in cpu.items():
        print(f"| torch {p} | {1000 * seconds / n:.2f} |")

    auto = models["auto"]
    pool = CpuPool(2, 1000, initializer=partial(limit_threads, 1))

    def each() -> float:
        started = time.perf_counter()
        for text in texts:
            auto.embed([text], "query")
        return time.perf_counter() - started

    async def handed_off() -> float:
        started = time.perf_counter()
        for text in texts:
            await pool.run(auto.embed, [text], "query")
        return time.perf_counter() - started

    async def round_trip() -> float:
        started = time.perf_counter()
        for _ in texts:
            await pool.run(int)
        return time.perf_counter() - started

    async def measure() -> dict[str, list[float]]:
        walls: dict[str, list[float]] = {
            "called directly": [],
            "one pool job per query": [],
            "one pool job for all": [],
            "pool round trip, empty job": [],
        }
        for _ in range(args.rounds):
            walls["called directly"].append(each())
            walls["one pool job per query"].append(await handed_off())
            walls["one pool job for all"].append(await pool.run(each))
            walls["pool round trip, empty job"].append(await round_trip())
        return walls

    walls = asyncio.run(measure())
    pool.shutdown()
    print(
        f"\n| torch auto, {len(texts)} queries | wall ms per query (median of rounds) |"
    )
    print("|---|---|")
    for label, rounds in walls.items():
        print(f"| {label} | {1000 * statistics.median(rounds) / len(texts):.2f} |")
    print_pauses(auto, texts, args.rounds, args.pause_ms / 1000)
    return 0


def print_pauses(
    model: SentenceTransformerEmbedder, texts: list[str], rounds: int, pause: float
) -> None:
    """(3): each query's thread CPU, back to back and after a pause, interleaved."""

    def spin() -> None:
        until = time.perf_counter() + pause
        while time.perf_counter() < until:
            pass

    before = {
        "back to back": lambda: None,
        f"after sleeping {pause * 1000:g} ms": lambda: time.sleep(pause),
        f"after spinning {pause * 1000:g} ms": spin,
    }
    cpu: dict[str, list[float]] = {label: [] for label in before}
    for _ in range(rounds):
        for label, wait in before.items():
            for text in texts:
                wait()
                started = time.thread_time()
                model.embed([text], "query")
                cpu[label].append(1000 * (time.thread_time() - started))
    print(f"\n| torch auto, {len(texts)} queries x {rounds} | CPU ms p50 | p99 |")
    print("|---|---|---|")
    for label, ms in cpu.items():
        ms.sort()
        print(
            f"| {label} | {statistics.median(ms):.2f} | {ms[int(0.99 * len(ms))]:.2f} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
