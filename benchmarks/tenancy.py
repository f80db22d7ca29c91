"""Many normcal collections in one Milvus: listing, start-up and shared BM25 statistics.

Two measurements on Milvus Lite 3.x (a file under a temporary directory):

* **listing** (``--collections``, default 500): that many empty collections created
  through the storage layer in the shared layout (``NORMCAL_MILVUS_LAYOUT=shared``),
  then ``names()`` and a restart (a new registry's ``load``, which opens them all);
  the per-collection layout the same way for ``--per-collection`` collections
  (default 50: each creates two Milvus collections and waits on their index builds).
* **bm25** (``--docs``, ``--neighbours``, ``--queries``): through the HTTP API with
  the real model, collection ``kb`` (the first ``--docs`` scifact abstracts) is
  searched (hybrid, k=10) alone in the shared Milvus collections, then again once
  a neighbour tenant holds ``--neighbours`` documents, once from another domain
  (cranfield, aeronautics) and once from the same one (later scifact abstracts).
  Milvus's BM25 statistics (IDF, average length) are per Milvus collection, so the
  neighbour moves ``kb``'s BM25, hence its ``lex`` feature (BM25 over the query's
  IDF mass, which normcal counts in ``kb`` alone: the two move by the same ratio)
  and its probabilities. Reported: the median and largest relative change of BM25
  and the mean and largest absolute change of a probability, over the hits both
  runs return.

Run::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/tenancy.py
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/tenancy.py --skip-bm25 --collections 2000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from app.collections.milvus_layout import LayoutName

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
DATA = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))


def _load(data: dict[str, Any]) -> Any:
    return data


def listing(layout: LayoutName, count: int, where: Path) -> dict[str, float]:
    """Seconds to create ``count`` collections, list them, and load them at start-up."""
    from app.collections.milvus import MilvusStorage
    from app.collections.milvus_layout import layout_of
    from app.collections.milvus_registry import MilvusRegistry

    uri = str(where / f"{layout}.db")
    storage: MilvusStorage[Any] = MilvusStorage(uri, _load, layout=layout_of(layout))
    started = time.perf_counter()
    for i in range(count):
        storage.create(f"kb-{i:05d}", {"model": "m", "dim": 8, "created_at": 0.0})
    created = time.perf_counter() - started
    started = time.perf_counter()
    assert len(storage.names()) == count
    listed = time.perf_counter() - started
    storage.close()
    registry: MilvusRegistry[Any] = MilvusRegistry(
        uri,
        token="",
        model_name="m",
        dim=8,
        load_calibrator=_load,
        layout=layout,
    )
    started = time.perf_counter()
    registry.load()
    loaded = time.perf_counter() - started
    assert len(registry.names()) == count
    registry.close()
    return {"create_s": created, "names_s": listed, "load_s": loaded}


def _hits(
    client: Any, queries: list[str]
) -> dict[tuple[int, str], tuple[float, float]]:
    """``(query, id) -> (bm25, probability)`` of ``kb``'s hybrid top 10."""
    out: dict[tuple[int, str], tuple[float, float]] = {}
    for start in range(0, len(queries), 16):
        body = {"queries": queries[start : start + 16], "k": 10, "mode": "hybrid"}
        r = client.post("/v1/collections/kb/search", json=body)
        assert r.status_code == 200, r.text
        for offset, result in enumerate(r.json()["results"]):
            for hit in result["hits"]:
                out[(start + offset, hit["id"])] = (hit["bm25"], hit["probability"])
    return out


def _moves(
    before: dict[tuple[int, str], tuple[float, float]],
    after: dict[tuple[int, str], tuple[float, float]],
) -> dict[str, float]:
    both = [k for k in before if k in after]
    rel = [
        abs(after[k][0] - before[k][0]) / before[k][0] for k in both if before[k][0] > 0
    ]
    prob = [abs(after[k][1] - before[k][1]) for k in both]
    return {
        "hits_compared": len(both),
        "hits_total": len(before),
        "bm25_rel_median": float(np.median(rel)),
        "bm25_rel_max": float(np.max(rel)),
        "prob_abs_mean": float(np.mean(prob)),
        "prob_abs_max": float(np.max(prob)),
    }


def _upload(client: Any, name: str, docs: list[dict[str, Any]]) -> None:
    assert client.post("/v1/collections", json={"name": name}).status_code == 201
    for start in range(0, len(docs), 128):
        batch = [{"id": d["id"], "text": d["text"]} for d in docs[start : start + 128]]
        r = client.put(f"/v1/collections/{name}/documents", json={"documents": batch})
        assert r.status_code == 200, r.text


