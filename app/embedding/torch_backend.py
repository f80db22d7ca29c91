"""The sentence-transformers (PyTorch) backend, with the model's ``Normalize`` removed.

For all-MiniLM-L6-v2 the raw norm is the length of the mean-pooled token embedding.
torch and sentence-transformers are imported when a model is loaded, not when this
module is, so importing :mod:`app.embedding` stays cheap.
"""

from __future__ import annotations

import copy
import os
import threading

import numpy as np
from numpy.typing import NDArray

from app.embedding.base import EmbeddingBatch, InputType, forward_passes, require
from app.embedding.identity import model_identity


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
    ) -> None:
        require(
            "NORMCAL_EMBEDDING_BACKEND=torch",
            "torch",
            "transformers",
            "sentence_transformers",
        )
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
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
        self._model = model
        # Token counting needs truncation and padding off; a fast tokenizer keeps
        # those as mutable state that ``encode`` sets on every call from any pool
        # thread. Counting on the shared one made concurrent encodes fail (ragged
        # batches), so it gets its own copy, and a lock because it is stateful too.
        self._counter = copy.deepcopy(model.tokenizer)
        self._counter_lock = threading.Lock()
        self.model_name = model_name
        self.model_id = model_identity(model_path)
        self.prompts: dict[InputType, str] = dict(prompts or {})
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_seq_length = int(model.max_seq_length or 512)
        get_dim = getattr(model, "get_embedding_dimension", None) or (
            model.get_sentence_embedding_dimension
        )
        dim = get_dim()
        if dim is None:  # pragma: no cover - every pooled model reports it
            raise ValueError(f"model at {model_path} does not report its dimension")
        self.dim = int(dim)

    def token_counts(self, texts: list[str]) -> NDArray[np.int64]:
        """Untruncated token counts, special tokens included (thread-safe)."""
        with self._counter_lock:
            encoded = self._counter(
                texts, add_special_tokens=True, truncation=False, verbose=False
            )
        return np.array([len(ids) for ids in encoded["input_ids"]], dtype=np.int64)

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        """Embed texts; see :class:`EmbeddingBatch`."""
        prefix = self.prompts.get(input_type, "")
        inputs = [prefix + t for t in texts] if prefix else list(texts)
        if not inputs:
            return EmbeddingBatch.empty(self.dim)
        full = self.token_counts(inputs)
        seen = np.minimum(full, self.max_seq_length)
        raw = np.empty((len(inputs), self.dim), dtype=np.float32)
        for rows in forward_passes(seen, self.batch_size, self.max_batch_tokens):
            raw[rows] = self._model.encode(
                [inputs[i] for i in rows],
                batch_size=len(rows),
                convert_to_numpy=True,
                normalize_embeddings=False,
                show_progress_bar=False,
            )
        return EmbeddingBatch.from_pooled(raw, seen, full > self.max_seq_length)
