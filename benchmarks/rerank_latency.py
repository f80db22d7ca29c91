"""Latency of ``POST /v1/rerank`` against embedding the same texts in-process.

The baseline is what reranking cannot avoid: one forward pass over the query and its
candidates, run in this process with the server's settings (``load_embedder`` of
the same ``Settings``: backend, precision and its traced graph, one thread per pass).
Against it, in the same run, list by list:

- **cold**: ``/v1/rerank`` over HTTP (a ``normcal serve`` subprocess on loopback) of a
  list whose texts the server has never seen: embedding, the list's features, the
  calibration, JSON both ways;
- **warm**: the same lists again, every text now in the server's embedding cache.

Lists are real retrieval candidates when the relevance data is staged (scifact: a
test query, its judged abstracts, then abstracts of the corpus in file order up to
``--docs`` per list, each list's own); generated text otherwise. The baseline and
the cold request of a list run back to back, so a busier or quieter moment of the
machine falls on both. Prints p50/p99 of each and the ratios of the p50s, with the
CPU and the load average.

Loopback only, bounded, stops by itself::

    python benchmarks/rerank_latency.py                 # 60 lists of 20 passages
    python benchmarks/rerank_latency.py --lists 100 --docs 20
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.api.lifespan import load_embedder  # noqa: E402
from app.cli.process import ServerProcess  # noqa: E402
from app.settings import Settings  # noqa: E402

SHARED = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))
WARMUP = 5  # lists run before timing (server code paths, the baseline's graph)


def cpu_name() -> str:
    """The CPU model and whether it has AMX bf16 (``/proc/cpuinfo``)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    name = next(
        (
            line.split(":", 1)[1].strip()
            for line in info.splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    flags = next((line for line in info.splitlines() if line.startswith("flags")), "")
    return f"{name} ({'amx_bf16' if 'amx_bf16' in flags.split() else 'no amx_bf16'})"


def scifact_lists(n: int, docs: int) -> list[tuple[str, list[str]]] | None:
    """``n`` lists of a query and ``docs`` abstracts, none shared between lists."""
    from app.cli.inputs import read_corpus, read_qrels, read_queries

    path = SHARED / "scifact"
    if not (path / "corpus.jsonl").exists():
        return None
    qrels = read_qrels(path, "test")
    queries = read_queries(path)
    corpus = {d["id"]: d["text"] for d in read_corpus(path)}
    used: set[str] = set()
    lists = []
    pool = iter(corpus)
    for qid in sorted(qrels)[:n]:
        chosen = [d for d in qrels[qid] if d in corpus and d not in used][:docs]
        while len(chosen) < docs:
            d = next(pool)
            if d not in used and d not in chosen:
                chosen.append(d)
        used.update(chosen)
        lists.append((queries[qid], [corpus[d] for d in chosen]))
    return lists if len(lists) == n else None


def generated_lists(n: int, docs: int) -> list[tuple[str, list[str]]]:
    """Abstract-length texts of random words (no relevance data here)."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(5000)]
    return [
        (
            " ".join(rng.choices(words, k=8)),
            [
                " ".join(rng.choices(words, k=rng.randint(120, 260)))
                for _ in range(docs)
            ],
        )
        for _ in range(n)
    ]


def p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lists", type=int, default=60)
    parser.add_argument("--docs", type=int, default=20, help="candidates per list")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    total = args.lists + WARMUP
    lists = scifact_lists(total, args.docs)
    source = "scifact test queries and abstracts"
    if lists is None:
        lists, source = generated_lists(total, args.docs), "generated text"
    print(f"CPU: {cpu_name()}; load average at start: {os.getloadavg()}")
    print(f"{args.lists} lists of 1 query + {args.docs} passages ({source})")

    embedder = load_embedder(Settings())  # the server's settings: same model and path
    baseline: list[float] = []
    cold: list[float] = []
    warm: list[float] = []
    with tempfile.TemporaryDirectory(prefix="normcal-rerank-") as tmp:
        server = ServerProcess(Path(tmp) / "data").start(timeout=300)
        try:
            with httpx.Client(base_url=server.url, timeout=120) as client:

                def rerank(query: str, documents: list[str]) -> float:
                    started = time.perf_counter()
                    r = client.post(
                        "/v1/rerank", json={"query": query, "documents": documents}
                    )
                    elapsed = (time.perf_counter() - started) * 1000
                    r.raise_for_status()  # an error stops the run: figures must be real
                    assert len(r.json()["results"]) == len(documents)
                    return elapsed

                def embed(query: str, documents: list[str]) -> float:
                    started = time.perf_counter()
                    embedder.embed([query, *documents], "document")
                    return (time.perf_counter() - started) * 1000

                for i, (query, documents) in enumerate(lists):
                    # Alternate which goes first, so neither always follows the other.
                    if i % 2:
                        e, c = embed(query, documents), rerank(query, documents)
                    else:
                        c, e = rerank(query, documents), embed(query, documents)
                    if i >= WARMUP:
                        baseline.append(e)
                        cold.append(c)
                for query, documents in lists[WARMUP:]:
                    warm.append(rerank(query, documents))
                metrics = client.get("/metrics").text
        finally:
            server.stop()
    hits = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("normcal_embedding_cache_hits_total{")
    )
    base50 = p(baseline, 50)
    print(f"{'':34} {'p50 ms':>8} {'p99 ms':>8} {'p50 / embed':>12}")
    for name, values in (
        (f"in-process embed of {args.docs + 1} texts", baseline),
        ("/v1/rerank, cold (new texts)", cold),
        ("/v1/rerank, warm (cached texts)", warm),
    ):
        print(
            f"{name:34} {p(values, 50):8.1f} {p(values, 99):8.1f} {p(values, 50) / base50:12.2f}"
        )
    print(
        f"server cache hits: {hits:.0f} (warm pass: {len(warm) * (args.docs + 1)} texts)"
    )
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
