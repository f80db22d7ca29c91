"""The lexical part of a local search, per query: FTS5 (before) and in-memory postings.

For each ``--docs`` size, writes a collection file (the corpus of
``benchmarks/load.py``: scifact passages, then generated text of 60 words drawn
from them when more are asked for, so 100k documents are mostly synthetic), builds
the in-memory postings (time and memory), then times each query both ways,
alternating which goes first:

* before: ``lexical.search_with_mass`` on the store's connection, as
  ``CollectionStore.lexical_search`` did (FTS5 MATCH, IDF-floored pruning);
* after: ``CollectionStore.lexical_search`` (freshness check + postings).

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


def run(n_docs: int, n_queries: int) -> None:
    docs, queries = corpus(n_docs)
    queries = queries[:n_queries]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        store = _store(Path(tmp) / "lex.sqlite3", docs)
        print(f"\n{n_docs} documents written in {time.perf_counter() - started:.1f}s")
        conn = store._conn  # the store's own connection: the "before" path
        assert conn is not None
        tracemalloc.start()
        started = time.perf_counter()
        store.lexical_search("warm", None, None, depth=LEXICAL_DEPTH)  # builds
        build_s = time.perf_counter() - started
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        postings = store._postings
        assert isinstance(postings, Postings)
        print(
            f"postings: built in {build_s:.2f}s, {held / 1e6:.0f} MB held"
            f" ({postings.nbytes() / 1e6:.0f} MB of arrays), peak {peak / 1e6:.0f} MB"
        )
        before: list[float] = []
        after: list[float] = []
        for i, text in enumerate(queries):
            for way in (0, 1) if i % 2 else (1, 0):
                started = time.perf_counter()
                if way == 0:
                    lexical.search_with_mass(
                        conn, text, None, None, depth=LEXICAL_DEPTH
                    )
                else:
                    store.lexical_search(text, None, None, depth=LEXICAL_DEPTH)
                (before if way == 0 else after).append(
                    (time.perf_counter() - started) * 1000
                )
        for name, times in (("before (FTS5)", before), ("after (postings)", after)):
            print(
                f"{name:17s} per query: p50 {_pct(times, 50):7.2f} ms"
                f"  p99 {_pct(times, 99):7.2f} ms  mean {np.mean(times):7.2f} ms"
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
