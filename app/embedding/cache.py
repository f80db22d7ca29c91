"""An embedding cache: a text the model has embedded before costs no forward pass.

Reranking sends the same passages again and again (a retriever's top hits for
similar queries, a page judged twice, a document upserted again), and a forward pass
is the whole cost of embedding them. :class:`CachedEmbedder` wraps the serving model
so that every path that embeds (search, rerank, ingest, ``/v1/embed`` and
``/v1/embeddings``, fits, the judging queue) looks each text up first and runs the
model on the misses only. It sits in front of the model's forward pass, below the
batcher (:mod:`app.embedding.batching`), whose scheduling it leaves alone: the
batcher only asks it, before queueing, whether a request is answered already
(:func:`cached`), so a request whose texts are all known takes no lane and no pool job.

**What a key holds.** A vector depends on the model's files, the backend, the
precision and path it runs (eager or a traced graph), the length at which it
truncates, and the exact string the model reads: the prompt of the input type and
the text. The key hashes all of these (:func:`vector_identity` and the prompt), so
one cache can serve several embedders without ever handing one another's vectors:
a vector computed in fp32 is never returned for a mixed-precision model, nor an
ONNX one for torch. With equal prompts for queries and documents (the default), a
passage embedded as a document serves the same text as a query.

**Bounds.** At most ``max_entries`` texts and ``max_bytes`` bytes, counted as the
vector's bytes, the key's and a fixed per-entry overhead (:data:`ENTRY_OVERHEAD`,
the Python objects around them, measured with ``tracemalloc`` by
``tests/embedding/test_cache.py``); the least recently used entries are evicted
first. Hits, misses, evictions, entries and bytes are counted for ``/metrics``.

A cached vector is the one a pass computed for the text, in whatever batch it came:
as without a cache, results can differ from a fresh pass in the last bits (padding
and batch composition change the order of summation), never more.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.embedding.base import Embedder, EmbeddingBatch, InputType
from app.embedding.precision import precision_of

__all__ = [
    "ENTRY_OVERHEAD",
    "CacheStats",
    "CachedEmbedder",
    "EmbeddingCache",
    "cached",
    "vector_identity",
]

# Bytes one entry costs beyond its vector's data and its key's digest: the ndarray
# object, the row, the key's bytes object and the ordered dict's node. Measured with
# tracemalloc (~350 here; tests/embedding/test_cache.py checks the bound holds).
ENTRY_OVERHEAD = 400
_KEY_BYTES = 16  # blake2b digest: 128 bits


@dataclass(frozen=True, slots=True)
class _Row:
    """One text's embedding, as stored."""

    vector: NDArray[np.float32]
    norm: float
    n_tokens: int
    truncated: bool


@dataclass(frozen=True)
class CacheStats:
    """Counters since the cache was made; ``entries`` and ``bytes`` are current."""

    hits: dict[str, int]
    misses: dict[str, int]
    evictions: int
    entries: int
    bytes: int
    max_entries: int
    max_bytes: int


class EmbeddingCache:
    """Least-recently-used embeddings, bounded by entries and by bytes (thread-safe).

    Parameters
    ----------
    max_entries : int
        Most texts held (at least 1).
    max_bytes : int
        Most bytes held, counted per entry as vector + key + :data:`ENTRY_OVERHEAD`.
        An entry larger than this on its own is not stored.
    """

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("an embedding cache holds at least one entry and byte")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._rows: OrderedDict[bytes, _Row] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = 0
        self._hits: dict[str, int] = {}
        self._misses: dict[str, int] = {}
        self._evictions = 0

    def get(self, keys: list[bytes], label: str) -> list[_Row | None]:
        """The rows of ``keys`` (None where missing), counted under ``label``."""
        with self._lock:
            rows = [self._held(key) for key in keys]
            missing = sum(row is None for row in rows)
            self._hits[label] = self._hits.get(label, 0) + len(keys) - missing
            self._misses[label] = self._misses.get(label, 0) + missing
        return rows

    def get_all(self, keys: list[bytes], label: str) -> list[_Row] | None:
        """The rows of ``keys`` if every one is held (counted as hits), else None.

        A miss counts nothing: the caller embeds through :meth:`get` next.
        """
        with self._lock:
            if not all(key in self._rows for key in keys):
                return None
            rows = [self._rows[key] for key in keys]
            for key in keys:
                self._rows.move_to_end(key)
            self._hits[label] = self._hits.get(label, 0) + len(keys)
        return rows

    def _held(self, key: bytes) -> _Row | None:
        row = self._rows.get(key)
        if row is not None:
            self._rows.move_to_end(key)
        return row

    def put(self, keys: list[bytes], batch: EmbeddingBatch) -> None:
        """Store each key's row of ``batch``, evicting the least recently used."""
        rows = [
            _Row(
                # A copy: a view would keep the whole batch's array alive.
                batch.vectors[i].copy(),
                float(batch.norms[i]),
                int(batch.n_tokens[i]),
                bool(batch.truncated[i]),
            )
            for i in range(len(keys))
        ]
        with self._lock:
            for key, row in zip(keys, rows, strict=True):
                size = entry_bytes(row.vector)
                if size > self.max_bytes:
                    continue
                old = self._rows.pop(key, None)
                if old is not None:
                    self._bytes -= entry_bytes(old.vector)
                self._rows[key] = row
                self._bytes += size
                while (
                    len(self._rows) > self.max_entries or self._bytes > self.max_bytes
                ):
                    _, evicted = self._rows.popitem(last=False)
                    self._bytes -= entry_bytes(evicted.vector)
                    self._evictions += 1

    def stats(self) -> CacheStats:
        """A consistent snapshot of the counters."""
        with self._lock:
            return CacheStats(
                hits=dict(self._hits),
                misses=dict(self._misses),
                evictions=self._evictions,
                entries=len(self._rows),
                bytes=self._bytes,
                max_entries=self.max_entries,
                max_bytes=self.max_bytes,
            )


