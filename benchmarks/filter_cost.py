"""What a metadata filter's scan costs on the local backend, and where it stops.

Builds two collection files (random vectors, no model): narrow metadata (5 keys a
document) and wide metadata (1,000 keys, ~16 KB a document, the worst legal shape),
then times ``CollectionStore.filter_seqs`` for three filters, in the same run both
ways a key can be looked up:

* json_each: one ``json_each`` scan (a parse of the metadata) per condition, what
  every key used before, and what keys a JSON path cannot name still use;
* path: ``json_type``/``json_extract`` by JSON path, one parse a row shared by
  every condition (SQLite's JSON cache), what every other key uses now.

It reports each time and the ratio json_each / path, then how long a costly filter
holds a worker when ``NORMCAL_FILTER_TIMEOUT_MS`` stops it (the deadline plus the
time to notice). Run niced on a shared machine::

    nice -n 10 python benchmarks/filter_cost.py
    nice -n 10 python benchmarks/filter_cost.py --narrow 5000 --wide 500 --repeat 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.collections import store as store_module  # noqa: E402
from app.collections.base import NewDocument  # noqa: E402
from app.collections.store import CollectionStore  # noqa: E402
from app.collections.store_files import build_store  # noqa: E402
from app.exceptions import FilterTimeoutError  # noqa: E402
from app.schemas.filters import Bounds, parse  # noqa: E402

DIM = 8
BATCH = 500
FILTERS: dict[str, dict[str, Any]] = {
    "1 condition": {"key0001": 1},
    "63 conditions, $or, none match": {"$or": [{f"missing{i}": i} for i in range(62)]},
    "64 conditions, $and, all match": {
        "$and": [{f"key{i % 5:04d}": {"$gte": 0}} for i in range(63)]
    },
}


def _file(folder: Path, name: str, docs: int, keys: int) -> Path:
    path = folder / f"{name}.sqlite3"
    build_store(path, {"name": name, "model": "m", "dim": DIM}, synchronous="OFF")
    store = CollectionStore(path, synchronous="OFF")
    metadata = {f"key{i:04d}": i for i in range(keys)}
    vector = np.ones(DIM, dtype=np.float32) / np.sqrt(DIM)
    for start in range(0, docs, BATCH):
        store.upsert(
            [
                NewDocument(f"d{i}", "text", metadata, vector, 1.0, 1, False)
                for i in range(start, min(docs, start + BATCH))
            ]
        )
    store.close()
    return path


@contextmanager
def _json_each_only() -> Iterator[None]:
    """Every key looked up by ``json_each``, as before JSON paths were used."""
    addressable = store_module._addressable
    store_module._addressable = lambda _: False
    try:
        yield
    finally:
        store_module._addressable = addressable


def _seconds(store: CollectionStore, raw: dict[str, Any], repeat: int) -> float:
    tree = parse(raw, Bounds())
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        store.filter_seqs(tree)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--narrow", type=int, default=20_000, help="documents, 5 keys")
    parser.add_argument("--wide", type=int, default=2_000, help="documents, 1000 keys")
    parser.add_argument("--repeat", type=int, default=3, help="median of this many")
    parser.add_argument("--timeout-ms", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="normcal-filter-cost-") as tmp:
        folder = Path(tmp)
        shapes = {
            f"{args.narrow} docs x 5 keys": _file(folder, "narrow", args.narrow, 5),
            f"{args.wide} docs x 1000 keys": _file(folder, "wide", args.wide, 1000),
        }
        print(
            f"{'collection':<24} {'filter':<32} {'json_each s':>11} {'path s':>9} "
            f"{'ratio':>6}"
        )
        for shape, path in shapes.items():
            store = CollectionStore(path, synchronous="OFF")
            for name, raw in FILTERS.items():
                with _json_each_only():
                    before = _seconds(store, raw, args.repeat)
                now = _seconds(store, raw, args.repeat)
                print(
                    f"{shape:<24} {name:<32} {before:>11.3f} {now:>9.3f} "
                    f"{before / now:>6.1f}"
                )
            store.close()
        wide = shapes[f"{args.wide} docs x 1000 keys"]
        bounded = CollectionStore(
            wide, synchronous="OFF", filter_timeout_ms=args.timeout_ms
        )
        tree = parse(FILTERS["63 conditions, $or, none match"], Bounds())
        with _json_each_only():
            started = time.perf_counter()
            try:
                bounded.filter_seqs(tree)
                outcome = "finished"
            except FilterTimeoutError:
                outcome = "stopped"
            held = time.perf_counter() - started
        bounded.close()
        print(
            f"deadline {args.timeout_ms} ms, costly json_each filter on the wide "
            f"collection: {outcome} after {held:.3f} s"
        )


if __name__ == "__main__":
    main()
