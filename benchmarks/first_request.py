"""The first searches after ``normcal serve`` starts, when no request came before them.

A sidecar without readiness probes gets a user's search as its first request, and
one restarted by a deployment gets a stream of them at once. Each round starts the
server afresh on the same collection (``--docs`` documents of the shared set
``--set``, ingested once), waits for start-up to end by its log (no request), then
times ``--searches`` searches one after the other (each a query text not seen
before, so each embeds): the first, the second, and the median and the slowest of
the rest, beside how long start-up took (the process's start to that log line) and
how much of it was spent waiting for the BM25 index (its log line; "-" in a tree
that does not wait). Run it in two trees to compare them.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/first_request.py [--rounds 3]
[--searches 20] [--set scifact] [--docs 1000]``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from app.cli.process import ServerProcess, wait_for_port_file  # noqa: E402
from benchmarks.peers import _machine, _texts  # noqa: E402

STARTED = b"Application startup complete"
WAITED = re.compile(rb"start-up waited ([0-9.]+)s")  # for the BM25 indexes


def fresh_start(
    data: Path, log: Path, timeout: float = 300.0
) -> tuple[ServerProcess, float]:
    """Start the server; once its log says start-up is over, it and the seconds taken."""
    started = time.perf_counter()
    port_file = data.with_name("fresh.port")
    port_file.unlink(missing_ok=True)
    with log.open("wb") as sink:
        server = ServerProcess(data, env={"NORMCAL_LOG_LEVEL": "INFO"}, log=sink)
        cmd = [sys.executable, "-m", "app.cli", "serve", "--port", "0"]
        cmd += ["--port-file", str(port_file), "--data-dir", str(data)]
        server.proc = server.spawn(cmd)
    server.port = wait_for_port_file(port_file, server.proc, timeout)
    server.url = f"http://127.0.0.1:{server.port}"
    deadline = time.monotonic() + timeout
    while STARTED not in log.read_bytes():
        if server.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start: {log.read_text()[-500:]}")
        time.sleep(0.1)
    return server, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--searches", type=int, default=20)
    parser.add_argument("--set", default="scifact", help="a folder of the shared data")
    parser.add_argument("--docs", type=int, default=1000)
    args = parser.parse_args()
    docs, queries = _texts(args.docs, args.set)
    rounds: list[tuple[float, float | None, list[float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        server = ServerProcess(data).start(timeout=300)
        with httpx.Client(base_url=server.url, timeout=600) as http:
            http.post("/v1/collections", json={"name": "c"}).raise_for_status()
            for i in range(0, len(docs), 128):
                chunk = [{"id": d["id"], "text": d["text"]} for d in docs[i : i + 128]]
                body = {"documents": chunk}
                http.put("/v1/collections/c/documents", json=body).raise_for_status()
        server.stop()
        for r in range(args.rounds):
            server, start_up = fresh_start(data, Path(tmp) / "serve.log")
            times = []
            with httpx.Client(base_url=server.url, timeout=600) as http:
                for i in range(args.searches):
                    # A text no round has seen: the set's queries, then numbered.
                    n = r * args.searches + i
                    text = f"{queries[n % len(queries)]} {n // len(queries) or ''}"
                    started = time.perf_counter()
                    answer = http.post("/v1/collections/c/search", json={"query": text})
                    times.append((time.perf_counter() - started) * 1000)
                    answer.raise_for_status()
            server.stop()
            waited = WAITED.search((Path(tmp) / "serve.log").read_bytes())
            rounds.append((start_up, float(waited[1]) if waited else None, times))
    print(
        f"{_machine()}; {len(docs)} documents of {args.set}, {args.rounds} fresh "
        f"starts, {args.searches} searches after each\n"
    )
    print(
        "| round | start-up s (of which waiting for the BM25 index) | first ms "
        "| second ms | the rest: median / slowest ms |"
    )
    print("|---|---|---|---|---|")
    for r, (start_up, waited, times) in enumerate(rounds, 1):
        rest = times[2:] or [float("nan")]
        wait = "-" if waited is None else f"{waited:.2f}"
        print(
            f"| {r} | {start_up:.1f} ({wait}) | {times[0]:.1f} | {times[1]:.1f} | "
            f"{statistics.median(rest):.1f} / {max(rest):.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
