"""Search latency while ``normcal ingest`` loads documents into the same server.

One ``normcal serve`` subprocess (its defaults, or ``--mode``, see
``benchmarks/servers.py``) with a collection of ``--served-docs`` scifact abstracts
that answers searches: one client, a search every ``--interval`` ms (the next one
starts at once if the last one took longer), k = 10, scifact claims as queries, in
a fixed shuffled order. Each round runs, one after the other:

1. **idle**: ``--searches`` searches with nothing else running;
2. **ingest alone**: ``normcal ingest`` (the CLI, its defaults: 128 documents a
   request, two in flight) of the first ``--docs`` scifact abstracts into a new
   collection; its docs/s is the one the CLI prints;
3. **ingest + searches**: the same ingest into another new collection with the
   searcher running beside it; the searches counted are those that started within
   the ingest's own time (as the CLI reports it).

It prints each phase's search p50/p99 and the ingest's docs/s, and the ratios
against the idle searches and the lone ingest of the same round, with the issue's
targets (p99 during the ingest ≤ 4x idle, p50 ≤ 1.5x idle, ingest docs/s with
searches ≥ 0.85x alone). Figures are medians over rounds; load averages before and
after.

Searches cost CPU the ingest then cannot have: the idle phase measures the CPU time
of one search (the server's and this process's), and the report says what share of
the machine's cores the searches made during the ingest took, so the ingest could
keep at most the rest. A server that makes searches wait (queued behind documents)
serves fewer of them, at the same pace, and so leaves the ingest more. Run it from
the repository root::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/ingest_search.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from app.cli.process import ServerProcess  # noqa: E402
from benchmarks.servers import mode_env  # noqa: E402

DATA = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))
SCIFACT = DATA / "scifact"
SERVED = "served"
TARGETS = {"p99": 4.0, "p50": 1.5, "docs_per_s": 0.85}


def queries() -> list[str]:
    with (SCIFACT / "queries.jsonl").open(encoding="utf-8") as lines:
        texts = [json.loads(line)["text"] for line in lines]
    random.Random(0).shuffle(texts)
    return texts


class Searcher:
    """One client searching ``SERVED`` at a steady pace, in a thread."""

    def __init__(self, url: str, texts: list[str], interval: float) -> None:
        self.client = httpx.Client(base_url=url, timeout=600)
        self.texts = texts
        self.next = 0
        self.interval = interval
        self.samples: list[tuple[float, float]] = []  # (start, ms)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def search(self) -> None:
        text = self.texts[self.next % len(self.texts)]
        self.next += 1
        started = time.perf_counter()
        r = self.client.post(
            f"/v1/collections/{SERVED}/search", json={"query": text, "k": 10}
        )
        r.raise_for_status()
        self.samples.append((started, (time.perf_counter() - started) * 1000))

    def run(self, n: int | None = None) -> None:
        """Search ``n`` times, or until :meth:`stop`, one every ``interval``."""
        due = time.perf_counter()
        while not self._stop.is_set() and (n is None or n > 0):
            self.search()
            n = None if n is None else n - 1
            due += self.interval
            self._stop.wait(max(0.0, due - time.perf_counter()))

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def take(self, since: float = float("-inf")) -> list[float]:
        """The latencies of searches started after ``since``; forgets them all."""
        kept = [ms for started, ms in self.samples if started >= since]
        self.samples = []
        return kept


def cli_ingest(url: str, collection: str, docs: int) -> float:
    """Run ``normcal ingest`` with its defaults; the docs/s it reports."""
    cmd = [sys.executable, "-m", "app.cli", "ingest", str(SCIFACT)]
    cmd += ["--collection", collection, "--limit", str(docs), "--url", url]
    done = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, check=False, timeout=3600
    )
    if done.returncode != 0:
        raise SystemExit(f"normcal ingest failed: {done.stderr[-2000:]}")
    found = re.search(r"in ([\d.]+)s \(([\d.]+) docs/s\)", done.stdout)
    if found is None:
        raise SystemExit(f"unexpected normcal ingest output: {done.stdout!r}")
    return float(found.group(1))


def cpu_seconds(pid: int) -> float:
    """CPU time of process ``pid`` (every thread) plus this process's so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    ticks = os.sysconf("SC_CLK_TCK")
    server = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    own = os.times()
    return server + own.user + own.system


@dataclass
class Round:
    idle: list[float]
    during: list[float]
    alone_docs_per_s: float
    with_docs_per_s: float
    cpu_per_search: float  # seconds, idle
    ingest_seconds: float

    @property
    def search_share(self) -> float:
        """The share of the cores the searches beside the ingest took."""
        busy = len(self.during) * self.cpu_per_search
        return busy / (self.ingest_seconds * (os.cpu_count() or 1))


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def one_round(
    r: int, url: str, pid: int, searcher: Searcher, args: argparse.Namespace
) -> Round:
    cpu = cpu_seconds(pid)
    searcher.run(args.searches)
    idle = searcher.take()
    cpu_per_search = (cpu_seconds(pid) - cpu) / len(idle)
    seconds = cli_ingest(url, f"alone-{r}", args.docs)
    alone = args.docs / seconds
    searcher.start()
    seconds = cli_ingest(url, f"with-{r}", args.docs)
    ended = time.perf_counter()
    searcher.stop()
    during = searcher.take(since=ended - seconds)
    result = Round(idle, during, alone, args.docs / seconds, cpu_per_search, seconds)
    print(
        f"round {r + 1}: idle p50 {pct(idle, 50):.1f} p99 {pct(idle, 99):.1f} ms "
        f"({len(idle)}, {cpu_per_search * 1000:.1f} ms CPU each); during the ingest "
        f"p50 {pct(during, 50):.1f} p99 {pct(during, 99):.1f} ms ({len(during)}, "
        f"{result.search_share:.0%} of the cores); ingest alone {alone:.1f} docs/s, "
        f"with searches {result.with_docs_per_s:.1f} docs/s",
        flush=True,
    )
    return result


