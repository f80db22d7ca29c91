"""What an embedding backend gives the service: unit vectors *and* the raw norm.

Cosine similarity discards the norm; normcal keeps it. The norm is the length of the
pooled vector before the model's final ``Normalize`` module (theory.md §4.8). This
module loads no model library: schemas, storage and tests import it freely.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec
from typing import Literal, Protocol

import numpy as np
from numpy.typing import NDArray

InputType = Literal["query", "document"]


def _importable(name: str) -> bool:
    """Whether a top-level module can be found, without importing it."""
    try:
        return find_spec(name) is not None
    except ImportError:  # a finder that refuses the name: as good as absent
        return False


class MissingDependencyError(RuntimeError):
    """A code path needs a library this install leaves out on purpose."""


def require(what: str, *modules: str) -> None:
    """Fail in one line, before importing anything, if ``what`` lacks a module.

    The torch-free image (Dockerfile target ``runtime-onnx``, installed from
    ``requirements/runtime-onnx.txt``) has no torch, transformers or
    sentence-transformers: its users get told where those are, not a
    ModuleNotFoundError from deep inside a library. ``modules`` are top-level
    import names, looked up without being imported.
    """
    missing = [name for name in modules if not _importable(name)]
    if missing:
        raise MissingDependencyError(
            f"{what} needs {', '.join(missing)}, not installed here (the torch-free "
            "image, requirements/runtime-onnx.txt): use the default normcal image "
            "(with torch) or `pip install -r requirements/runtime.txt`"
        )


@dataclass(frozen=True)
class EmbeddingBatch:
    """Embeddings of a batch of texts, in input order.

    Attributes
    ----------
    vectors : ndarray of shape (n, dim), float32
        Unit vectors ``u = z / ||z||``.
    norms : ndarray of shape (n,), float64
        Raw norms ``r = ||z||`` of the pooled vectors before normalisation.
    n_tokens : ndarray of shape (n,), int64
        Tokens the model saw (special tokens included, after truncation).
    truncated : ndarray of shape (n,), bool
        Whether the text was longer than the model's maximum sequence length.
    """

    vectors: NDArray[np.float32]
    norms: NDArray[np.float64]
    n_tokens: NDArray[np.int64]
    truncated: NDArray[np.bool_]

    def __len__(self) -> int:
        return int(self.norms.shape[0])

    @classmethod
    def empty(cls, dim: int) -> EmbeddingBatch:
        """The batch of no texts."""
        return cls(
            np.zeros((0, dim), np.float32),
            np.zeros(0),
            np.zeros(0, np.int64),
            np.zeros(0, bool),
        )

    @classmethod
    def from_pooled(
        cls,
        pooled: NDArray[np.floating],
        n_tokens: NDArray[np.int64],
        truncated: NDArray[np.bool_],
    ) -> EmbeddingBatch:
        """Split pooled vectors into unit vectors and raw norms.

        Every backend ends here, so they agree on what a zero vector becomes.
        """
        z = np.asarray(pooled, dtype=np.float64)
        norms = np.linalg.norm(z, axis=1)
        # A zero vector has no direction; keep it as zeros (cosine 0 with everything).
        safe = np.where(norms > 0, norms, 1.0)
        return cls(
            vectors=(z / safe[:, None]).astype(np.float32),
            norms=norms,
            n_tokens=np.asarray(n_tokens, dtype=np.int64),
            truncated=np.asarray(truncated, dtype=bool),
        )


def forward_passes(
    lengths: NDArray[np.int64], max_rows: int, max_tokens: int
) -> list[NDArray[np.int64]]:
    """Group texts into forward passes, longest first; returns indices into ``lengths``.

    Each pass holds at most ``max_rows`` texts and ``max_tokens`` padded tokens (rows
    x its longest text), or one text alone if that is longer. Sorting by length keeps
    padding small; the token budget bounds attention's rows x heads x width^2 scores,
    which for 32 texts of 256 tokens (~100 MB) spill every CPU cache and made a pass
    slower per text than a few at a time. Short texts (queries) still share a pass.
    """
    order = np.argsort(-np.asarray(lengths), kind="stable")
    passes: list[NDArray[np.int64]] = []
    start = 0
    while start < order.size:
        width = max(int(lengths[order[start]]), 1)
        rows = max(1, min(max_rows, max_tokens // width))
        passes.append(order[start : start + rows])
        start += rows
    return passes


class Embedder(Protocol):
    """What the service needs from an embedding model."""

    model_name: str
    # Derived from the model's files (``app.embedding.identity``), unlike the name,
    # which is configured: collections and shipped profiles are bound to it.
    model_id: str
    dim: int
    max_seq_length: int

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        """Embed ``texts`` (blocking, CPU-bound); order is preserved."""
        ...

    def token_counts(self, texts: list[str]) -> NDArray[np.int64]:
        """Tokens of each text, special tokens included (blocking; no forward pass).

        Some backends count after truncation, some before: callers that need the
        count the model sees cap it at ``max_seq_length``.
        """
        ...
