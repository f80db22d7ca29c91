"""The embedding cache (``app.embedding.cache``): no forward pass for a text seen
before, bounded by entries and bytes, never another model's or precision's vector.

The bounds and the keys are pure logic, tested on small arrays; what the cache gives
back is checked against the real model (fp32 and mixed precision side by side in one
cache); the batcher test holds the only lane open with a gate and shows a cached
request answered meanwhile, without the pool.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import tracemalloc

import numpy as np
import pytest

from app.concurrency import CpuPool
from app.embedding import EmbeddingBatch, InputType
from app.embedding.batching import EmbedBatcher
from app.embedding.cache import (
    ENTRY_OVERHEAD,
    CachedEmbedder,
    EmbeddingCache,
    entry_bytes,
    vector_identity,
)
from app.embedding.precision import PrecisionChoice
from app.settings import default_model_path

DEADLINE_S = 60.0  # only bounds a hang
TEXTS = [
    "does aspirin prevent heart attacks?",
    "Aspirin lowers the risk of a first heart attack in adults over 50.",
    "Paris is the capital of France.",
    " ".join(["calibration of retrieval scores in RAG systems"] * 60),  # truncated
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Counting:
    """An embedder that records what reaches it and embeds with ``inner``."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[list[str]] = []
        self.model_name = inner.model_name
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.max_seq_length = inner.max_seq_length

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        self.calls.append(list(texts))
        return self.inner.embed(texts, input_type)

    def token_counts(self, texts):
        return self.inner.token_counts(texts)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _batch(n: int, dim: int = 4, start: int = 0) -> EmbeddingBatch:
    values = np.arange(start, start + n, dtype=np.float32)
    return EmbeddingBatch(
        vectors=np.repeat(values[:, None], dim, axis=1),
        norms=values.astype(np.float64) + 0.5,
        n_tokens=np.arange(n, dtype=np.int64) + 3,
        truncated=np.zeros(n, bool),
    )


def _keys(n: int, start: int = 0) -> list[bytes]:
    return [i.to_bytes(16, "big") for i in range(start, start + n)]


# -- what comes back ----------------------------------------------------------------


def test_a_text_seen_before_costs_no_forward_pass_and_comes_back_the_same(
    real_embedder,
):
    model = Counting(real_embedder)
    cached = CachedEmbedder(model, EmbeddingCache(100, 10**7))
    first = cached.embed(TEXTS[:3], "document")
    again = cached.embed([TEXTS[2], TEXTS[3], TEXTS[0]], "document")
    # Only the new text reached the model, once.
    assert model.calls == [TEXTS[:3], [TEXTS[3]]]
    fresh = real_embedder.embed([TEXTS[3]], "document")
    for got, (batch, i) in zip(
        range(3), [(first, 2), (fresh, 0), (first, 0)], strict=True
    ):
        np.testing.assert_array_equal(again.vectors[got], batch.vectors[i])
        assert again.norms[got] == batch.norms[i]
        assert again.n_tokens[got] == batch.n_tokens[i]
        assert again.truncated[got] == batch.truncated[i]
    assert again.truncated[1] and again.vectors.dtype == np.float32
    stats = cached.cache.stats()
    assert stats.hits == {"document": 2} and stats.misses == {"document": 4}
    assert stats.entries == 4 and stats.evictions == 0


def test_a_text_repeated_in_one_request_goes_through_the_model_once(real_embedder):
    model = Counting(real_embedder)
    cached = CachedEmbedder(model, EmbeddingCache(100, 10**7))
    batch = cached.embed([TEXTS[0], TEXTS[1], TEXTS[0]], "query")
    assert model.calls == [[TEXTS[0], TEXTS[1]]]
    np.testing.assert_array_equal(batch.vectors[0], batch.vectors[2])
    assert len(batch) == 3 and cached.embed([], "query").vectors.shape == (0, 384)


