"""Milvus document-frequency lookups: one search per term (before) against batched and bounded.

A Milvus collection (Milvus Lite 3.x in a temporary file, or ``--uri`` a server) of
``--documents`` real abstracts (scifact from ``$NORMCAL_SHARED_DATA``; random unit
vectors stand in for embeddings: this measures the lexical statistics, not the
model). For words of the corpus no earlier lookup counted, it times, in one run:

- ``per_term``: one BM25 search per term, as searches counted them before (the
  baseline), for one query of 64 terms;
- ``batched``: 64 other such terms in one call (``MilvusCollection._count_terms``);
- a search of a batch of 32 such queries (``--queries``) through
  ``MilvusCollection.search`` with ``NORMCAL_MILVUS_TERM_LOOKUPS`` at 0, 8, 32 and
  64, each on fresh words;
- while such a batch runs (the bound 32), one-query searches of the same
  collection, one after the other, against the same search alone and against the
  batch's own time: before, such a search waited behind the batch's lookups under
  the collection's lock, up to the whole batch.

Prints seconds and ratios against the baseline measured in the same run. Timing
figures on a shared machine are noisy: read them with ``uptime``'s load.

    python benchmarks/term_lookups.py [--documents 2000] [--queries 32] [--uri URI]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATA = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))
DIM = 8
TERMS = 64  # a query's distinct terms (MAX_QUERY_TERMS)


def _load(data: dict[str, Any]) -> Any:
    return data


def corpus(n: int) -> list[str]:
    """``n`` scifact abstracts, or synthetic texts where the data is absent."""
    path = DATA / "scifact" / "corpus.jsonl"
    if not path.exists():
        rng = random.Random(0)
        words = [f"w{i}" for i in range(5000)]
        return [" ".join(rng.choice(words) for _ in range(120)) for _ in range(n)]
    texts = []
    with path.open() as lines:
        for line in lines:
            texts.append(json.loads(line)["text"])
            if len(texts) == n:
                break
    return texts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=32)
    parser.add_argument("--uri", default="")
    args = parser.parse_args()

    from app.collections import lexical
    from app.collections.base import NewDocument
    from app.collections.milvus import MilvusCollection, MilvusStorage
    from app.collections.term_counts import LOOKUPS

    texts = corpus(args.documents)
    vocabulary = sorted({t for text in texts for t in lexical.query_terms(text)})
    rng = random.Random(1)
    rng.shuffle(vocabulary)
    fresh = iter(vocabulary)  # every measurement below takes words no one counted

    def query() -> str:
        return " ".join(next(fresh) for _ in range(TERMS))

    z = np.random.default_rng(0).standard_normal((len(texts), DIM))
    vectors = (z / np.linalg.norm(z, axis=1, keepdims=True)).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="normcal-terms-") as tmp:
        uri = args.uri or str(Path(tmp) / "milvus.db")
        storage: MilvusStorage[Any] = MilvusStorage(uri, _load)
        if "kb" in storage.names():
            storage.drop("kb")
        created = storage.create("kb", {"model": "m", "dim": DIM, "created_at": 0.0})
        for start in range(0, len(texts), 250):
            created.upsert(
                [
                    NewDocument(
                        id=f"d{i}",
                        text=texts[i],
                        metadata={},
                        vector=vectors[i],
                        norm=1.0,
                        n_tokens=len(texts[i].split()),
                        truncated=False,
                    )
                    for i in range(start, min(start + 250, len(texts)))
                ]
            )
        collections: dict[int, MilvusCollection[Any]] = {}
        for bound in (0, 8, 32, 64):  # the bound is read when a collection opens
            storage.term_lookups = bound
            collections[bound] = storage.open("kb")
        kb = collections[32]
        terms = lexical.query_terms(query())

        def search_one(term: str) -> int:
            (hits,) = kb._client.search(
                kb._docs,
                data=[term],
                anns_field="sparse",
                limit=16_384,
                output_fields=["seq"],
                search_params={"metric_type": "BM25"},
            )
            return len(hits)

        started = time.perf_counter()
        one_each = {t: search_one(t) for t in terms}
        per_term = time.perf_counter() - started
        others = lexical.query_terms(query())
        started = time.perf_counter()
        batched_counts = kb._count_terms(others)
        batched = time.perf_counter() - started
        assert all(v >= 0 for v in batched_counts.values()) and one_each

        queries_vectors = vectors[: args.queries]
        searches: dict[str, Any] = {}
        for bound, collection in collections.items():
            batch = [query() for _ in range(args.queries)]
            before = (LOOKUPS.counted, LOOKUPS.past_bound)
            started = time.perf_counter()
            collection.search(queries_vectors, batch, 10)
            seconds = time.perf_counter() - started
            searches[str(bound)] = {
                "seconds": round(seconds, 2),
                "terms_counted": LOOKUPS.counted - before[0],
                "terms_past_bound": LOOKUPS.past_bound - before[1],
            }

        # a small search alone, then again and again while a batch counts its terms
        small = [next(fresh)]
        kb.search(vectors[:1], small, 10)  # its term cached: only the search is timed
        alone = []
        for _ in range(5):
            started = time.perf_counter()
            kb.search(vectors[:1], small, 10)
            alone.append(time.perf_counter() - started)
        batch = [query() for _ in range(args.queries)]
        heavy = threading.Thread(target=kb.search, args=(queries_vectors, batch, 10))
        during = []
        batch_started = time.perf_counter()
        heavy.start()
        while not during or heavy.is_alive():
            started = time.perf_counter()
            kb.search(vectors[:1], small, 10)
            during.append(time.perf_counter() - started)
        heavy.join()
        batch_s = time.perf_counter() - batch_started
        storage.close()
    print(
        json.dumps(
            {
                "uri": args.uri or "Milvus Lite 3.x (file)",
                "documents": len(texts),
                "one_query_of_64_terms": {
                    "per_term_s (baseline)": round(per_term, 2),
                    "batched_s": round(batched, 2),
                    "speed-up": round(per_term / batched, 1),
                },
                f"batch_of_{args.queries}_queries_by_bound": searches,
                "small_search_s": {
                    "batch_s (what it waited under the lock before)": round(batch_s, 2),
                    "alone_median": round(float(np.median(alone)), 3),
                    "during_a_batch_median": round(float(np.median(during)), 3),
                    "during_a_batch_max": round(max(during), 3),
                    "searches_during_the_batch": len(during),
                    "ratio_median": round(
                        float(np.median(during) / np.median(alone)), 2
                    ),
                },
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
