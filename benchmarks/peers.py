"""normcal against its peers, same model, interleaved in one run.

Every system embeds with the same local all-MiniLM-L6-v2 (nothing is downloaded):
normcal embeds in its server (``--modes``, see ``benchmarks/servers.py``); each peer
gets its vectors from sentence-transformers in the client process (fp32, as
``SentenceTransformer.encode`` runs by default, with ``--peer-threads`` torch
threads) and stores and searches them itself:

- ``raw``: sentence-transformers + FAISS ``IndexFlatIP`` in-process (no storage);
- ``chroma``: Chroma embedded (``PersistentClient``, cosine HNSW);
- ``qdrant``: Qdrant local mode (``QdrantClient(path=...)``, cosine);
- ``milvus``: Milvus Lite (``MilvusClient("file.db")``, cosine ``FLAT``).

Each system runs in a fresh subprocess (its CPU time is its own: the child's, plus
for normcal its server's) and does, in order: ingest ``--docs`` scifact abstracts
in batches of 128 (docs/s, CPU seconds per document); ``--queries`` searches (k=10)
one at a time, each query seen for the first time (cold), then the same again (hot);
then ``--requests`` searches from 4 and from 16 concurrent clients (req/s). Systems
are interleaved: round 1 runs every one, then round 2 again, ...; figures are
medians over rounds. Needs the ``bench`` extra (``make install EXTRAS=bench``:
chromadb, qdrant-client, and Milvus Lite) and ``../shared/data/scifact``.

A second table holds each normcal mode's cold search against ``raw`` in-process
(sentence-transformers + FAISS in the client's process), side by side, round by
round: cold p50 and p99 as ratios to raw's, with issue 36's targets (p50 ≤ 1,
p99 ≤ 1.2). The header names the CPU and its kind (AMX, ``avx512_bf16`` without
AMX, or neither): run it on each kind of machine. A ``noamx`` mode
(``benchmarks/servers.py``) runs the AMX-less kernels on a CPU with AMX, which shows
their behaviour, not that CPU's figures.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/peers.py [--docs 2000]
[--rounds 2] [--out docs/peers.md]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DATA = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))
PEERS = ("raw", "chroma", "qdrant", "milvus")
BATCH = 128
K = 10


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _texts(n: int, dataset: str = "scifact") -> tuple[list[dict], list[str]]:
    """The first ``n`` documents and every query text of a shared set."""
    from app.cli.inputs import read_corpus

    docs = list(read_corpus(DATA / dataset, n))
    with (DATA / dataset / "queries.jsonl").open() as fh:
        qs = [json.loads(line)["text"] for line in fh]
    return docs, qs


class Peer:
    """A store fed with vectors from sentence-transformers in this process."""

    def __init__(self, name: str, tmp: Path, threads: int) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        from app.settings import default_model_path

        torch.set_num_threads(threads)
        self.model = SentenceTransformer(default_model_path(), device="cpu")
        self.name, self.tmp = name, tmp
        self.add, self.search = getattr(self, f"_open_{name}")()

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.asarray(
            self.model.encode(texts, batch_size=32, normalize_embeddings=True),
            dtype=np.float32,
        )

    def ingest(self, docs: list[dict]) -> None:
        for i in range(0, len(docs), BATCH):
            chunk = docs[i : i + BATCH]
            self.add(chunk, self.encode([d["text"] for d in chunk]))

    def query(self, text: str) -> None:
        self.search(self.encode([text])[0])

    def _open_raw(self) -> tuple[Callable, Callable]:
        import faiss

        index = faiss.IndexIDMap2(faiss.IndexFlatIP(384))
        texts: dict[int, str] = {}

        def add(chunk: list[dict], vectors: np.ndarray) -> None:
            ids = np.arange(len(texts), len(texts) + len(chunk), dtype=np.int64)
            texts.update(zip(ids.tolist(), (d["text"] for d in chunk), strict=True))
            index.add_with_ids(vectors, ids)

        def search(vector: np.ndarray) -> None:
            _, ids = index.search(vector[None, :], K)
            for i in ids[0]:  # fetch the hits' texts, as the others return them
                texts.get(int(i))

        return add, search

    def _open_chroma(self) -> tuple[Callable, Callable]:
        import chromadb
        from chromadb.config import Settings

        client = chromadb.PersistentClient(
            str(self.tmp / "chroma"), settings=Settings(anonymized_telemetry=False)
        )
        coll = client.create_collection(
            "bench", embedding_function=None, metadata={"hnsw:space": "cosine"}
        )

        def add(chunk: list[dict], vectors: np.ndarray) -> None:
            coll.add(
                ids=[d["id"] for d in chunk],
                embeddings=vectors,
                documents=[d["text"] for d in chunk],
            )

        def search(vector: np.ndarray) -> None:
            coll.query(query_embeddings=[vector], n_results=K)

        return add, search

    def _open_qdrant(self) -> tuple[Callable, Callable]:
        from qdrant_client import QdrantClient, models

        client = QdrantClient(path=str(self.tmp / "qdrant"))
        client.create_collection(
            "bench",
            vectors_config=models.VectorParams(
                size=384, distance=models.Distance.COSINE
            ),
        )
        counter = iter(range(10**9))

        def add(chunk: list[dict], vectors: np.ndarray) -> None:
            points = [
                models.PointStruct(id=next(counter), vector=v.tolist(), payload=d)
                for d, v in zip(chunk, vectors, strict=True)
            ]
            client.upsert("bench", points=points, wait=True)

        def search(vector: np.ndarray) -> None:
            client.query_points("bench", query=vector.tolist(), limit=K)

        return add, search

    def _open_milvus(self) -> tuple[Callable, Callable]:
        from pymilvus import MilvusClient

        client = MilvusClient(str(self.tmp / "milvus.db"))
        client.create_collection(
            "bench", dimension=384, metric_type="COSINE", auto_id=True
        )

        def add(chunk: list[dict], vectors: np.ndarray) -> None:
            rows = [
                {"vector": v.tolist(), "text": d["text"]}
                for d, v in zip(chunk, vectors, strict=True)
            ]
            client.insert("bench", rows)

        def search(vector: np.ndarray) -> None:
            client.search(
                "bench", data=[vector.tolist()], limit=K, output_fields=["text"]
            )

        return add, search


class Normcal:
    """A ``normcal serve`` subprocess in one configuration, over HTTP."""

    def __init__(self, mode: str, tmp: Path) -> None:
        import httpx

        from app.cli.process import ServerProcess
        from benchmarks.servers import mode_env

        onnx = tmp.parent / "onnx" if "onnx" in mode.split("/") else None
        self.server = ServerProcess(tmp / "data", env=mode_env(mode, onnx))
        self.server.start(timeout=600)
        assert self.server.proc is not None
        self.pid = self.server.proc.pid
        self.client = httpx.Client(base_url=self.server.url, timeout=1800)
        self.client.post("/v1/collections", json={"name": "bench"}).raise_for_status()
        # What the server runs: its precision and, with auto, which traced graph.
        embedding = self.client.get("/version").json()["embedding"]
        ran = [p for p in embedding["reason"].split("; ") if p.startswith("texts run")]
        self.embedding = "; ".join([embedding["precision"], *ran])
        self.local = threading.local()
        self.url = self.server.url

    def ingest(self, docs: list[dict]) -> None:
        for i in range(0, len(docs), BATCH):
            chunk = [{"id": d["id"], "text": d["text"]} for d in docs[i : i + BATCH]]
            self.client.put(
                "/v1/collections/bench/documents", json={"documents": chunk}
            ).raise_for_status()

    def query(self, text: str) -> None:
        import httpx

        client = getattr(self.local, "client", None)
        if client is None:  # one connection per client thread
            client = self.local.client = httpx.Client(base_url=self.url, timeout=600)
        client.post(
            "/v1/collections/bench/search", json={"query": text, "k": K}
        ).raise_for_status()

    def stop(self) -> None:
        self.client.close()
        self.server.stop()


def child(system: str, args: argparse.Namespace) -> dict:
    """Measure one system in this (fresh) process."""
    from benchmarks.servers import process_cpu_seconds

    docs, queries = _texts(args.docs)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        is_normcal = system.startswith("normcal")
        target = (
            Normcal(system.partition(":")[2], Path(tmp))
            if is_normcal
            else Peer(system, Path(tmp), args.peer_threads)
        )

        def cpu() -> float:
            server = process_cpu_seconds(target.pid) if is_normcal else 0.0
            return _cpu() + server

        target.ingest(docs[:BATCH])  # warm-up (and a first batch stored)
        rest = docs[BATCH:]
        c0, w0 = cpu(), time.perf_counter()
        target.ingest(rest)
        wall, spent = time.perf_counter() - w0, cpu() - c0
        out: dict = {
            "ingest_docs_per_s": len(rest) / wall,
            "ingest_cpu_ms_per_doc": spent / len(rest) * 1000,
        }
        for label in ("cold", "hot"):  # the same queries: first seen, then again
            latencies = []
            for q in queries[: args.queries]:
                started = time.perf_counter()
                target.query(q)
                latencies.append((time.perf_counter() - started) * 1000)
            out[f"{label}_p50_ms"] = float(np.percentile(latencies, 50))
            out[f"{label}_p99_ms"] = float(np.percentile(latencies, 99))
        for clients in (4, 16):
            batch = [queries[i % len(queries)] for i in range(args.requests)]
            started = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                list(pool.map(target.query, batch))
            out[f"rps_{clients}"] = len(batch) / (time.perf_counter() - started)
        if is_normcal:
            out["embedding"] = target.embedding
            target.stop()
    return out


def _versions() -> str:
    names = [
        "normcal",
        "torch",
        "sentence-transformers",
        "onnxruntime",
        "faiss-cpu",
        "chromadb",
        "qdrant-client",
        "pymilvus",
        "milvus-lite",
    ]
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def _machine() -> str:
    model, flags = platform.processor() or "?", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
            elif line.startswith("flags"):
                flags = set(line.partition(":")[2].split())
    except OSError:
        pass
    shown = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")
    have = ", ".join(f for f in shown if f in flags) or "none of interest"
    return f"{model}, {os.cpu_count()} cores, {cpu_kind(flags)}, flags: {have}"


def cpu_kind(flags: set[str]) -> str:
    """The kind of CPU issue 36's cold targets are checked on."""
    if "amx_bf16" in flags:
        return "a CPU with AMX (amx_bf16)"
    if "avx512_bf16" in flags:
        return "a CPU with avx512_bf16 and no AMX"
    return "a CPU without native bf16"