def test_one_cache_never_returns_another_precisions_vector(real_embedder):
    """fp32 and mixed precision of the same model files, sharing one cache: each
    gets its own vectors, as its uncached model computes them."""
    from app.embedding import SentenceTransformerEmbedder

    mixed = SentenceTransformerEmbedder(
        default_model_path(), model_name=real_embedder.model_name, precision="mixed"
    )
    assert mixed.model_id == real_embedder.model_id  # same files, another precision
    shared = EmbeddingCache(100, 10**7)
    as_fp32 = CachedEmbedder(real_embedder, shared)
    as_mixed = CachedEmbedder(mixed, shared)
    assert as_fp32.keys(TEXTS, "query") != as_mixed.keys(TEXTS, "query")
    fp32_first = as_fp32.embed(TEXTS, "query")
    mixed_after = as_mixed.embed(TEXTS, "query")
    assert shared.stats().hits == {"query": 0}  # the second model found nothing
    np.testing.assert_array_equal(mixed_after.norms, mixed.embed(TEXTS, "query").norms)
    assert not np.array_equal(mixed_after.norms, fp32_first.norms)
    np.testing.assert_array_equal(as_fp32.embed(TEXTS, "query").norms, fp32_first.norms)


class _Stub:
    """What :func:`vector_identity` reads of a model (pure logic)."""

    model_name = "m"
    model_id = "sha256:1"
    dim = 4
    max_seq_length = 8

    def __init__(self, choice: PrecisionChoice | None = None, **changes) -> None:
        if choice is not None:
            self.precision_choice = choice
        for name, value in changes.items():
            setattr(self, name, value)


class _OtherBackend(_Stub):
    pass


def test_the_identity_holds_what_changes_a_vector():
    base = vector_identity(_Stub())
    for other in (
        _Stub(model_id="sha256:2"),
        _Stub(max_seq_length=16),
        _Stub(dim=8),
        _Stub(PrecisionChoice("mixed", "self-check passed")),
        # The same precision run eagerly or through a traced graph.
        _Stub(PrecisionChoice("mixed", "texts run a traced mixed graph")),
        _OtherBackend(),
    ):
        assert vector_identity(other) != base
    # A wrapper (metrics, another cache) is seen through to the model.
    assert vector_identity(CachedEmbedder(_Stub(), EmbeddingCache(1, 10**6))) == base


def test_the_prompt_is_in_the_key_not_the_input_type():
    """Equal prompts: a passage embedded as a document serves it as a query."""
    plain = CachedEmbedder(_Stub(prompts={}), EmbeddingCache(10, 10**6))
    assert plain.keys(["x"], "query") == plain.keys(["x"], "document")
    e5 = CachedEmbedder(
        _Stub(prompts={"query": "query: ", "document": "passage: "}),
        EmbeddingCache(10, 10**6),
    )
    assert e5.keys(["x"], "query") != e5.keys(["x"], "document")
    # A model without prompts keys by input type (it may treat them apart).
    bare = CachedEmbedder(_Stub(), EmbeddingCache(10, 10**6))
    assert bare.keys(["x"], "query") != bare.keys(["x"], "document")
    assert bare.keys(["x"], "query") != bare.keys(["x "], "query")


# -- bounds -------------------------------------------------------------------------


def test_bounded_by_entries_at_the_bound_and_one_past():
    cache = EmbeddingCache(max_entries=3, max_bytes=10**6)
    cache.put(_keys(3), _batch(3))
    assert cache.stats().entries == 3 and cache.stats().evictions == 0
    cache.get(_keys(1), "query")  # key 0 is now the most recently used
    cache.put(_keys(1, start=3), _batch(1, start=3))
    stats = cache.stats()
    assert stats.entries == 3 and stats.evictions == 1
    held = cache.get(_keys(4), "query")
    assert [row is not None for row in held] == [True, False, True, True]


