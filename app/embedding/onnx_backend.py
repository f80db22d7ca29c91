"""The ONNX Runtime backend: the torch backend's vectors, norms and tokens, without torch.

Only the transformer runs as an ONNX graph (exported by :mod:`app.embedding.onnx_export`);
tokenisation comes from the model's own ``tokenizer.json`` (the ``tokenizers``
package) and pooling is done here in numpy exactly as the model's sentence-transformers
``Pooling`` config says. Nothing on this path imports torch, transformers or
sentence-transformers, so a runtime with a pre-exported graph needs none of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from numpy.typing import NDArray

from app.embedding.base import EmbeddingBatch, InputType
from app.embedding.identity import model_identity
from app.embedding.precision import PrecisionChoice
from app.embedding.tokens import Tokenised, padded, pooled_in_passes, truncating

if TYPE_CHECKING:
    from tokenizers import Encoding

__all__ = ["OnnxEmbedder", "PipelineConfig", "UnsupportedModelError", "pool"]

PoolingMode = Literal["mean", "cls", "max"]
_POOLING_KEYS: dict[str, PoolingMode] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
}
_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"


class UnsupportedModelError(ValueError):
    """The model's pipeline is one this backend cannot reproduce exactly."""


@dataclass(frozen=True)
class PipelineConfig:
    """What the sentence-transformers pipeline does after the transformer."""

    pooling: PoolingMode
    dim: int
    max_seq_length: int

    @classmethod
    def read(cls, model_dir: Path) -> PipelineConfig:
        """Read ``modules.json``, the pooling config and ``sentence_bert_config.json``.

        Only Transformer → Pooling (one of mean, CLS, max) → optional Normalize is
        accepted: any other module (Dense, a second pooling mode, weighted or last-token
        pooling) would change the vector, and a silently different norm is worse than
        refusing to start.
        """
        modules_file = model_dir / "modules.json"
        if not modules_file.is_file():
            raise UnsupportedModelError(
                f"{model_dir} has no modules.json: the onnx backend needs a "
                "sentence-transformers model (use NORMCAL_EMBEDDING_BACKEND=torch)"
            )
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
        types = [str(m.get("type", "")) for m in modules]
        if types[-1:] == [_NORMALIZE]:
            types = types[:-1]
        if types != [_TRANSFORMER, _POOLING]:
            raise UnsupportedModelError(
                f"the onnx backend supports Transformer, Pooling[, Normalize] only; "
                f"{model_dir} has {types} (use NORMCAL_EMBEDDING_BACKEND=torch)"
            )
        pooling_dir = model_dir / str(modules[1].get("path", ""))
        config = json.loads((pooling_dir / "config.json").read_text(encoding="utf-8"))
        on = sorted(
            key
            for key, value in config.items()
            if key.startswith("pooling_mode") and value
        )
        if len(on) != 1 or on[0] not in _POOLING_KEYS:
            raise UnsupportedModelError(
                f"the onnx backend pools with exactly one of {sorted(_POOLING_KEYS)}; "
                f"{pooling_dir / 'config.json'} enables {on} "
                "(use NORMCAL_EMBEDDING_BACKEND=torch)"
            )
        if config.get("include_prompt", True) is False:
            raise UnsupportedModelError(
                f"{pooling_dir / 'config.json'}: include_prompt=false is not supported "
                "by the onnx backend (use NORMCAL_EMBEDDING_BACKEND=torch)"
            )
        st_config = model_dir / "sentence_bert_config.json"
        max_seq = None
        if st_config.is_file():
            max_seq = json.loads(st_config.read_text(encoding="utf-8")).get(
                "max_seq_length"
            )
        if not isinstance(max_seq, int) or max_seq < 1:
            raise UnsupportedModelError(
                f"{model_dir}/sentence_bert_config.json sets no max_seq_length"
            )
        return cls(
            pooling=_POOLING_KEYS[on[0]],
            dim=int(config["word_embedding_dimension"]),
            max_seq_length=max_seq,
        )


