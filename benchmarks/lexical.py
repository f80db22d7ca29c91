"""The lexical part of a local search, per query: FTS5, full ranking, pool's top.

For each ``--docs`` size, writes a collection file (the corpus of
``benchmarks/load.py``: scifact passages, then generated text of 60 words drawn
from them when more are asked for, so 100k documents are mostly synthetic), reopens
it, times the first search (answered by FTS5 while the in-memory postings build in
the background) and the build itself (time and memory), then times each query three
ways, in rotating order:

* FTS5: ``lexical.search_with_mass`` on the store's connection (IDF-floored pruning),
  what a search gets until the postings are built;
* full ranking: every match stable-sorted and turned into Python lists and a dict,
  as ``Collection._pool`` did before (``Postings.rank`` with no depth);
* pool's top: ``CollectionStore.lexical_search`` (freshness check, the top
  ``LEXICAL_DEPTH`` by partition) plus the BM25 lookup of ``LEXICAL_DEPTH`` other
  documents (the dense hits), as ``Collection._pool`` does now.

No model, no HTTP; tiny random vectors. Run niced on a shared machine::

    nice -n 10 python benchmarks/lexical.py                 # 10k and 100k documents
    nice -n 10 python benchmarks/lexical.py --docs 2000 --queries 100
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.collections import lexical  # noqa: E402
from app.collections.postings import Postings  # noqa: E402
from app.collections.store import CollectionStore, NewDocument, build_store  # noqa: E402
from benchmarks.load import corpus  # noqa: E402
from calibration.features import LEXICAL_DEPTH  # noqa: E402

DIM = 8
BATCH = 2000


def _store(path: Path, docs: list[dict[str, str]]) -> CollectionStore:
    build_store(path, {"name": "lex", "model": "m", "dim": DIM}, synchronous="OFF")
    store = CollectionStore(path, synchronous="OFF")
    vector = np.ones(DIM, dtype=np.float32) / np.sqrt(DIM)
    for i in range(0, len(docs), BATCH):
        store.upsert(
            [
                NewDocument(d["id"], d["text"], {}, vector, 1.0, 3, False)
                for d in docs[i : i + BATCH]
            ]
        )
    return store


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def _full_ranking(postings: Postings, text: str, dense: list[int]) -> None:
    ranking = postings.rank(text, None, None)
    assert ranking is not None
    seqs = [int(s) for s in ranking.top.seqs]
    bm25 = dict(zip(seqs, ranking.top.scores.tolist(), strict=True))
    [bm25.get(s, 0.0) for s in dense]


def _pool_top(store: CollectionStore, text: str, dense: list[int]) -> None:
    ranking = store.lexical_search(text, None, depth=LEXICAL_DEPTH)
    [int(s) for s in ranking.top.seqs]
    ranking.bm25_of(dense)


def run(n_docs: int, n_queries: int) -> None:
    docs, queries = corpus(n_docs)
    queries = queries[:n_queries]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lex.sqlite3"
        started = time.perf_counter()
        _store(path, docs).close()
        print(f"\n{n_docs} documents written in {time.perf_counter() - started:.1f}s")
        store = CollectionStore(path, synchronous="OFF")
        tracemalloc.start()
        started = time.perf_counter()
        store.start_lexical()
        store.lexical_search(queries[0], None, depth=LEXICAL_DEPTH)  # FTS5 answers
        first_ms = (time.perf_counter() - started) * 1000
        assert store.wait_lexical(timeout=3600)
        build_s = time.perf_counter() - started
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        postings = store._postings
        assert isinstance(postings, Postings)
        print(
            f"first search {first_ms:.1f} ms (FTS5, build in the background);"
            f" postings ready after {build_s:.2f}s, {held / 1e6:.0f} MB held"
            f" ({postings.nbytes() / 1e6:.0f} MB of arrays), peak {peak / 1e6:.0f} MB"
        )
        conn = store._conn  # the store's own connection: the FTS5 path
        assert conn is not None
        rng = np.random.default_rng(0)
        ways: dict[str, Callable[[str, list[int]], object]] = {
            "FTS5": lambda text, _: lexical.search_with_mass(
                conn, text, None, None, depth=LEXICAL_DEPTH
            ),
            "full ranking": lambda text, dense: _full_ranking(postings, text, dense),
            "pool's top": lambda text, dense: _pool_top(store, text, dense),
        }
        times: dict[str, list[float]] = {name: [] for name in ways}
        names = list(ways)
        for i, text in enumerate(queries):
            dense = [int(s) for s in rng.integers(1, n_docs + 1, LEXICAL_DEPTH)]
            for name in names[i % 3 :] + names[: i % 3]:
                started = time.perf_counter()
                ways[name](text, dense)
                times[name].append((time.perf_counter() - started) * 1000)
        for name, values in times.items():
            print(
                f"{name:13s} per query: p50 {_pct(values, 50):7.2f} ms"
                f"  p99 {_pct(values, 99):7.2f} ms  mean {np.mean(values):7.2f} ms"
            )
        store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    print(f"lexical part of a search, {args.queries} queries (scifact when present)")
    for n in args.docs:
        run(n, args.queries)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
