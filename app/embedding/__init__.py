"""Embedding backends: unit vectors *and* the raw norm that cosine similarity discards.

:mod:`app.embedding.base` declares what the service needs (:class:`Embedder`,
:class:`EmbeddingBatch`); each backend lives in its own module and imports its
model library only when a model is loaded, so importing this package loads no
torch or sentence-transformers.
"""

from __future__ import annotations

from app.embedding.base import Embedder, EmbeddingBatch, InputType
from app.embedding.torch_backend import SentenceTransformerEmbedder

__all__ = ["Embedder", "EmbeddingBatch", "InputType", "SentenceTransformerEmbedder"]