def entry_bytes(vector: NDArray[np.float32]) -> int:
    """What one entry counts against ``max_bytes``."""
    return int(vector.nbytes) + _KEY_BYTES + ENTRY_OVERHEAD


def _unwrapped(embedder: Any) -> Any:
    """The model under wrappers that keep it as ``inner`` (metrics, this cache)."""
    while hasattr(embedder, "inner"):
        embedder = embedder.inner
    return embedder


def vector_identity(embedder: Embedder) -> str:
    """Everything but the text that decides ``embedder``'s vectors, as one string.

    The model's files (``model_id``), the backend's class, the length at which it
    truncates, the precision and the path it runs (the precision choice's reason
    says eager or traced graph, and what its self-check measured).
    """
    model = _unwrapped(embedder)
    choice = precision_of(embedder)
    return "\0".join(
        (
            f"{type(model).__module__}.{type(model).__qualname__}",
            embedder.model_id,
            embedder.model_name,
            str(embedder.dim),
            str(embedder.max_seq_length),
            choice.precision,
            choice.reason,
        )
    )


class CachedEmbedder:
    """An :class:`~app.embedding.Embedder` that runs ``inner`` only on texts not cached.

    What else the model offers (``token_counts``, ``precision_choice``, ``prompts``)
    is ``inner``'s.
    """

    def __init__(self, inner: Embedder, cache: EmbeddingCache) -> None:
        self.inner = inner
        self.cache = cache
        self.model_name = inner.model_name
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.max_seq_length = inner.max_seq_length
        self._identity = vector_identity(inner).encode()
        # A backend that says which prompt each input type gets: the key holds
        # the prompt (what the model reads), so equal prompts share entries.
        # Otherwise the input type itself.
        prompts = getattr(_unwrapped(inner), "prompts", None)
        self._prompts: dict[str, str] | None = (
            dict(prompts) if isinstance(prompts, dict) else None
        )

    def keys(self, texts: list[str], input_type: InputType) -> list[bytes]:
        """The cache key of each text embedded as ``input_type``."""
        side = (
            "prompt\0" + self._prompts.get(input_type, "")
            if self._prompts is not None
            else "input type\0" + input_type
        )
        base = hashlib.blake2b(digest_size=_KEY_BYTES)
        base.update(self._identity + b"\0" + side.encode("utf-8", "surrogatepass"))
        base.update(b"\0")
        keys = []
        for text in texts:
            digest = base.copy()
            digest.update(text.encode("utf-8", "surrogatepass"))
            keys.append(digest.digest())
        return keys

    def lookup(self, texts: list[str], input_type: InputType) -> EmbeddingBatch | None:
        """The batch of ``texts`` if every one is cached (cheap: no model), else None."""
        if not texts:
            return None
        rows = self.cache.get_all(self.keys(texts, input_type), input_type)
        return None if rows is None else _batch(rows, self.dim)

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        """Embed ``texts`` in order; only those not cached go through the model."""
        if not texts:
            return self.inner.embed(texts, input_type)
        keys = self.keys(texts, input_type)
        rows = self.cache.get(keys, input_type)
        # The texts not cached, each once (a text repeated in a request, too).
        todo: dict[bytes, str] = {}
        for key, text, row in zip(keys, texts, rows, strict=True):
            if row is None:
                todo.setdefault(key, text)
        computed: dict[bytes, _Row] = {}
        if todo:
            fresh = self.inner.embed(list(todo.values()), input_type)
            self.cache.put(list(todo), fresh)
            computed = {key: _row(fresh, j) for j, key in enumerate(todo)}
        return _batch(
            [
                computed[key] if row is None else row
                for row, key in zip(rows, keys, strict=True)
            ],
            self.dim,
        )

    def token_counts(self, texts: list[str]) -> NDArray[np.int64]:
        """The model's token counts (no forward pass, nothing cached)."""
        return self.inner.token_counts(texts)

    def __getattr__(self, name: str) -> Any:
        # Anything beyond the protocol (precision_choice, prompts) is the model's.
        return getattr(self.inner, name)


def _row(batch: EmbeddingBatch, i: int) -> _Row:
    return _Row(
        batch.vectors[i],
        float(batch.norms[i]),
        int(batch.n_tokens[i]),
        bool(batch.truncated[i]),
    )


def _batch(rows: list[_Row], dim: int) -> EmbeddingBatch:
    if not rows:
        return EmbeddingBatch.empty(dim)
    return EmbeddingBatch(
        vectors=np.stack([row.vector for row in rows]).astype(np.float32, copy=False),
        norms=np.array([row.norm for row in rows], dtype=np.float64),
        n_tokens=np.array([row.n_tokens for row in rows], dtype=np.int64),
        truncated=np.array([row.truncated for row in rows], dtype=bool),
    )


def cached(
    embedder: Embedder, texts: list[str], input_type: InputType
) -> EmbeddingBatch | None:
    """The batch of ``texts`` if ``embedder`` caches and holds every one, else None."""
    if isinstance(embedder, CachedEmbedder):
        return embedder.lookup(texts, input_type)
    return None