def report(rounds: list[Round], args: argparse.Namespace, load: str) -> str:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    idle50 = med([pct(r.idle, 50) for r in rounds])
    idle99 = med([pct(r.idle, 99) for r in rounds])
    dur50 = med([pct(r.during, 50) for r in rounds])
    dur99 = med([pct(r.during, 99) for r in rounds])
    alone = med([r.alone_docs_per_s for r in rounds])
    beside = med([r.with_docs_per_s for r in rounds])
    ratios = {
        "p50": med([pct(r.during, 50) / pct(r.idle, 50) for r in rounds]),
        "p99": med([pct(r.during, 99) / pct(r.idle, 99) for r in rounds]),
        "docs_per_s": med([r.with_docs_per_s / r.alone_docs_per_s for r in rounds]),
    }

    def verdict(key: str) -> str:
        ok = (
            ratios[key] >= TARGETS[key]
            if key == "docs_per_s"
            else (ratios[key] <= TARGETS[key])
        )
        return "met" if ok else "missed"

    cpu = _cpu()
    lines = [
        f"`benchmarks/ingest_search.py --docs {args.docs} --served-docs "
        f"{args.served_docs} --searches {args.searches} --interval "
        f"{args.interval_ms:g} --rounds {args.rounds}"
        + (f" --mode {args.mode}" if args.mode else "")
        + f"`; {cpu}; load average {load}; medians over {args.rounds} round(s).",
        "",
        "| phase | searches | search p50 ms | search p99 ms | ingest docs/s |",
        "|---|---|---|---|---|",
        f"| idle | {sum(len(r.idle) for r in rounds)} | {idle50:.1f} | {idle99:.1f} "
        "| — |",
        f"| `normcal ingest` alone | — | — | — | {alone:.1f} |",
        f"| `normcal ingest` + searches | {sum(len(r.during) for r in rounds)} "
        f"| {dur50:.1f} | {dur99:.1f} | {beside:.1f} |",
        "",
        "| ratio | figure | target | verdict |",
        "|---|---|---|---|",
        f"| search p50 during the ingest / idle | {ratios['p50']:.2f} | ≤ 1.5 "
        f"| {verdict('p50')} |",
        f"| search p99 during the ingest / idle | {ratios['p99']:.2f} | ≤ 4 "
        f"| {verdict('p99')} |",
        f"| ingest docs/s with searches / alone | {ratios['docs_per_s']:.2f} "
        f"| ≥ 0.85 | {verdict('docs_per_s')} |",
        "",
        f"CPU per search (server and client, idle): "
        f"{med([r.cpu_per_search for r in rounds]) * 1000:.1f} ms; the searches "
        f"during the ingest took {med([r.search_share for r in rounds]):.0%} of the "
        f"{os.cpu_count()} cores.",
    ]
    return "\n".join(lines)


def _cpu() -> str:
    model, flags = "?", set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.partition(":")[2].strip()
        elif line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
    amx = "with amx_bf16" if "amx_bf16" in flags else "no amx_bf16"
    return f"{model} ({os.cpu_count()} cores, {amx})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=1024, help="documents ingested")
    parser.add_argument("--served-docs", type=int, default=2000)
    parser.add_argument("--searches", type=int, default=300, help="idle searches")
    parser.add_argument("--interval-ms", type=float, default=100.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--mode", default="", help="server mode (benchmarks/servers.py)"
    )
    args = parser.parse_args()
    if not (SCIFACT / "corpus.jsonl").exists():
        print(f"needs {SCIFACT}", file=sys.stderr)
        return 2
    from app.cli.inputs import read_corpus

    served = [
        {"id": d["id"], "text": d["text"]}
        for d in read_corpus(SCIFACT, args.docs + args.served_docs)
    ][args.docs :]  # not the ingested ones
    before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="normcal-ingest-search-") as tmp:
        # The searches cycle through the claims: with the embedding cache on, a
        # repeated claim would cost no forward pass and hide the queue being measured.
        env = {**mode_env(args.mode), "NORMCAL_EMBED_CACHE_ENTRIES": "0"}
        server = ServerProcess(Path(tmp) / "data", env=env)
        server.start(timeout=600)
        assert server.proc is not None
        try:
            with httpx.Client(base_url=server.url, timeout=600) as client:
                client.post("/v1/collections", json={"name": SERVED}).raise_for_status()
                for i in range(0, len(served), 128):
                    client.put(
                        f"/v1/collections/{SERVED}/documents",
                        json={"documents": served[i : i + 128]},
                    ).raise_for_status()
            searcher = Searcher(server.url, queries(), args.interval_ms / 1000)
            searcher.run(50)  # warm-up
            searcher.take()
            rounds = [
                one_round(r, server.url, server.proc.pid, searcher, args)
                for r in range(args.rounds)
            ]
        finally:
            server.stop()
    after = os.getloadavg()
    load = f"{before[0]:.1f} before, {after[0]:.1f} after"
    print("\n" + report(rounds, args, load))
    return 0


if __name__ == "__main__":
    sys.exit(main())