def neighbours(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """``--neighbours`` documents, other domain (cranfield) and same (scifact)."""
    from app.cli.inputs import read_corpus

    scifact = list(read_corpus(DATA / "scifact", args.docs + args.neighbours))
    return {
        "kb": scifact[: args.docs],
        "other domain (cranfield)": list(
            read_corpus(DATA / "cranfield", args.neighbours)
        ),
        "same domain (scifact)": scifact[args.docs :],
    }


def bm25(args: argparse.Namespace, where: Path) -> dict[str, dict[str, float]]:
    """How much neighbour tenants move ``kb``'s BM25 and probabilities (Lite 3.x).

    The neighbours' documents are spread over ``--tenants`` collections, so that
    some share ``kb``'s partition (tenants hash to :data:`PARTITIONS` of them).
    """
    from fastapi.testclient import TestClient

    from app.api.app import create_app
    from app.cli.inputs import read_queries
    from app.settings import Settings

    corpora = neighbours(args)
    kb = corpora.pop("kb")
    queries = list(read_queries(DATA / "scifact").values())[: args.queries]
    out: dict[str, dict[str, float]] = {}
    for i, (label, docs) in enumerate(corpora.items()):
        (where / f"bm25-{i}").mkdir()
        settings = Settings(
            data_dir=where / f"bm25-{i}" / "data",
            storage="milvus",
            milvus_uri=str(where / f"bm25-{i}" / "milvus.db"),
            milvus_layout="shared",
        )
        with TestClient(create_app(settings)) as client:
            _upload(client, "kb", kb)
            alone = _hits(client, queries)
            for t in range(args.tenants):
                _upload(client, f"n{t}", docs[t :: args.tenants])
            out[label] = _moves(alone, _hits(client, queries))
    return out


def engine_bm25(args: argparse.Namespace, binary: Path, where: Path) -> dict[str, Any]:
    """The same on the real engine (milvus-lite 2.5.1 over TCP), BM25 only.

    Milvus Lite 2.5.1 cannot filter a partition-key collection, so ``tenant`` is a
    plain field here: the statistics are the collection's either way on a server
    whose BM25 statistics are per collection, which this measures; normcal's
    probabilities need its own search path, which needs ``text_match`` there.
    """
    from pymilvus import DataType, Function, FunctionType, MilvusClient

    from app.cli.inputs import read_queries
    from tests.support.milvus_engine import engine_server

    corpora = neighbours(args)
    kb = corpora.pop("kb")
    queries = list(read_queries(DATA / "scifact").values())[: args.queries]
    out: dict[str, Any] = {}
    for i, (label, docs) in enumerate(corpora.items()):
        with engine_server(binary, where / f"engine-{i}") as uri:
            client = MilvusClient(uri=uri)
            schema = MilvusClient.create_schema(auto_id=True)
            schema.add_field("pk", DataType.INT64, is_primary=True)
            schema.add_field("tenant", DataType.VARCHAR, max_length=64)
            schema.add_field("doc", DataType.VARCHAR, max_length=128)
            schema.add_field(
                "text", DataType.VARCHAR, max_length=65_535, enable_analyzer=True
            )
            schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
            schema.add_field("v", DataType.FLOAT_VECTOR, dim=2)
            schema.add_function(
                Function(
                    name="bm25",
                    function_type=FunctionType.BM25,
                    input_field_names=["text"],
                    output_field_names=["sparse"],
                )
            )
            index = client.prepare_index_params()
            index.add_index("v", index_type="FLAT", metric_type="IP")
            index.add_index(
                "sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25"
            )
            client.create_collection(
                "t", schema=schema, index_params=index, consistency_level="Strong"
            )

            def insert(client: Any, tenant: str, rows: list[dict[str, Any]]) -> None:
                for start in range(0, len(rows), 256):
                    client.insert(
                        "t",
                        [
                            {
                                "tenant": tenant,
                                "doc": d["id"],
                                "text": d["text"][:60_000],
                                "v": [1.0, 0.0],
                            }
                            for d in rows[start : start + 256]
                        ],
                    )

            def scores(client: Any) -> dict[tuple[int, str], float]:
                found = client.search(
                    "t",
                    data=queries,
                    anns_field="sparse",
                    limit=10,
                    filter='tenant == "kb"',
                    output_fields=["doc"],
                    search_params={"metric_type": "BM25"},
                )
                return {
                    (q, h["entity"]["doc"]): abs(float(h["distance"]))
                    for q, hits in enumerate(found)
                    for h in hits
                }

            insert(client, "kb", kb)
            alone = scores(client)
            insert(client, "neighbour", docs)
            after = scores(client)
            client.close()
        both = [k for k in alone if k in after and alone[k] > 0]
        rel = [abs(after[k] - alone[k]) / alone[k] for k in both]
        out[label] = {
            "hits_compared": len(both),
            "hits_total": len(alone),
            "bm25_rel_median": float(np.median(rel)),
            "bm25_rel_max": float(np.max(rel)),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--collections", type=int, default=500)
    parser.add_argument("--per-collection", type=int, default=50)
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--neighbours", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=64)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--skip-bm25", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        runs: list[tuple[LayoutName, int]] = [
            ("shared", args.collections),
            ("per-collection", args.per_collection),
        ]
        for layout, count in runs:
            figures = listing(layout, count, where)
            print(
                f"{layout:>14} x{count}: create {figures['create_s']:.1f} s "
                f"({1000 * figures['create_s'] / count:.0f} ms each), names() "
                f"{figures['names_s']:.3f} s, start-up load {figures['load_s']:.3f} s"
            )
        if args.skip_bm25:
            return
        for label, moves in bm25(args, where).items():
            print(
                f"Lite 3.x: kb ({args.docs} docs) + {args.neighbours} docs in "
                f"{args.tenants} tenants, {label}: {moves['hits_compared']}/"
                f"{moves['hits_total']} hits in both; BM25 moved "
                f"{100 * moves['bm25_rel_median']:.1f}% median, "
                f"{100 * moves['bm25_rel_max']:.1f}% max; probability "
                f"{moves['prob_abs_mean']:.4f} mean, {moves['prob_abs_max']:.4f} max"
            )
        from tests.support.milvus_engine import engine_binary

        binary = engine_binary()
        if binary is None:
            print("real engine: not installed (make .venv-milvus-engine/.installed)")
            return
        for label, moves in engine_bm25(args, binary, where).items():
            print(
                f"engine 2.5.1: kb ({args.docs} docs) + {args.neighbours} docs of "
                f"one neighbour, {label}: {moves['hits_compared']}/"
                f"{moves['hits_total']} hits in both; BM25 moved "
                f"{100 * moves['bm25_rel_median']:.1f}% median, "
                f"{100 * moves['bm25_rel_max']:.1f}% max"
            )


if __name__ == "__main__":
    main()
