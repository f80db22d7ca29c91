"""The first search after ``normcal serve`` starts, when no request came before it.

A sidecar without readiness probes gets a user's search as its first request. Each
round starts the server afresh on the same collection (``--docs`` scifact abstracts,
ingested once), waits for start-up to end by its log (no request), then times the
first search and a second one (other query texts, so both embed). Run it in two trees
to compare them.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/first_request.py [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import os
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


def fresh_start(data: Path, log: Path, timeout: float = 300.0) -> ServerProcess:
    """Start the server and return once its log says start-up is over."""
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
    return server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--docs", type=int, default=1000)
    args = parser.parse_args()
    docs, queries = _texts(args.docs)
    first, second = [], []
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
            server = fresh_start(data, Path(tmp) / "serve.log")
            with httpx.Client(base_url=server.url, timeout=600) as http:
                for times, text in zip((first, second), queries[2 * r :], strict=False):
                    started = time.perf_counter()
                    answer = http.post("/v1/collections/c/search", json={"query": text})
                    times.append((time.perf_counter() - started) * 1000)
                    answer.raise_for_status()
            server.stop()
    print(f"{_machine()}; {args.docs} scifact abstracts, {args.rounds} fresh starts\n")
    print("| search after a fresh start | median ms | each round ms |")
    print("|---|---|---|")
    for label, times in (("first", first), ("second", second)):
        each = ", ".join(f"{t:.1f}" for t in times)
        print(f"| {label} | {statistics.median(times):.1f} | {each} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
