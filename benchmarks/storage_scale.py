"""Storage at scale: local (SQLite + FAISS) vs the Milvus engine vs Milvus Lite 3.x.

Each backend runs in its own subprocess on the same synthetic corpus, so peak RSS
is that backend's alone:

* **corpus** (synthetic, stated in the output): sentences of 30 words drawn from a
  Zipf-distributed vocabulary of 20,000 pseudo-words, vectors from a seeded
  generator (random unit directions, raw norms log-normal around 7, the range of
  all-MiniLM-L6-v2's unnormalised vectors), so 100k documents need no embedding;
* **ingest**: docs/s of ``upsert`` in batches of ``--batch`` through
  ``Collection.upsert`` (local) and ``MilvusCollection.upsert``;
* **search**: p50/p99 of one query per ``search`` call (k=10 pool, a filter-free
  hybrid pool: dense top-k plus the lexical part, as the service asks for it), the
  query vector a perturbed document vector and its text 2-5 corpus words;
* **memory**: peak RSS of the backend's process (``getrusage``), and for Milvus
  also of its server subprocess (``RUSAGE_CHILDREN`` once it has exited).

Three backends: ``local``; ``milvus-engine``, Milvus's C++ engine (milvus-lite 2.5.1's
server over TCP, from ``.venv-milvus-engine``, which ``make test`` builds; see
tests/support/milvus_engine.py); ``milvus``, Milvus Lite 3.x, a pure-Python engine
(FAISS + Parquet) whose every call is linear in the collection (a search took 32 s
at 100k): it runs on ``--lite-docs`` documents and ``--lite-queries`` queries,
which the output states.

Separately, the real model's per-node embedding throughput (torch backend,
``--embed-texts`` scifact abstracts when ``../shared/data`` has them, else the
synthetic sentences), so the plan in docs/storage.md (Scale) can combine the two.

Run::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/storage_scale.py              # 100k docs
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/storage_scale.py --docs 20000 --queries 50
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DIM = 384
VOCAB = 20_000
WORDS = 30
DATA = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))
BACKENDS = ("local", "milvus-engine", "milvus")


def vocabulary() -> list[str]:
    """Pronounceable pseudo-words: deterministic, distinct, tokenised as one term."""
    consonants, vowels = "bcdfghjklmnprstvz", "aeiou"
    words = []
    for i in range(VOCAB):
        word, n = "", i
        for _ in range(4):
            word += consonants[n % 17] + vowels[(n // 17) % 5]
            n //= 85
            if n == 0 and len(word) >= 4:
                break
        words.append(word)
    return words


class Corpus:
    """The seeded synthetic corpus: document ``i`` is the same in every process."""

    def __init__(self, seed: int = 0) -> None:
        self.words = np.array(vocabulary())
        weights = 1.0 / np.arange(1, VOCAB + 1) ** 1.07
        self.p = weights / weights.sum()
        self.seed = seed

    def batch(self, start: int, size: int) -> list[Any]:
        from app.collections.store import NewDocument

        rng = np.random.default_rng((self.seed, start))
        words = rng.choice(self.words, (size, WORDS), p=self.p)
        z = rng.standard_normal((size, DIM)).astype(np.float32)
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        norms = rng.lognormal(np.log(7.0), 0.1, size)
        return [
            NewDocument(
                id=f"doc-{start + i}",
                text=" ".join(words[i]),
                metadata={"shard": (start + i) % 8},
                vector=z[i],
                norm=float(norms[i]),
                n_tokens=WORDS + 2,
                truncated=False,
            )
            for i in range(size)
        ]

    def queries(
        self, docs: int, count: int, batch: int
    ) -> tuple[np.ndarray, list[str]]:
        """Perturbed vectors of random documents, and 2-5 corpus words each."""
        rng = np.random.default_rng((self.seed, 2**40))
        picks = rng.integers(0, docs, count)
        vectors, texts = [], []
        for pick in picks:
            start = int(pick) - int(pick) % batch
            doc = self.batch(start, min(batch, docs - start))[int(pick) - start]
            v = doc.vector + 0.5 * rng.standard_normal(DIM).astype(np.float32) / 20
            vectors.append(v / np.linalg.norm(v))
            texts.append(" ".join(rng.choice(self.words, rng.integers(2, 6), p=self.p)))
        return np.asarray(vectors, dtype=np.float32), texts


def _load(data: dict[str, Any]) -> Any:
    return data


def open_backend(backend: str, where: Path, uri: str) -> tuple[Any, Any]:
    """``(collection, closer)`` of an empty collection ``bench`` of ``backend``."""
    if backend == "local":
        from app.collections.registry import CollectionRegistry

        registry: Any = CollectionRegistry(
            where, model_name="synthetic", dim=DIM, load_calibrator=_load
        )
        return registry.create("bench"), registry
    from app.collections.milvus import MilvusStorage

    storage: Any = MilvusStorage(uri or str(where / "milvus.db"), _load)
    meta = {"name": "bench", "model": "synthetic", "dim": DIM, "created_at": 0.0}
    return storage.create("bench", meta), storage


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """Ingest then search on one backend; return its figures."""
    with tempfile.TemporaryDirectory(prefix=f"scale-{args.worker}-") as tmp:
        if args.worker != "milvus-engine":
            return measure(args, Path(tmp), "")
        from tests.support.milvus_engine import engine_binary, engine_server

        binary = engine_binary()
        if binary is None:
            raise SystemExit(
                "no .venv-milvus-engine: make .venv-milvus-engine/.installed"
            )
        with engine_server(binary, Path(tmp) / "engine") as uri:
            figures = measure(args, Path(tmp), uri)
    # the server has exited: RUSAGE_CHILDREN now holds its peak RSS
    figures["child_rss_mb"] = (
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    )
    return figures


def measure(args: argparse.Namespace, where: Path, uri: str) -> dict[str, Any]:
    """Ingest then search on one open backend (``uri``: a Milvus server's)."""
    corpus = Corpus()
    collection, owner = open_backend(args.worker, where, uri)
    started = time.perf_counter()
    for start in range(0, args.docs, args.batch):
        collection.upsert(corpus.batch(start, min(args.batch, args.docs - start)))
    ingest_s = time.perf_counter() - started
    vectors, texts = corpus.queries(args.docs, args.queries + 5, args.batch)
    for i in range(5):  # warm-up: first calls load indexes
        collection.search(vectors[i : i + 1], texts[i : i + 1], args.k)
    samples = []
    for i in range(5, len(texts)):
        started = time.perf_counter()
        collection.search(vectors[i : i + 1], texts[i : i + 1], args.k)
        samples.append(time.perf_counter() - started)
    started = time.perf_counter()
    collection.page(0, 100)
    page_s = time.perf_counter() - started
    owner.close()
    ms = np.asarray(samples) * 1000
    return {
        "backend": args.worker,
        "docs": args.docs,
        "ingest_docs_per_s": args.docs / ingest_s,
        "search_p50_ms": float(np.percentile(ms, 50)),
        "search_p99_ms": float(np.percentile(ms, 99)),
        "page_ms": page_s * 1000,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "child_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def embed_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Documents/s of the real model (torch) on ``--embed-texts`` real-ish texts."""
    from app.embedding.torch_backend import SentenceTransformerEmbedder
    from app.settings import default_model_path

    source = "synthetic sentences"
    texts = [d.text for d in Corpus().batch(0, args.embed_texts)]
    if (DATA / "scifact").is_dir():
        from app.cli.inputs import read_corpus

        texts = [d["text"] for d in read_corpus(DATA / "scifact", args.embed_texts)]
        source = "scifact abstracts"
    embedder = SentenceTransformerEmbedder(
        default_model_path(), model_name="all-MiniLM-L6-v2"
    )
    embedder.embed(texts[:32], "document")  # warm-up
    started = time.perf_counter()
    embedder.embed(texts, "document")
    seconds = time.perf_counter() - started
    return {"texts": len(texts), "source": source, "docs_per_s": len(texts) / seconds}


def run(role: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one worker in a fresh interpreter; its last stdout line is its JSON."""
    command = [sys.executable, __file__, "--worker", role]
    sizes = {"docs": args.docs, "queries": args.queries}
    if role == "milvus":  # Milvus Lite 3.x: linear per call, capped
        sizes = {
            "docs": min(args.docs, args.lite_docs),
            "queries": min(args.queries, args.lite_queries),
        }
    for flag, value in sizes.items():
        command += [f"--{flag}", str(value)]
    for flag in ("batch", "k", "embed_texts"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--embed-texts", type=int, default=500)
    parser.add_argument("--lite-docs", type=int, default=10_000)
    parser.add_argument("--lite-queries", type=int, default=20)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--no-embed", action="store_true")
    parser.add_argument(
        "--worker", choices=[*BACKENDS, "embed"], help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.worker == "embed":
        print(json.dumps(embed_worker(args)))
        return
    if args.worker:
        print(json.dumps(worker(args)))
        return
    print(
        f"synthetic corpus: {args.docs} docs of {WORDS} Zipf-sampled pseudo-words, "
        f"random unit vectors (dim {DIM}); {args.queries} queries, k={args.k}, "
        f"ingest batches of {args.batch}; milvus-engine = Milvus's C++ engine "
        f"(milvus-lite 2.5.1 server over TCP); milvus = Milvus Lite 3.x (pure Python, "
        f"every call linear in the collection: run on {min(args.docs, args.lite_docs)} "
        f"docs and {min(args.queries, args.lite_queries)} queries)"
    )
    rows = {b: run(b, args) for b in args.backends.split(",")}
    cols = [
        ("ingest_docs_per_s", "ingest docs/s", "{:.0f}"),
        ("search_p50_ms", "search p50 ms", "{:.1f}"),
        ("search_p99_ms", "search p99 ms", "{:.1f}"),
        ("page_ms", "page(0,100) ms", "{:.1f}"),
        ("rss_mb", "peak RSS MB", "{:.0f}"),
        ("child_rss_mb", "server RSS MB", "{:.0f}"),
    ]
    names = list(rows)
    ratio = "engine/local" if {"local", "milvus-engine"} <= rows.keys() else None
    print(
        f"| {'':16} | "
        + " | ".join(f"{n:>13}" for n in names)
        + (f" | {ratio}" if ratio else "")
        + " |"
    )
    print(
        f"| {'docs':16} | "
        + " | ".join(f"{rows[n]['docs']:>13}" for n in names)
        + (" | |" if ratio else " |")
    )
    for key, label, fmt in cols:
        cells = [fmt.format(rows[n][key]) for n in names]
        extra = ""
        if ratio:
            local = rows["local"][key]
            extra = f" | {rows['milvus-engine'][key] / local:.2f}x" if local else " | -"
        print(f"| {label:16} | " + " | ".join(f"{c:>13}" for c in cells) + extra + " |")
    if not args.no_embed:
        e = run("embed", args)
        print(
            f"embedding (torch, all-MiniLM-L6-v2, {e['texts']} {e['source']}): "
            f"{e['docs_per_s']:.1f} docs/s on this node"
        )
    print(json.dumps({"storage": rows}))


if __name__ == "__main__":
    main()