def test_bounded_by_bytes_at_the_bound_and_one_past():
    one = entry_bytes(np.zeros(4, np.float32))
    assert one == 4 * 4 + 16 + ENTRY_OVERHEAD
    cache = EmbeddingCache(max_entries=100, max_bytes=3 * one)
    cache.put(_keys(3), _batch(3))
    assert cache.stats().bytes == 3 * one and cache.stats().evictions == 0
    cache.put(_keys(1, start=3), _batch(1, start=3))
    stats = cache.stats()
    assert stats.bytes == 3 * one and stats.entries == 3 and stats.evictions == 1
    assert cache.get(_keys(1), "query") == [None]  # the oldest went
    # Storing a key again replaces it without counting it twice.
    cache.put(_keys(1, start=3), _batch(1, start=3))
    assert cache.stats().bytes == 3 * one and cache.stats().entries == 3


def test_an_entry_larger_than_the_byte_bound_is_not_stored():
    cache = EmbeddingCache(max_entries=10, max_bytes=entry_bytes(np.zeros(4)) - 1)
    cache.put(_keys(1), _batch(1, dim=1))  # small: fits
    cache.put(_keys(1, start=1), _batch(1, dim=1000))
    stats = cache.stats()
    assert stats.entries == 1 and stats.evictions == 0
    assert stats.bytes <= stats.max_bytes


def test_the_counted_bytes_cover_the_memory_the_entries_take():
    """The byte bound holds in fact: what tracemalloc sees the entries allocate
    (vectors, keys, rows, the dict) is within the bytes the cache counts."""
    n, dim = 2000, 384
    cache = EmbeddingCache(max_entries=n, max_bytes=10**9)
    batch = _batch(n, dim)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache.put(_keys(n), batch)  # the keys too: the cache holds them
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counted = cache.stats().bytes
    assert counted == n * entry_bytes(np.zeros(dim, np.float32))
    assert grown <= counted, (grown, counted)
    # ... and the overhead is not wildly pessimistic either.
    assert grown >= 0.8 * counted, (grown, counted)


def test_a_cache_of_no_entries_or_bytes_is_refused():
    with pytest.raises(ValueError):
        EmbeddingCache(0, 10)
    with pytest.raises(ValueError):
        EmbeddingCache(10, 0)


