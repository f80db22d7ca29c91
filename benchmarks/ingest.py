"""Ingest throughput and search latency: HTTP API vs in-process baselines, one run.

1. Ingest: N scifact abstracts through ``PUT .../documents`` of a real server
   subprocess (loopback), against raw ``SentenceTransformer.encode`` of the same texts
   in this process. Both are measured here, now; the ratio is what counts.
2. Search: p50/p99 latency of ``POST .../search`` (k=10) over HTTP on a collection of
   10k documents (npl abstracts), against in-process embed + FAISS search of the same
   queries on the same vectors.

``--modes`` names the server configurations (``benchmarks/servers.py``: backend,
precision, threads per pass), each measured against the same raw encode of this run
(measured before and after the servers; the mean is the baseline). Ingest is also
given in CPU seconds per document (the server process's, and this process's for the
raw encode), which a busy machine blurs less than wall time. For a mode that is not
fp32, the server's norms and vectors of the first 256 abstracts (``/v1/embed``) are
compared with the fp32 pipeline's in this process (gate: norms within 0.5%, cosine
>= 0.9999). The ONNX graph is exported once before timing (``NORMCAL_ONNX_PATH``).
``--search-docs 0`` skips the search part.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/ingest.py [--docs 2000]
[--modes torch/fp32/t0,torch,onnx]``. Needs ``../shared/data`` (scifact, npl) beside
the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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

from app.cli.inputs import read_corpus  # noqa: E402
from app.cli.main import ingest_documents  # noqa: E402
from app.cli.process import ServerProcess  # noqa: E402
from app.settings import default_model_path  # noqa: E402
from benchmarks.servers import mode_env, process_cpu_seconds, uses_onnx  # noqa: E402

DATA = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))


def percentile_ms(samples: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples) * 1000.0, q))


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bench_raw(model, docs: list[dict]) -> tuple[float, float]:
    """Wall and CPU seconds of raw ``SentenceTransformer.encode`` of the docs."""
    texts = [d["text"] for d in docs]
    model.encode(texts[:64], batch_size=32)  # warm-up
    started, cpu = time.perf_counter(), _cpu()
    model.encode(texts, batch_size=32)
    return time.perf_counter() - started, _cpu() - cpu


def bench_ingest(
    server: ServerProcess, raw: tuple[float, float], docs: list[dict]
) -> dict[str, float]:
    assert server.proc is not None
    with NormcalClient(server.url, timeout=1800) as client:
        ingest_documents(client, "warmup", docs[:64], progress=False)
        cpu = process_cpu_seconds(server.proc.pid)
        http = ingest_documents(client, "ingest", docs, progress=False).seconds
        cpu = process_cpu_seconds(server.proc.pid) - cpu
    return {
        "docs": len(docs),
        "raw_docs_per_s": len(docs) / raw[0],
        "raw_cpu_ms_per_doc": raw[1] / len(docs) * 1000,
        "http_docs_per_s": len(docs) / http,
        "http_cpu_ms_per_doc": cpu / len(docs) * 1000,
        "ratio": raw[0] / http,
        "cpu_ratio": raw[1] / cpu,
    }


def bench_agreement(server: ServerProcess, reference, docs: list[dict]) -> str:
    """The server's embeddings of the docs against ``reference`` (fp32, in-process)."""
    from app.embedding.base import EmbeddingBatch
    from app.embedding.precision import Agreement

    texts = [d["text"] for d in docs]
    with httpx.Client(base_url=server.url, timeout=1800) as client:
        r = client.post("/v1/embed", json={"texts": texts, "input_type": "document"})
        r.raise_for_status()
        data = r.json()["data"]
    got = EmbeddingBatch(
        vectors=np.array([d["embedding"] for d in data], dtype=np.float32),
        norms=np.array([d["norm"] for d in data]),
        n_tokens=np.array([d["n_tokens"] for d in data], dtype=np.int64),
        truncated=np.array([d["truncated"] for d in data]),
    )
    agreement = Agreement.between(reference.embed(texts, "document"), got)
    verdict = agreement.failure() or "within the gate"
    return f"{len(texts)} abstracts vs fp32: {agreement}, {verdict}"


def bench_search(
    server: ServerProcess, model, docs: list[dict], queries: list[str]
) -> dict:
    import faiss

    with NormcalClient(server.url, timeout=1800) as nc:
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


