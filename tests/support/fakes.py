"""A deterministic stand-in for the embedding model, for tests of everything else.

API shape, errors, limits, auth and observability do not depend on what the model
makes of a text, only on getting *an* :class:`~app.embedding.EmbeddingBatch` back.
Loading the real model for them costs seconds per process and hides their real
subject; :class:`HashEmbedder` answers instantly and identically on every run.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from app.embedding import EmbeddingBatch, InputType

# Not the bundled model's name: the shipped default profile (fitted to that model's
# norms) must not apply to vectors that only look like embeddings.
FAKE_MODEL_NAME = "tests/hash-embedder"
FAKE_MODEL_ID = "sha256:0000000000000000"  # fixed: the fake has no files to hash
_TOKEN = re.compile(r"\w+|[^\w\s]")
_SPECIAL = ("[CLS]", "[SEP]")


@lru_cache(maxsize=4096)
def _token_vector(token: str, dim: int) -> NDArray[np.float64]:
    """A fixed pseudo-random vector per token (seeded by its hash, not ``hash()``,
    which changes between processes)."""
    seed = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest())
    return np.random.default_rng(seed).standard_normal(dim)


class HashEmbedder:
    """Bag of hashed tokens, mean-pooled like a sentence-transformers model.

    Texts sharing words get similar vectors, so searches rank sensibly; the norm of
    the mean shrinks as a text gets longer and more varied, so it depends on the
    text as the real one does. Tokens are words and punctuation marks plus two
    special tokens; a text longer than ``max_seq_length`` tokens is truncated.
    It satisfies the :class:`~app.embedding.Embedder` protocol and also offers
    ``token_counts``, as the real model does.
    """

    def __init__(
        self,
        *,
        dim: int = 32,
        max_seq_length: int = 64,
        model_name: str = FAKE_MODEL_NAME,
        model_id: str = FAKE_MODEL_ID,
    ) -> None:
        self.model_name = model_name
        self.model_id = model_id
        self.dim = dim
        self.max_seq_length = max_seq_length

    def _tokens(self, text: str) -> list[str]:
        return [_SPECIAL[0], *_TOKEN.findall(text.lower()), _SPECIAL[1]]

    def token_counts(self, texts: list[str]) -> NDArray[np.int64]:
        """Untruncated token counts, special tokens included."""
        return np.array([len(self._tokens(t)) for t in texts], dtype=np.int64)

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        """Embed ``texts``; ``input_type`` is accepted and, like an unprompted
        model, ignored."""
        full = self.token_counts(texts)
        z = np.zeros((len(texts), self.dim))
        for i, text in enumerate(texts):
            tokens = self._tokens(text)[: self.max_seq_length]
            z[i] = np.mean([_token_vector(t, self.dim) for t in tokens], axis=0)
        norms = np.linalg.norm(z, axis=1)
        return EmbeddingBatch(
            vectors=(z / norms[:, None]).astype(np.float32),
            norms=norms,
            n_tokens=np.minimum(full, self.max_seq_length),
            truncated=full > self.max_seq_length,
        )
