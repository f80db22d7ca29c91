"""Tokens as the model sees them: counts after truncation and whether it cut.

Both backends count with a private copy of the model's fast tokenizer (the
``tokenizers`` package), configured once to truncate at ``max_seq_length`` and not to
pad, and never changed afterwards: calls from several pool threads share nothing
mutable, so they need no lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from app.embedding.base import EmbeddingBatch, forward_passes

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

__all__ = ["Tokenised", "padded", "pooled_in_passes", "truncating"]


def truncating(tokenizer: Tokenizer, max_seq_length: int) -> Tokenizer:
    """A copy of ``tokenizer`` that truncates at ``max_seq_length`` and never pads."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_padding()
    copy.enable_truncation(max_length=max_seq_length)
    return copy


class Tokenised:
    """``texts`` through a :func:`truncating` tokenizer, special tokens included."""

    def __init__(self, tokenizer: Tokenizer, texts: list[str]) -> None:
        self.encodings: list[Encoding] = tokenizer.encode_batch(
            texts, add_special_tokens=True
        )
        self.lengths: NDArray[np.int64] = np.array(
            [len(e.ids) for e in self.encodings], dtype=np.int64
        )
        # Truncation keeps the first max_seq_length tokens; the rest overflow.
        self.truncated: NDArray[np.bool_] = np.array(
            [bool(e.overflowing) for e in self.encodings], dtype=bool
        )


def pooled_in_passes(
    tokenizer: Tokenizer,
    texts: list[str],
    dim: int,
    batch_size: int,
    max_batch_tokens: int,
    forward: Callable[[list[Encoding]], NDArray[np.float64]],
) -> EmbeddingBatch:
    """Embed ``texts`` pass by pass (:func:`forward_passes`); ``forward`` pools one."""
    if not texts:
        return EmbeddingBatch.empty(dim)
    tokens = Tokenised(tokenizer, texts)
    pooled = np.empty((len(texts), dim), dtype=np.float64)
    for rows in forward_passes(tokens.lengths, batch_size, max_batch_tokens):
        pooled[rows] = forward([tokens.encodings[i] for i in rows])
    return EmbeddingBatch.from_pooled(pooled, tokens.lengths, tokens.truncated)


def padded(
    encodings: list[Encoding],
    pad_id: int,
    pad_type_id: int = 0,
    width: int | None = None,
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Token ids, attention mask and token type ids of one pass.

    Padded to ``width`` tokens, by default its longest text's.
    """
    longest = max(len(e.ids) for e in encodings)
    width = longest if width is None else max(width, longest)
    shape = (len(encodings), width)
    ids = np.full(shape, pad_id, dtype=np.int64)
    types = np.full(shape, pad_type_id, dtype=np.int64)
    mask = np.zeros(shape, dtype=np.int64)
    for row, enc in enumerate(encodings):
        n = len(enc.ids)
        ids[row, :n] = enc.ids
        types[row, :n] = enc.type_ids
        mask[row, :n] = 1
    return ids, mask, types