def pool(
    tokens: NDArray[np.float32], mask: NDArray[np.int64], mode: PoolingMode
) -> NDArray[np.float64]:
    """Pool token embeddings ``(n, seq, dim)`` as sentence-transformers' ``Pooling``.

    Mean divides the masked sum by the token count (clamped at 1e-9 as the library
    does); max sets padding to -1e9 first; CLS takes the first token.
    """
    if mode == "cls":
        return tokens[:, 0, :].astype(np.float64)
    weights = mask[:, :, None].astype(np.float64)
    if mode == "max":
        masked: NDArray[np.float64] = np.where(weights > 0, tokens, -1e9)
        pooled: NDArray[np.float64] = np.max(masked, axis=1)
        return pooled
    summed: NDArray[np.float64] = np.sum(tokens * weights, axis=1)
    counts: NDArray[np.float64] = np.maximum(np.sum(weights, axis=1), 1e-9)
    mean: NDArray[np.float64] = summed / counts
    return mean


class OnnxEmbedder:
    """A sentence-transformers model run as an ONNX graph, with ``Normalize`` skipped.

    Parameters
    ----------
    model_path : str
        Local model directory: tokenizer, configs, and the identity's files.
    graph : Path
        The exported transformer (``model.onnx``), verified by the caller.
    model_name : str
        Name reported in responses.
    prompts : dict
        Prefix per input type, as for the torch backend.
    batch_size : int
        Most texts per forward pass (see :func:`~app.embedding.base.forward_passes`).
    max_batch_tokens : int
        Most padded tokens per forward pass.
    threads : int
        ONNX Runtime intra-op threads; 0 lets it choose (one per core). The threads
        do not spin while idle: a spinning pool burns the CPU a neighbour (or the
        next request's tokenisation) needs.
    """

    def __init__(
        self,
        model_path: str,
        graph: Path,
        *,
        model_name: str,
        prompts: dict[InputType, str] | None = None,
        batch_size: int = 32,
        threads: int = 0,
        max_batch_tokens: int = 512,
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        model_dir = Path(model_path)
        config = PipelineConfig.read(model_dir)
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        # tokenizer.json may carry its own truncation and fixed padding (128 for
        # all-MiniLM-L6-v2); sentence-transformers truncates at max_seq_length and
        # pads to the longest text of a batch, which :meth:`embed` does itself.
        padding = tokenizer.padding or {}
        self._tokenizer = truncating(tokenizer, config.max_seq_length)
        self._pad_id = int(padding.get("pad_id", 0))
        self._pad_type_id = int(padding.get("pad_type_id", 0))
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self._session = ort.InferenceSession(
            str(graph), options, providers=["CPUExecutionProvider"]
        )
        self._inputs = {i.name for i in self._session.get_inputs()}
        self._pooling = config.pooling
        self.model_name = model_name
        self.model_id = model_identity(model_dir)
        self.prompts: dict[InputType, str] = dict(prompts or {})
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_seq_length = config.max_seq_length
        self.dim = config.dim
        self.precision_choice = PrecisionChoice(
            "fp32",
            "the onnx backend runs fp32 (ONNX Runtime's CPU provider has no bf16 MatMul)",
        )

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        """Embed texts; see :class:`EmbeddingBatch`."""
        prefix = self.prompts.get(input_type, "")
        inputs = [prefix + t for t in texts] if prefix else list(texts)
        return pooled_in_passes(
            self._tokenizer,
            inputs,
            self.dim,
            self.batch_size,
            self.max_batch_tokens,
            self._forward,
        )

    def token_counts(self, texts: list[str]) -> NDArray[np.int64]:
        """Tokens the model sees, special tokens included (thread-safe)."""
        return Tokenised(self._tokenizer, texts).lengths

    def _forward(self, encodings: list[Encoding]) -> NDArray[np.float64]:
        """Pad a batch to its longest text, run the graph, pool."""
        ids, mask, types = padded(encodings, self._pad_id, self._pad_type_id)
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        (tokens,) = self._session.run(
            ["token_embeddings"], {k: v for k, v in feed.items() if k in self._inputs}
        )
        return pool(np.asarray(tokens, dtype=np.float32), mask, self._pooling)
