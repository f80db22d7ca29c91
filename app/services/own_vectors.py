"""Collections of the client's own vectors ("bring your own vectors").

A collection created with ``embedding: {dimension, model}`` is embedded by no model
of the server's: documents and searches carry ``vector``, raw (its length is the
stored norm), and the text beside it feeds BM25 and the length features. Token
counts (``n_tokens``) are the server tokenizer's, capped at its sequence length like
the server model's own, so the length features stay on the scale the model-agnostic
default was fitted on. Nothing is embedded and nothing is truncated here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.collections.base import CollectionBackend, own_vectors
from app.embedding import Embedder, EmbeddingBatch
from app.exceptions import InvalidRequestError

NO_QUERY_TEXT = (
    "no query text beside the vector: the calibrator's evidence is the query's "
    "length and BM25 as well as the hit list, so probabilities need `query` "
    "(`queries`) sent beside `vector` (`vectors`)"
)


def is_own(collection: CollectionBackend[Any]) -> bool:
    """Whether the collection takes the client's own vectors."""
    return own_vectors(collection.meta)


def check_kind(collection: CollectionBackend[Any], sent: bool, field: str) -> None:
    """Refuse (422) vectors on a server-embedded collection, and texts alone on the others."""
    name, model = collection.name, collection.meta.get("model")
    if own_vectors(collection.meta) and not sent:
        raise InvalidRequestError(
            f"collection {name!r} takes the client's own vectors (model {model!r}): "
            f"send `{field}`",
            field=field,
        )
    if sent and not own_vectors(collection.meta):
        raise InvalidRequestError(
            f"collection {name!r} is embedded by the server's model {model!r}: send "
            f"text without `{field}`, or create a collection with `embedding` for "
            "your own vectors",
            field=field,
        )


def vector_batch(
    fields: Sequence[str],
    vectors: Sequence[Sequence[float]],
    dim: int,
    n_tokens: NDArray[np.int64],
) -> EmbeddingBatch:
    """The client's vectors as an embedding batch: unit vectors and raw norms.

    Refuses (422, naming ``fields[i]``) a vector whose length is not ``dim`` or whose
    norm is zero (no direction) or overflows; finiteness is the schema's.
    """
    for field, vector in zip(fields, vectors, strict=True):
        if len(vector) != dim:
            raise InvalidRequestError(
                f"{field} has {len(vector)} numbers; this collection's dimension "
                f"is {dim}",
                field=field,
            )
    z = np.array(vectors, dtype=np.float64).reshape(len(vectors), dim)
    with np.errstate(over="ignore"):  # an overflowing length is refused below
        norms = np.linalg.norm(z, axis=1)
    bad = np.flatnonzero(~(np.isfinite(norms) & (norms > 0)))
    if bad.size:
        i = int(bad[0])
        raise InvalidRequestError(
            f"{fields[i]} has length {norms[i]}: a vector needs a finite, non-zero "
            "length (its direction is what is searched)",
            field=fields[i],
        )
    return EmbeddingBatch.from_pooled(z, n_tokens, np.zeros(len(vectors), dtype=bool))


def token_counts(embedder: Embedder, texts: Sequence[str | None]) -> NDArray[np.int64]:
    """The server tokenizer's counts of ``texts``, capped at its sequence length.

    0 for a missing text (a vector-only query); blocking, run it in the pool.
    """
    present = [t for t in texts if t is not None]
    counts = np.zeros(len(texts), dtype=np.int64)
    if present:
        given = np.array([t is not None for t in texts])
        counts[given] = np.minimum(
            embedder.token_counts(present), embedder.max_seq_length
        )
    return counts