def test_threads_sharing_a_cache_keep_its_counts_consistent():
    cache = EmbeddingCache(max_entries=50, max_bytes=10**7)

    def work(offset: int) -> None:
        for start in range(0, 200, 10):
            cache.put(_keys(10, start + offset), _batch(10, start=start + offset))
            cache.get(_keys(10, start), "document")

    threads = [threading.Thread(target=work, args=(k * 7,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S)
    stats = cache.stats()
    assert stats.entries == 50
    assert stats.bytes == 50 * entry_bytes(np.zeros(4, np.float32))
    assert sum(stats.hits.values()) + sum(stats.misses.values()) == 4 * 20 * 10


# -- the batcher --------------------------------------------------------------------


class Gated:
    """Texts are numbers (a text's norm is its number); passes wait for ``gate``."""

    model_name = "tests/gated"
    model_id = "sha256:gated"
    dim = 2
    max_seq_length = 8

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.calls: list[list[str]] = []

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        self.calls.append(list(texts))
        self.entered.set()
        assert self.gate.wait(DEADLINE_S), "the test never opened the gate"
        n = len(texts)
        return EmbeddingBatch(
            vectors=np.tile(np.float32([1.0, 0.0]), (n, 1)),
            norms=np.array([float(t) for t in texts]),
            n_tokens=np.full(n, 3, dtype=np.int64),
            truncated=np.zeros(n, dtype=bool),
        )

    def token_counts(self, texts):
        return np.full(len(texts), 3, dtype=np.int64)


@pytest.mark.anyio
async def test_a_cached_request_is_answered_while_every_lane_is_busy():
    """All of its texts cached: no queue behind the running pass, no pool job."""
    model = Gated()
    cached = CachedEmbedder(model, EmbeddingCache(100, 10**6))
    pool = CpuPool(1, 8)
    batcher = EmbedBatcher(cached, pool, max_texts=8, lanes=1)
    try:
        model.gate.set()
        await batcher.embed(["1", "2"], "document")
        model.gate.clear()
        model.entered.clear()
        running = asyncio.create_task(batcher.embed(["3"], "document"))
        assert await asyncio.to_thread(model.entered.wait, DEADLINE_S)
        # The one lane is busy with "3": a cached request does not wait for it.
        known = await asyncio.wait_for(
            batcher.embed(["2", "1"], "document"), DEADLINE_S
        )
        assert list(known.norms) == [2.0, 1.0] and not running.done()
        # A request with one text not cached queues for a pass of its misses only.
        partly = asyncio.create_task(batcher.embed(["1", "4"], "document"))
        model.gate.set()
        assert list((await partly).norms) == [1.0, 4.0]
        assert list((await running).norms) == [3.0]
        assert model.calls == [["1", "2"], ["3"], ["4"]]
    finally:
        model.gate.set()
        pool.shutdown()


# -- the service --------------------------------------------------------------------


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_service_caches_every_path_and_reports_it_in_metrics(
    real_embedder, tmp_path
):
    """Upsert, search, /v1/embed share the cache; /metrics counts hits, misses,
    evictions, entries and bytes; forward passes count only the misses."""
    from fastapi.testclient import TestClient

    from app.api.app import create_app
    from app.settings import Settings

    one = entry_bytes(np.zeros(real_embedder.dim, np.float32))
    settings = Settings(
        data_dir=tmp_path / "data", embed_cache_entries=3, embed_cache_bytes=10**6
    )
    with TestClient(create_app(settings, embedder=real_embedder)) as client:
        assert client.post("/v1/collections", json={"name": "kb"}).status_code == 201
        docs = [{"id": str(i), "text": t} for i, t in enumerate(TEXTS[1:3])]
        r = client.put("/v1/collections/kb/documents", json={"documents": docs})
        assert r.status_code == 200, r.text
        # The documents' texts again, through another route and input type: hits.
        r = client.post("/v1/embed", json={"texts": TEXTS[1:3], "input_type": "query"})
        assert r.status_code == 200, r.text
        # A new query: a miss, and the cache (3 entries) evicts nothing yet.
        r = client.post("/v1/collections/kb/search", json={"query": TEXTS[0], "k": 2})
        assert r.status_code == 200, r.text
        # One more text: the least recently used goes.
        assert client.post("/v1/embed", json={"texts": [TEXTS[3]]}).status_code == 200
        s = _samples(client.get("/metrics").text)
    hits = "normcal_embedding_cache_hits_total"
    misses = "normcal_embedding_cache_misses_total"
    assert s[(hits, (("input_type", "query"),))] == 2
    assert s[(misses, (("input_type", "document"),))] == 3
    assert s[(misses, (("input_type", "query"),))] == 1
    assert s[("normcal_embedding_cache_evictions_total", ())] == 1
    assert s[("normcal_embedding_cache_entries", ())] == 3
    assert s[("normcal_embedding_cache_bytes", ())] == 3 * one
    assert s[("normcal_embedding_cache_max_entries", ())] == 3
    assert s[("normcal_embedding_cache_max_bytes", ())] == 10**6
    # Forward passes: the misses only.
    embedded = "normcal_embedded_texts_total"
    assert s[(embedded, (("input_type", "document"),))] == 3
    assert s[(embedded, (("input_type", "query"),))] == 1


def test_a_cache_bound_of_zero_turns_it_off(real_embedder, tmp_path):
    from fastapi.testclient import TestClient

    from app.api.app import create_app
    from app.settings import Settings

    for off in ({"embed_cache_entries": 0}, {"embed_cache_bytes": 0}):
        settings = Settings(data_dir=tmp_path / "data", **off)
        with TestClient(create_app(settings, embedder=real_embedder)) as client:
            for _ in range(2):
                assert (
                    client.post("/v1/embed", json={"texts": ["x"]}).status_code == 200
                )
            s = _samples(client.get("/metrics").text)
            context = client.app_state["service"].context
        assert not isinstance(context.embedder, CachedEmbedder)
        assert not any(name.startswith("normcal_embedding_cache") for name, _ in s)
        assert s[("normcal_embedded_texts_total", (("input_type", "document"),))] == 2