def table(results: dict[str, list[dict]], header: str) -> str:
    cols = [
        ("ingest docs/s", "ingest_docs_per_s", "{:.1f}"),
        ("ingest CPU ms/doc", "ingest_cpu_ms_per_doc", "{:.1f}"),
        ("search p50 cold ms", "cold_p50_ms", "{:.1f}"),
        ("p99 cold ms", "cold_p99_ms", "{:.1f}"),
        ("search p50 hot ms", "hot_p50_ms", "{:.1f}"),
        ("p99 hot ms", "hot_p99_ms", "{:.1f}"),
        ("4 clients req/s", "rps_4", "{:.1f}"),
        ("16 clients req/s", "rps_16", "{:.1f}"),
    ]
    lines = [header, "", "| system | " + " | ".join(c[0] for c in cols) + " |"]
    lines.append("|---" * (len(cols) + 1) + "|")
    for system, runs in results.items():
        cells = [
            fmt.format(float(np.median([r[key] for r in runs]))) for _, key, fmt in cols
        ]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    return "\n".join(lines + cold_against_raw(results))


COLD_TARGETS = {"cold_p50_ms": 1.0, "cold_p99_ms": 1.2}


def cold_against_raw(results: dict[str, list[dict]]) -> list[str]:
    """Each normcal mode's cold p50 and p99 over raw's, per round, then the median."""
    if "raw" not in results:
        return []
    lines = [
        "",
        "| system | cold p50 / raw's | cold p99 / raw's | target p50 ≤ 1, p99 ≤ 1.2 |",
        "|---|---|---|---|",
    ]
    for system, runs in results.items():
        if not system.startswith("normcal"):
            continue
        ratios = {
            key: float(
                np.median(
                    [
                        r[key] / raw[key]
                        for r, raw in zip(runs, results["raw"], strict=True)
                    ]
                )
            )
            for key in COLD_TARGETS
        }
        met = all(ratios[key] <= bound for key, bound in COLD_TARGETS.items())
        lines.append(
            f"| {system} | {ratios['cold_p50_ms']:.2f} | {ratios['cold_p99_ms']:.2f} "
            f"| {'met' if met else 'missed'} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--requests", type=int, default=200, help="per client level")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--modes",
        default="torch/fp32,torch,onnx",
        help="normcal configurations (benchmarks/servers.py)",
    )
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument(
        "--peer-threads", type=int, default=1, help="torch threads of the peers"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the table here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args)))
        return 0
    if not (DATA / "scifact" / "corpus.jsonl").exists():
        print(f"needs {DATA}/scifact", file=sys.stderr)
        return 2
    systems = [f"normcal:{m}" for m in args.modes.split(",")]
    systems += [p for p in args.peers.split(",") if p]
    load_before = os.getloadavg()
    results: dict[str, list[dict]] = {s: [] for s in systems}
    with tempfile.TemporaryDirectory() as tmp:
        if any("onnx" in s.split("/") for s in systems):
            from app.embedding.onnx_export import export_onnx
            from app.settings import default_model_path

            export_onnx(default_model_path(), Path(tmp) / "onnx")
        for r in range(args.rounds):
            for system in systems:
                cmd = [sys.executable, __file__, "--child", system, "--tmp", tmp]
                for flag in ("docs", "queries", "requests", "peer_threads"):
                    cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
                done = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    print(done.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"{system} failed in round {r + 1}")
                results[system].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"round {r + 1}: {system} {results[system][-1]}", flush=True)
    header = (
        f"`benchmarks/peers.py --docs {args.docs} --queries {args.queries} "
        f"--requests {args.requests} --rounds {args.rounds} --modes {args.modes} "
        f"--peer-threads {args.peer_threads}`, "
        f"{datetime.now(UTC):%Y-%m-%d}; {_machine()}; load average "
        f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after; {_versions()}. "
        f"Medians over {args.rounds} interleaved rounds."
    )
    text = table(results, header)
    print("\n" + text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