def print_ingest(mode: str, ingest: dict[str, float]) -> None:
    print(
        f"| normcal HTTP PUT /documents, {mode} (embed + SQLite + FAISS) "
        f"| {ingest['http_docs_per_s']:.1f} | **{ingest['ratio']:.2f}** "
        f"| {ingest['http_cpu_ms_per_doc']:.1f} | **{ingest['cpu_ratio']:.2f}** |"
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
    parser.add_argument(
        "--modes",
        default="torch/fp32/t0,torch",
        help="server configurations (benchmarks/servers.py), e.g. torch/fp32/t0 "
        "(the previous default), torch (the default: auto precision, 1 thread), onnx",
    )
    parser.add_argument(
        "--raw-threads",
        type=int,
        default=0,
        help="torch threads of the in-process baselines; 0: one per core (torch's "
        "default)",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="also write results here"
    )
    args = parser.parse_args()
    if not (DATA / "scifact" / "corpus.jsonl").exists():
        print(f"needs {DATA}/scifact and {DATA}/npl", file=sys.stderr)
        return 2

    from sentence_transformers import SentenceTransformer

    backends = args.modes.split(",")
    print(f"load average at the start: {os.getloadavg()[0]:.1f}", flush=True)
    model = SentenceTransformer(default_model_path(), device="cpu")
    reference = None
    if any(mode_env(m).get("NORMCAL_EMBED_PRECISION") != "fp32" for m in backends):
        from app.api.lifespan import load_embedder
        from app.settings import Settings

        reference = load_embedder(Settings(embed_precision="fp32"))
    import torch

    # The raw baselines' threads (loading the reference set them to 1).
    torch.set_num_threads(args.raw_threads or os.cpu_count() or 1)
    scifact = list(read_corpus(DATA / "scifact", args.docs))
    npl = list(read_corpus(DATA / "npl", args.search_docs)) if args.search_docs else []
    with (DATA / "npl" / "queries.jsonl").open() as fh:
        queries = [json.loads(line)["text"] for line in fh]
    queries = (queries * (args.queries // len(queries) + 1))[: args.queries]

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        onnx_dir = None
        if uses_onnx(backends):
            from app.embedding.onnx_export import export_onnx

            onnx_dir = export_onnx(default_model_path(), Path(tmp) / "onnx")
        before = bench_raw(model, scifact)
        for i, backend in enumerate(backends):
            env = mode_env(backend, onnx_dir)
            server = ServerProcess(Path(tmp) / f"mode{i}", env=env).start(timeout=600)
            try:
                out: dict = {"ingest": bench_ingest(server, before, scifact)}
                if (
                    reference is not None
                    and env.get("NORMCAL_EMBED_PRECISION") != "fp32"
                ):
                    out["agreement"] = bench_agreement(server, reference, scifact[:256])
                if npl:
                    out["search"] = bench_search(server, model, npl, queries)
            finally:
                server.stop()
            results[backend] = out
        after = bench_raw(model, scifact)
        raw = ((before[0] + after[0]) / 2, (before[1] + after[1]) / 2)
        for out in results.values():  # against the mean of the two raw runs
            out["ingest"]["raw_seconds_before_after"] = [before[0], after[0]]
            http_s = out["ingest"]["docs"] / out["ingest"]["http_docs_per_s"]
            http_cpu = out["ingest"]["http_cpu_ms_per_doc"] * out["ingest"]["docs"]
            out["ingest"].update(
                raw_docs_per_s=len(scifact) / raw[0],
                raw_cpu_ms_per_doc=raw[1] / len(scifact) * 1000,
                ratio=raw[0] / http_s,
                cpu_ratio=raw[1] * 1000 / http_cpu,
            )

    print(
        f"in-process baselines: torch threads={__import__('torch').get_num_threads()}, "
        f"cores={os.cpu_count()}, "
        f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    first = results[backends[0]]["ingest"]
    print(
        f"\n| ingest ({first['docs']} scifact abstracts) | docs/s | ratio to raw "
        "| CPU ms/doc | CPU ratio to raw |"
    )
    print("|---|---|---|---|---|")
    print(
        f"| raw SentenceTransformer.encode (fp32, batch 32; mean of the runs before "
        f"and after) | {first['raw_docs_per_s']:.1f} | 1.00 "
        f"| {first['raw_cpu_ms_per_doc']:.1f} | 1.00 |"
    )
    for backend in backends:
        print_ingest(backend, results[backend]["ingest"])
    for backend in backends:
        if "agreement" in results[backend]:
            print(f"\n{backend}: {results[backend]['agreement']}")
    for backend in backends:
        if "search" in results[backend]:
            print_search(backend, results[backend]["search"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
