"""Does any dynamic int8 variant of the ONNX graph pass issue 14's accuracy gate?

Quantises the exported graph's MatMuls with ONNX Runtime's ``quantize_dynamic`` —
all of them, only the feed-forward ones, only the attention ones — and compares each
with the fp32 graph on the same texts: docs per CPU-second on one thread (CPU time,
so a busy machine moves it less than wall time), the largest relative norm change and
the smallest cosine to the fp32 vector. The gate (norms within 1%, cosine >= 0.999 on
every text) decides whether a variant may be offered; the script only measures.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/onnx_quantisation.py [--texts 150]``.
Needs ``../shared/data/scifact`` (abstracts, so most passes are long).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from app.cli.inputs import read_corpus  # noqa: E402
from app.embedding.onnx_backend import OnnxEmbedder  # noqa: E402
from app.embedding.onnx_export import GRAPH, export_onnx  # noqa: E402
from app.settings import default_model_path  # noqa: E402

DATA = Path(os.environ.get("NORMCAL_SHARED_DATA", REPO.parent / "shared" / "data"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=150)
    args = parser.parse_args()
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    texts = [d["text"] for d in read_corpus(DATA / "scifact", args.texts)]
    model = default_model_path()
    with tempfile.TemporaryDirectory() as tmp:
        export_onnx(model, Path(tmp) / "fp32")
        graph = Path(tmp) / "fp32" / GRAPH
        matmuls = [
            n.name for n in onnx.load(str(graph)).graph.node if n.op_type == "MatMul"
        ]
        ffn = [
            n
            for n in matmuls
            if "/intermediate/" in n
            or (n.endswith("/output/dense/MatMul") and "/attention/" not in n)
        ]
        variants = {
            "all MatMuls": [],
            "feed-forward only": [n for n in matmuls if n not in ffn],
            "attention only": ffn,
        }

        def run(path: Path) -> tuple[float, object]:
            embedder = OnnxEmbedder(model, path, model_name="bench", threads=1)
            embedder.embed(texts[:8], "document")  # warm-up
            started = time.process_time()
            batch = embedder.embed(texts, "document")
            return len(texts) / (time.process_time() - started), batch

        base_speed, ref = run(graph)
        print(
            f"{len(texts)} scifact abstracts, one thread; gate: norms within 1%, cosine >= 0.999\n"
        )
        print(
            "| variant | docs per CPU-s | speed vs fp32 | max rel norm change | min cosine | gate |"
        )
        print("|---|---|---|---|---|---|")
        print(f"| fp32 | {base_speed:.1f} | 1.00 | 0 | 1 | — |")
        for name, exclude in variants.items():
            out = Path(tmp) / f"int8-{len(exclude)}.onnx"
            quantize_dynamic(
                str(graph),
                str(out),
                weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul"],
                nodes_to_exclude=exclude,
            )
            speed, batch = run(out)
            rel = float(np.max(np.abs(batch.norms - ref.norms) / ref.norms))  # type: ignore[attr-defined]
            cos = float(np.min(np.sum(batch.vectors * ref.vectors, axis=1)))  # type: ignore[attr-defined]
            ok = rel <= 0.01 and cos >= 0.999
            print(
                f"| int8, {name} | {speed:.1f} | {speed / base_speed:.2f} | {rel:.4f} | {cos:.5f} | {'pass' if ok else 'refused'} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
