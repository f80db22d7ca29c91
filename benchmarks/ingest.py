"""Ingest throughput and search latency: HTTP API vs in-process baselines, one run.

1. Ingest: N scifact abstracts through ``PUT .../documents`` of a real server
   subprocess (loopback), against raw ``SentenceTransformer.encode`` of the same texts
   in this process. Both are measured here, now; the ratio is what counts.
2. Search: p50/p99 latency of ``POST .../search`` (k=10) over HTTP on a collection of
   10k documents (npl abstracts), against in-process embed + FAISS search of the same
   queries on the same vectors.

``--backend torch|onnx|both`` picks the server's embedding backend
(``NORMCAL_EMBEDDING_BACKEND``); each is measured against the same raw encode of
this run. The ONNX graph is exported once before timing (``NORMCAL_ONNX_PATH``).
``--search-docs 0`` skips the search part.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/ingest.py [--docs 2000] [--backend both]``.
Needs ``../shared/data`` (scifact, npl) beside the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from normcal_client import NormcalClient  # noqa: E402

from app.ops.beir import read_corpus  # noqa: E402
from app.ops.cli import ingest_documents  # noqa: E402
from app.ops.process import ServerProcess  # noqa: E402
from app.settings import default_model_path  # noqa: E402

DATA = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))


def percentile_ms(samples: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples) * 1000.0, q))


def bench_raw(model, docs: list[dict]) -> float:
    """Seconds of raw ``SentenceTransformer.encode`` of the docs' texts."""
    texts = [d["text"] for d in docs]
    model.encode(texts[:64], batch_size=32)  # warm-up
    started = time.perf_counter()
    model.encode(texts, batch_size=32)
    return time.perf_counter() - started


def bench_ingest(
    server: ServerProcess, raw: float, docs: list[dict]
) -> dict[str, float]:
    with NormcalClient(server.url, timeout=600) as client:
        ingest_documents(client, "warmup", docs[:64], progress=False)
        http = ingest_documents(client, "ingest", docs, progress=False).seconds
    return {
        "docs": len(docs),
        "raw_docs_per_s": len(docs) / raw,
        "http_docs_per_s": len(docs) / http,
        "ratio": raw / http,
    }


def bench_search(
    server: ServerProcess, model, docs: list[dict], queries: list[str]
) -> dict:
    import faiss

    with NormcalClient(server.url, timeout=600) as nc:
        ingest_documents(nc, "search10k", docs, progress=False)
    with httpx.Client(base_url=server.url, timeout=600) as client:
        http: list[float] = []
        for q in queries:
            started = time.perf_counter()
            r = client.post(
                "/v1/collections/search10k/search", json={"query": q, "k": 10}
            )
            http.append(time.perf_counter() - started)
            r.raise_for_status()
    vectors = model.encode(
        [d["text"] for d in docs], batch_size=64, normalize_embeddings=True
    )
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(vectors.shape[1]))
    index.add_with_ids(vectors.astype(np.float32), np.arange(len(docs), dtype=np.int64))
    local: list[float] = []
    for q in queries:
        started = time.perf_counter()
        v = model.encode([q], normalize_embeddings=True)
        index.search(v.astype(np.float32), 10)
        local.append(time.perf_counter() - started)
    out = {"documents": len(docs), "queries": len(queries)}
    for name, samples in (("http", http), ("in_process", local)):
        out[f"{name}_p50_ms"] = percentile_ms(samples, 50)
        out[f"{name}_p99_ms"] = percentile_ms(samples, 99)
    out["p50_ratio"] = out["http_p50_ms"] / out["in_process_p50_ms"]
    return out


def server_env(backend: str, onnx_dir: Path | None) -> dict[str, str]:
    env = {"NORMCAL_EMBEDDING_BACKEND": backend}
    if onnx_dir is not None:
        env["NORMCAL_ONNX_PATH"] = str(onnx_dir)
    return env


def print_ingest(backend: str, ingest: dict[str, float]) -> None:
    print(
        f"| normcal HTTP PUT /documents, {backend} backend (embed + SQLite + FAISS) "
        f"| {ingest['http_docs_per_s']:.1f} | **{ingest['ratio']:.2f}** |"
    )


def print_search(backend: str, search: dict) -> None:
    print(
        f"\n| search ({backend}), {search['documents']} npl docs, k=10, "
        f"{search['queries']} queries | p50 ms | p99 ms |"
    )
    print("|---|---|---|")
    print(
        f"| normcal HTTP POST /search | {search['http_p50_ms']:.1f} | {search['http_p99_ms']:.1f} |"
    )
    print(
        f"| in-process embed + FAISS | {search['in_process_p50_ms']:.1f} | {search['in_process_p99_ms']:.1f} |"
    )
    print(f"| **p50 ratio HTTP / in-process** | **{search['p50_ratio']:.2f}** | |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000, help="scifact docs to ingest")
    parser.add_argument("--search-docs", type=int, default=10_000, help="0: no search")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--backend", choices=("torch", "onnx", "both"), default="torch")
    parser.add_argument(
        "--json", type=Path, default=None, help="also write results here"
    )
    args = parser.parse_args()
    if not (DATA / "scifact" / "corpus.jsonl").exists():
        print(f"needs {DATA}/scifact and {DATA}/npl", file=sys.stderr)
        return 2

    from sentence_transformers import SentenceTransformer

    backends = ["torch", "onnx"] if args.backend == "both" else [args.backend]
    model = SentenceTransformer(default_model_path(), device="cpu")
    scifact = list(read_corpus(DATA / "scifact", args.docs))
    npl = list(read_corpus(DATA / "npl", args.search_docs)) if args.search_docs else []
    with (DATA / "npl" / "queries.jsonl").open() as fh:
        queries = [json.loads(line)["text"] for line in fh]
    queries = (queries * (args.queries // len(queries) + 1))[: args.queries]

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        onnx_dir = None
        if "onnx" in backends:
            from app.embedding.onnx_export import export_onnx

            onnx_dir = export_onnx(default_model_path(), Path(tmp) / "onnx")
        raw = bench_raw(model, scifact)
        for backend in backends:
            env = server_env(backend, onnx_dir if backend == "onnx" else None)
            server = ServerProcess(Path(tmp) / backend, env=env).start()
            try:
                out: dict = {"ingest": bench_ingest(server, raw, scifact)}
                if npl:
                    out["search"] = bench_search(server, model, npl, queries)
            finally:
                server.stop()
            results[backend] = out

    print(
        f"cpu threads: torch={__import__('torch').get_num_threads()}, cores={os.cpu_count()}, "
        f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    first = results[backends[0]]["ingest"]
    print(f"\n| ingest ({first['docs']} scifact abstracts) | docs/s | ratio to raw |")
    print("|---|---|---|")
    print(f"| raw SentenceTransformer.encode | {first['raw_docs_per_s']:.1f} | 1.00 |")
    for backend in backends:
        print_ingest(backend, results[backend]["ingest"])
    for backend in backends:
        if "search" in results[backend]:
            print_search(backend, results[backend]["search"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
