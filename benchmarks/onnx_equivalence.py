"""ONNX Runtime backend vs torch backend: norms, cosines, token counts on mixed texts.

The texts mix short queries (scifact queries, abstract titles, first words of
abstracts) with whole abstracts and abstracts doubled past the 256-token limit, so
truncation is exercised; without scifact, synthetic texts of the same spread.
Targets (issue 14): max relative norm difference <= 0.5%, min cosine >= 0.9999,
identical token counts and truncation flags.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/onnx_equivalence.py [--texts 1000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from app.api.lifespan import load_embedder  # noqa: E402
from app.embedding.onnx_export import export_onnx  # noqa: E402
from app.ops.beir import read_corpus  # noqa: E402
from app.settings import Settings, default_model_path  # noqa: E402

DATA = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))


def scifact_texts(n: int, rng: np.random.Generator) -> list[str]:
    path = DATA / "scifact"
    with (path / "queries.jsonl").open() as fh:
        queries = [json.loads(line)["text"] for line in fh]
    docs = [d["text"] for d in read_corpus(path, n)]
    quarter = n // 4
    texts = list(rng.choice(queries, size=quarter, replace=False))
    texts += [" ".join(d.split()[: int(rng.integers(1, 30))]) for d in docs[:quarter]]
    texts += docs[quarter : 2 * quarter]
    texts += [d + " " + d for d in docs[2 * quarter : n - quarter]]
    return texts[:n]


def synthetic_texts(n: int, rng: np.random.Generator) -> list[str]:
    words = (
        "calibration retrieval aspirin heart attack risk patients diabetes protein "
        "cell expression cancer Über naïve café 東京 , . ; ( ) 42 x-ray"
    ).split()
    lengths = rng.integers(1, 500, size=n)
    return [" ".join(rng.choice(words, size=int(k))) for k in lengths]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    have_scifact = (DATA / "scifact" / "corpus.jsonl").exists()
    texts = (scifact_texts if have_scifact else synthetic_texts)(args.texts, rng)
    with tempfile.TemporaryDirectory() as tmp:
        graph = export_onnx(default_model_path(), Path(tmp) / "onnx")
        onnx = load_embedder(
            Settings(
                embedding_backend="onnx",
                onnx_path=graph,
                embed_threads=args.threads,
                data_dir=Path(tmp),
            )
        )
        torch = load_embedder(Settings(data_dir=Path(tmp)))
        rows = []
        for input_type in ("query", "document"):
            started = time.perf_counter()
            ref = torch.embed(texts, input_type)
            t_torch = time.perf_counter() - started
            started = time.perf_counter()
            got = onnx.embed(texts, input_type)
            t_onnx = time.perf_counter() - started
            rel = np.abs(got.norms - ref.norms) / ref.norms
            cos = np.sum(got.vectors * ref.vectors, axis=1)
            rows.append(
                (
                    input_type,
                    float(rel.max()),
                    float(cos.min()),
                    int((got.n_tokens == ref.n_tokens).sum()),
                    int((got.truncated == ref.truncated).sum()),
                    int(ref.truncated.sum()),
                    len(texts) / t_torch,
                    len(texts) / t_onnx,
                )
            )
    source = "scifact" if have_scifact else "synthetic"
    print(f"{len(texts)} {source} texts, load average {os.getloadavg()[0]:.1f}")
    print(
        "\n| input | max rel norm diff | min cosine | n_tokens equal | truncated equal "
        "| truncated | torch texts/s | onnx texts/s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    ok = True
    for kind, rel, cos, tok, trunc, n_trunc, v_torch, v_onnx in rows:
        print(
            f"| {kind} | {rel:.2e} | {cos:.7f} | {tok}/{len(texts)} | {trunc}/{len(texts)} "
            f"| {n_trunc} | {v_torch:.1f} | {v_onnx:.1f} |"
        )
        ok &= rel <= 0.005 and cos >= 0.9999 and tok == trunc == len(texts)
    print("\ntargets met" if ok else "\nTARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
