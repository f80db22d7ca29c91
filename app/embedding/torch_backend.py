"""The sentence-transformers (PyTorch) backend, with the model's ``Normalize`` removed.

For all-MiniLM-L6-v2 the raw norm is the length of the mean-pooled token embedding.
torch and sentence-transformers are imported when a model is loaded, not when this
module is, so importing :mod:`app.embedding` stays cheap. The model runs in fp32, in
bf16 under ``torch.autocast``, or mixed: its feed-forward layers in bf16, the rest fp32
(:mod:`app.embedding.precision` chooses).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.embedding.base import EmbeddingBatch, InputType, forward_passes, require
from app.embedding.identity import model_identity
from app.embedding.precision import (
    Precision,
    PrecisionSetting,
    cpu_bf16_flag,
    select_precision,
)
from app.embedding.tokens import Tokenised, truncating


class SentenceTransformerEmbedder:
    """A sentence-transformers model with its ``Normalize`` module removed.

    Parameters
    ----------
    model_path : str
        Local model directory (no hub download: ``HF_HUB_OFFLINE=1`` is forced).
    model_name : str
        Name reported in responses.
    prompts : dict
        Prefix per input type, e.g. ``{"query": "query: ", "document": "passage: "}``.
    batch_size : int
        Most texts per forward pass (see :func:`~app.embedding.base.forward_passes`).
    max_batch_tokens : int
        Most padded tokens per forward pass.
    device : str
        Torch device.
    threads : int
        torch intra-op threads (process-wide); 0 leaves torch's default (one per core).
    precision : {"auto", "fp32", "mixed", "bf16"}
        See :func:`~app.embedding.precision.select_precision`; ``precision_choice``
        holds what was chosen and why.
    """

    def __init__(
        self,
        model_path: str,
        *,
        model_name: str,
        prompts: dict[InputType, str] | None = None,
        batch_size: int = 32,
        max_batch_tokens: int = 512,
        device: str = "cpu",
        threads: int = 0,
        precision: PrecisionSetting = "fp32",
    ) -> None:
        require(
            "NORMCAL_EMBEDDING_BACKEND=torch",
            "torch",
            "transformers",
            "sentence_transformers",
        )
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.models import Normalize
        from transformers.utils import logging as transformers_logging

        # transformers draws a "Loading weights" tqdm bar on stderr, the service's log
        # stream (one JSON object per line by default). The model is local, so the
        # library's bars (downloads, loading) have nothing to tell.
        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        model = SentenceTransformer(model_path, device=device, local_files_only=True)
        modules = list(model)
        if modules and isinstance(modules[-1], Normalize):
            # Keep the pooled vector's length: rebuild the pipeline without Normalize.
            model = SentenceTransformer(modules=modules[:-1], device=device)
        if threads:
            torch.set_num_threads(threads)
        self._model = model
        self._device = torch.device(device)
        self.model_name = model_name
        self.model_id = model_identity(model_path)
        self.prompts: dict[InputType, str] = dict(prompts or {})
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_seq_length = int(model.max_seq_length or 512)
        # ``encode`` sets truncation and padding on the model's tokenizer on every
        # call from any pool thread; counting needs its own, configured once.
        self._tokenizer = truncating(
            model.tokenizer.backend_tokenizer, self.max_seq_length
        )
        get_dim = getattr(model, "get_embedding_dimension", None) or (
            model.get_sentence_embedding_dimension
        )
        dim = get_dim()
        if dim is None:  # pragma: no cover - every pooled model reports it
            raise ValueError(f"model at {model_path} does not report its dimension")
        self.dim = int(dim)
        self.precision: Precision = "fp32"
        feed_forward = _feed_forward_layers(model, torch)
        for layer in feed_forward:
            layer.forward = self._mixed(layer, torch)
        self.precision_choice = select_precision(
            precision, self, native=self._native_bf16()
        )
        # Autocast casts every Linear weight to bf16 on each call (its cache lives as
        # long as one autocast block), as mixed does its layers'; cast them once
        # instead. The result is bit for bit the same, and a query costs ~7% less
        # CPU. Norms, softmax and pooling stay fp32, as autocast keeps them.
        chosen = self.precision_choice.precision
        if chosen == "bf16":
            feed_forward = [
                m for m in model.modules() if isinstance(m, torch.nn.Linear)
            ]
        if chosen != "fp32":
            for layer in feed_forward:
                layer.to(torch.bfloat16)

    def _mixed(self, layer: Any, torch: Any) -> Any:
        """``layer``'s forward, in bf16 when the model runs mixed."""
        fp32_forward = layer.forward
        bf16 = torch.bfloat16

        def forward(x: Any) -> Any:
            if self.precision != "mixed":
                return fp32_forward(x)
            bias = None if layer.bias is None else layer.bias.to(bf16)
            out = torch.nn.functional.linear(x.to(bf16), layer.weight.to(bf16), bias)
            return out.float()

        return forward

    def token_counts(self, texts: list[str]) -> NDArray[np.int64]:
        """Tokens the model sees, special tokens included (thread-safe)."""
        return Tokenised(self._tokenizer, texts).lengths

    def _native_bf16(self) -> str | None:
        """Where bf16 is native for this device, or None."""
        import torch

        if self._device.type == "cuda":
            ok = torch.cuda.is_bf16_supported()
            return f"GPU {torch.cuda.get_device_name(self._device)}" if ok else None
        if self._device.type == "cpu":
            flag = cpu_bf16_flag()
            return f"CPU flag {flag}" if flag else None
        return None

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.precision != "bf16":
            return contextlib.nullcontext()
        import torch

        return torch.autocast(self._device.type, dtype=torch.bfloat16)

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        """Embed texts; see :class:`EmbeddingBatch`."""
        prefix = self.prompts.get(input_type, "")
        inputs = [prefix + t for t in texts] if prefix else list(texts)
        if not inputs:
            return EmbeddingBatch.empty(self.dim)
        tokens = Tokenised(self._tokenizer, inputs)
        raw = np.empty((len(inputs), self.dim), dtype=np.float32)
        passes = forward_passes(tokens.lengths, self.batch_size, self.max_batch_tokens)
        with self._autocast():
            for rows in passes:
                raw[rows] = self._model.encode(
                    [inputs[i] for i in rows],
                    batch_size=len(rows),
                    convert_to_numpy=True,
                    normalize_embeddings=False,
                    show_progress_bar=False,
                )
        return EmbeddingBatch.from_pooled(raw, tokens.lengths, tokens.truncated)


def _feed_forward_layers(model: Any, torch: Any) -> list[Any]:
    """The transformer's feed-forward layers: its Linear layers that are not square.

    Attention's query, key, value and output projections map the model's width onto
    itself; the feed-forward block widens it (4x) and narrows it back. Layers after
    the transformer (a ``Dense`` projection of some models) are left alone.
    """
    return [
        module
        for module in model[0].modules()
        if isinstance(module, torch.nn.Linear)
        and module.in_features != module.out_features
    ]
