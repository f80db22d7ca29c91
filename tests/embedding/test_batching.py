"""Batching across requests (``app.embedding.batching``).

Unit tests hold a pass open with a gate (a ``threading.Event`` the fake model waits
on), queue requests behind it, and check what the next pass contained; they wait
on events and on the batcher's queue, never on a clock. The last test runs
concurrent searches through the HTTP app with the real model.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from app.concurrency import CpuPool
from app.embedding import EmbeddingBatch, InputType
from app.embedding.batching import EmbedBatcher
from app.exceptions import OverloadedError

DEADLINE_S = 60.0  # only bounds a hang


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class GatedEmbedder:
    """Texts are numbers; a text's norm is its number, so results show whose they
    are. Every call waits for ``gate``; ``"bad"`` in a call fails it."""

    model_name = "tests/gated"
    model_id = "sha256:gated"
    dim = 2
    max_seq_length = 8

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.calls: list[tuple[list[str], InputType]] = []

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        self.calls.append((list(texts), input_type))
        self.entered.set()
        assert self.gate.wait(DEADLINE_S), "the test never opened the gate"
        if "bad" in texts:
            raise ValueError("cannot embed 'bad'")
        n = len(texts)
        return EmbeddingBatch(
            vectors=np.tile(np.float32([1.0, 0.0]), (n, 1)),
            norms=np.array([float(t) for t in texts]),
            n_tokens=np.full(n, 3, dtype=np.int64),
            truncated=np.zeros(n, dtype=bool),
        )


async def until(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` until it holds (bounded by a generous deadline)."""
    for _ in range(int(DEADLINE_S / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never held")


@pytest.fixture
def model() -> Iterator[GatedEmbedder]:
    fake = GatedEmbedder()
    yield fake
    fake.gate.set()  # never leave a pool thread waiting


@pytest.fixture
async def pool() -> AsyncIterator[CpuPool]:
    cpu = CpuPool(2, 64)
    yield cpu
    cpu.shutdown()


def norms(batch: EmbeddingBatch) -> list[float]:
    return batch.norms.tolist()


async def blocked_first_pass(
    batcher: EmbedBatcher, model: GatedEmbedder
) -> asyncio.Task[EmbeddingBatch]:
    """A request whose pass is running and held at the gate."""
    first = asyncio.create_task(batcher.embed(["0"], "query"))
    await until(model.entered.is_set)
    return first


def start(
    batcher: EmbedBatcher, *requests: tuple[list[str], InputType]
) -> list[asyncio.Task[EmbeddingBatch]]:
    return [asyncio.create_task(batcher.embed(t, kind)) for t, kind in requests]


async def queued(batcher: EmbedBatcher, n: int) -> None:
    await until(lambda: batcher.pending == n)


@pytest.mark.anyio
async def test_idle_request_starts_its_pass_at_once_whatever_the_window(model, pool):
    # A window far longer than the deadline: if an idle request waited for company,
    # the pass would not start before `until` gives up.
    batcher = EmbedBatcher(model, pool, max_texts=32, window=10 * DEADLINE_S)
    task = asyncio.create_task(batcher.embed(["7", "8"], "query"))
    await until(model.entered.is_set)
    assert model.calls == [(["7", "8"], "query")]
    model.gate.set()
    assert norms(await task) == [7.0, 8.0]


@pytest.mark.anyio
async def test_requests_queued_behind_a_pass_share_the_next_one_in_order(model, pool):
    batcher = EmbedBatcher(model, pool, max_texts=32)
    first = await blocked_first_pass(batcher, model)
    tasks = start(batcher, *[([str(i), str(i + 100)], "query") for i in range(1, 9)])
    await queued(batcher, 8)
    model.gate.set()
    assert norms(await first) == [0.0]
    for i, task in enumerate(tasks, start=1):
        assert norms(await task) == [float(i), float(i + 100)]
    second = [t for i in range(1, 9) for t in (str(i), str(i + 100))]
    assert model.calls == [(["0"], "query"), (second, "query")]


@pytest.mark.anyio
async def test_a_full_pass_does_not_wait_out_the_window(model, pool):
    batcher = EmbedBatcher(model, pool, max_texts=2, window=10 * DEADLINE_S)
    first = await blocked_first_pass(batcher, model)
    tasks = start(batcher, (["1"], "query"), (["2"], "query"))
    await queued(batcher, 2)
    model.gate.set()
    await first
    assert [norms(await t) for t in tasks] == [[1.0], [2.0]]
    assert model.calls[1] == (["1", "2"], "query")


@pytest.mark.anyio
async def test_input_types_are_never_mixed_in_a_pass(model, pool):
    batcher = EmbedBatcher(model, pool, max_texts=32)
    first = await blocked_first_pass(batcher, model)
    kinds: list[InputType] = ["document", "query", "document", "query"]
    tasks = start(batcher, *[([str(i)], k) for i, k in enumerate(kinds, start=1)])
    await queued(batcher, 4)
    model.gate.set()
    await first
    assert [norms(await t) for t in tasks] == [[1.0], [2.0], [3.0], [4.0]]
    assert model.calls[1:] == [(["1", "3"], "document"), (["2", "4"], "query")]


@pytest.mark.anyio
async def test_passes_hold_at_most_max_texts_and_long_requests_go_in_chunks(
    model, pool
):
    batcher = EmbedBatcher(model, pool, max_texts=3)
    first = await blocked_first_pass(batcher, model)
    pair, seven = start(
        batcher, (["1", "2"], "query"), ([str(i) for i in range(10, 17)], "query")
    )
    await queued(batcher, 2)  # the pair and the first chunk of the seven
    model.gate.set()
    await first
    assert norms(await pair) == [1.0, 2.0]
    assert norms(await seven) == [float(i) for i in range(10, 17)]
    assert all(len(texts) <= 3 for texts, _ in model.calls)
    assert [t for texts, _ in model.calls[1:] for t in texts] == [
        "1", "2", "10", "11", "12", "13", "14", "15", "16"
    ]  # fmt: skip


@pytest.mark.anyio
async def test_a_failing_request_fails_alone(model, pool):
    batcher = EmbedBatcher(model, pool, max_texts=32)
    first = await blocked_first_pass(batcher, model)
    good1, bad, good2 = start(
        batcher, (["1"], "query"), (["bad"], "query"), (["3"], "query")
    )
    await queued(batcher, 3)
    model.gate.set()
    await first
    assert norms(await good1) == [1.0]
    assert norms(await good2) == [3.0]
    with pytest.raises(ValueError, match="cannot embed"):
        await bad
    # The shared pass failed, then each request ran alone.
    assert [texts for texts, _ in model.calls[1:]] == [
        ["1", "bad", "3"],
        ["1"],
        ["bad"],
        ["3"],
    ]


@pytest.mark.anyio
async def test_cancelled_callers_leave_the_others_served(model, pool):
    batcher = EmbedBatcher(model, pool, max_texts=32)
    running = await blocked_first_pass(batcher, model)  # its caller gives up mid-pass
    a, waiting, c = start(batcher, (["1"], "query"), (["2"], "query"), (["3"], "query"))
    await queued(batcher, 3)
    waiting.cancel()  # gives up while queued
    running.cancel()
    await queued(batcher, 2)
    model.gate.set()
    assert norms(await a) == [1.0]
    assert norms(await c) == [3.0]
    assert waiting.cancelled() and running.cancelled()
    assert model.calls[1] == (["1", "3"], "query")
    # The batcher still serves new requests afterwards.
    assert norms(await batcher.embed(["5"], "query")) == [5.0]


@pytest.mark.anyio
async def test_queue_bound_accepted_at_the_limit_refused_past_it(model, pool):
    # Three in flight: the running pass's request and two queued behind it.
    batcher = EmbedBatcher(model, pool, max_texts=32, max_queued=3)
    first = await blocked_first_pass(batcher, model)
    tasks = start(batcher, (["1"], "query"), (["2"], "query"))
    await queued(batcher, 2)
    with pytest.raises(OverloadedError):
        await batcher.embed(["3"], "query")
    model.gate.set()
    await first
    assert [norms(await t) for t in tasks] == [[1.0], [2.0]]


@pytest.mark.anyio
async def test_lanes_run_passes_side_by_side_and_queue_the_rest(model, pool):
    # Two lanes: the second request gets a pass of its own while the first one's
    # runs; the requests after them wait and share the next free lane's pass.
    batcher = EmbedBatcher(model, pool, max_texts=32, lanes=2)
    first = await blocked_first_pass(batcher, model)
    second = asyncio.create_task(batcher.embed(["1"], "query"))
    await until(lambda: len(model.calls) == 2)
    rest = start(batcher, (["2"], "query"), (["3"], "query"))
    await queued(batcher, 2)
    model.gate.set()
    assert [norms(await t) for t in (first, second, *rest)] == [
        [0.0],
        [1.0],
        [2.0],
        [3.0],
    ]
    assert model.calls[:2] == [(["0"], "query"), (["1"], "query")]
    assert (["2", "3"], "query") in model.calls[2:]


@pytest.mark.anyio
async def test_an_idle_batcher_lends_a_lane_and_others_use_the_rest(model, pool):
    batcher = EmbedBatcher(model, pool, max_texts=32, lanes=2)
    with batcher.lane() as alone:
        assert alone
        # One lane left: the next request starts its pass at once...
        first = asyncio.create_task(batcher.embed(["1"], "query"))
        await until(model.entered.is_set)
        # ...and none is left for another caller, nor for another pass.
        with batcher.lane() as again:
            assert not again
        queued_one = asyncio.create_task(batcher.embed(["2"], "query"))
        await queued(batcher, 1)
    model.gate.set()
    assert norms(await first) == [1.0]
    assert norms(await queued_one) == [2.0]


@pytest.mark.anyio
async def test_a_request_queued_behind_a_lent_lane_runs_when_it_is_returned(
    model, pool
):
    # One lane, lent out: a request can only queue; returning the lane starts it.
    model.gate.set()
    batcher = EmbedBatcher(model, pool, max_texts=32, lanes=1)
    with batcher.lane() as alone:
        assert alone
        task = asyncio.create_task(batcher.embed(["5"], "query"))
        await queued(batcher, 1)
        assert model.calls == []
    assert norms(await task) == [5.0]


@pytest.mark.anyio
async def test_no_lane_while_requests_queue_or_when_not_wanted(model, pool):
    batcher = EmbedBatcher(model, pool, max_texts=32, lanes=1)
    first = await blocked_first_pass(batcher, model)
    with batcher.lane() as alone:
        assert not alone
    model.gate.set()
    await first
    with batcher.lane(wanted=False) as alone:
        assert not alone
    with batcher.lane() as alone:
        assert alone  # idle again
    off = EmbedBatcher(model, pool, max_texts=32, enabled=False)
    with off.lane() as alone, off.lane() as also:
        assert alone and also  # no batching: every request is alone


def test_lanes_follow_threads_per_pass_and_the_pool(monkeypatch):
    from app.embedding import batching

    monkeypatch.setattr(batching.os, "cpu_count", lambda: 4)
    assert batching.lanes_for(threads=1, workers=8) == 4
    assert batching.lanes_for(threads=2, workers=8) == 2
    assert batching.lanes_for(threads=1, workers=2) == 2  # the pool runs them
    assert batching.lanes_for(threads=0, workers=8) == 1  # a pass uses every core
    assert batching.lanes_for(threads=8, workers=8) == 1


@pytest.mark.anyio
async def test_disabled_embeds_each_request_alone(model, pool):
    model.gate.set()
    batcher = EmbedBatcher(model, pool, max_texts=32, enabled=False)
    results = await asyncio.gather(
        *(batcher.embed([str(i)], "query") for i in range(4))
    )
    assert [norms(r) for r in results] == [[0.0], [1.0], [2.0], [3.0]]
    assert sorted(texts for texts, _ in model.calls) == [["0"], ["1"], ["2"], ["3"]]


# -- bulk requests: micro-batches that give way to interactive ones -------------------


class HeldEmbedder:
    """Texts are numbers (a text's norm is its number) with as many tokens as
    characters. Each call waits on its own event until the test releases it by its
    index in ``calls``, or until ``release_all`` (which lets later calls through
    too); ``"bad"`` in a call fails it."""

    model_name = "tests/held"
    model_id = "sha256:held"
    dim = 2
    max_seq_length = 64

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], InputType]] = []
        self.releases: list[threading.Event] = []
        self.free = False
        self._lock = threading.Lock()

    def token_counts(self, texts: list[str]) -> np.ndarray:
        return np.array([len(t) for t in texts], dtype=np.int64)

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        release = threading.Event()
        with self._lock:
            if self.free:
                release.set()
            self.calls.append((list(texts), input_type))
            self.releases.append(release)
        assert release.wait(DEADLINE_S), "the test never released the call"
        if "bad" in texts:
            raise ValueError("cannot embed 'bad'")
        n = len(texts)
        return EmbeddingBatch(
            vectors=np.tile(np.float32([1.0, 0.0]), (n, 1)),
            norms=np.array([float(t) for t in texts]),
            n_tokens=self.token_counts(texts),
            truncated=np.zeros(n, dtype=bool),
        )

    def release(self, *indices: int) -> None:
        for i in indices:
            self.releases[i].set()

    def release_all(self) -> None:
        with self._lock:
            self.free = True
            for release in self.releases:
                release.set()

    def kinds(self) -> list[InputType]:
        return [kind for _, kind in self.calls]


@pytest.fixture
def held() -> Iterator[HeldEmbedder]:
    fake = HeldEmbedder()
    yield fake
    fake.release_all()  # never leave a pool thread waiting


@pytest.fixture
async def bulk_pool() -> AsyncIterator[CpuPool]:
    """The bulk side's own threads, as the service has them."""
    cpu = CpuPool(2, 64)
    yield cpu
    cpu.shutdown()


DOCS = [str(i) for i in range(10, 22)]  # twelve texts of two tokens


@pytest.mark.anyio
async def test_a_query_is_answered_before_a_bulk_requests_remaining_micro_batches(
    held, pool, bulk_pool
):
    # One lane, micro-batches of 4 tokens: the twelve documents go two by two.
    batcher = EmbedBatcher(
        held, pool, max_texts=32, max_tokens=4, lanes=1, bulk_pool=bulk_pool
    )
    docs = asyncio.create_task(batcher.embed(DOCS, "document", priority="bulk"))
    await until(lambda: len(held.calls) == 1)  # the first micro-batch, held
    query = asyncio.create_task(batcher.embed(["7"], "query"))
    await until(lambda: len(held.calls) == 2)
    assert held.calls[1] == (["7"], "query")  # started beside it, not after it
    held.release(1)
    assert norms(await query) == [7.0]
    assert not docs.done() and batcher.bulk_pending == 5
    held.release_all()
    assert norms(await docs) == [float(t) for t in DOCS]
    assert held.kinds() == ["document", "query"] + ["document"] * 5
    assert all(len(texts) == 2 for texts, kind in held.calls if kind == "document")


@pytest.mark.anyio
async def test_bulk_lanes_make_room_for_interactive_passes_and_take_it_back(
    held, pool, bulk_pool
):
    batcher = EmbedBatcher(
        held, pool, max_texts=32, max_tokens=4, lanes=2, bulk_pool=bulk_pool
    )
    docs = asyncio.create_task(batcher.embed(DOCS, "document", priority="bulk"))
    await until(lambda: len(held.calls) == 2)  # both lanes on documents
    query = asyncio.create_task(batcher.embed(["7"], "query"))
    await until(lambda: len(held.calls) == 3)
    # A document micro-batch ends while the query's pass runs: its lane stops
    # there, so the next micro-batch does not start beside the query's pass.
    held.release(0)
    await until(lambda: len(batcher._bulk_drainers) == 1)
    assert held.kinds() == ["document", "document", "query"]
    held.release(2)
    assert norms(await query) == [7.0]
    # The query is answered: the second bulk lane runs again.
    await until(lambda: len(held.calls) == 4)
    assert held.kinds()[3] == "document"
    held.release_all()
    assert norms(await docs) == [float(t) for t in DOCS]


@pytest.mark.anyio
async def test_one_bulk_lane_runs_while_interactive_work_holds_every_lane(
    held, pool, bulk_pool
):
    batcher = EmbedBatcher(
        held, pool, max_texts=32, max_tokens=4, lanes=1, bulk_pool=bulk_pool
    )
    with batcher.lane() as alone:  # a search holds the only interactive lane
        assert alone
        docs = asyncio.create_task(batcher.embed(DOCS[:4], "document", "bulk"))
        await until(lambda: len(held.calls) == 1)
        held.release_all()
        assert norms(await docs) == [float(t) for t in DOCS[:4]]


@pytest.mark.anyio
async def test_micro_batches_follow_the_token_budget_longest_first(
    held, pool, bulk_pool
):
    held.release_all()
    batcher = EmbedBatcher(held, pool, max_texts=2, max_tokens=6, bulk_pool=bulk_pool)
    texts = ["1", "4444", "22", "333", "55555", "6"]
    batch = await batcher.embed(texts, "document", priority="bulk")
    assert norms(batch) == [float(t) for t in texts]  # back in the request's order
    assert batch.n_tokens.tolist() == [1, 4, 2, 3, 5, 1]
    # Rows x the longest text within 6 tokens, or one text alone; at most 2 rows.
    assert [texts for texts, _ in held.calls] == [
        ["55555"],
        ["4444"],
        ["333", "22"],
        ["1", "6"],
    ]


@pytest.mark.anyio
async def test_a_failing_bulk_request_fails_alone_and_a_cancelled_one_stops(
    held, pool, bulk_pool
):
    batcher = EmbedBatcher(
        held, pool, max_texts=32, max_tokens=6, lanes=1, bulk_pool=bulk_pool
    )
    # Micro-batches of 6 tokens: the bad request's texts share one.
    bad = asyncio.create_task(batcher.embed(["10", "bad"], "document", "bulk"))
    await until(lambda: len(held.calls) == 1)
    dropped = asyncio.create_task(batcher.embed(DOCS, "document", "bulk"))
    good = asyncio.create_task(batcher.embed(["12", "13"], "document", "bulk"))
    await until(lambda: batcher.bulk_pending == 5)
    dropped.cancel()
    await until(lambda: batcher.bulk_pending == 1)
    held.release_all()
    with pytest.raises(ValueError, match="cannot embed"):
        await bad
    assert norms(await good) == [12.0, 13.0]
    assert [texts for texts, _ in held.calls] == [["bad", "10"], ["12", "13"]]
    assert dropped.cancelled()


@pytest.mark.anyio
async def test_a_bulk_request_counts_once_in_the_bound(held, pool, bulk_pool):
    batcher = EmbedBatcher(
        held,
        pool,
        max_texts=32,
        max_tokens=4,
        lanes=1,
        max_queued=2,
        bulk_pool=bulk_pool,
    )
    first = asyncio.create_task(batcher.embed(DOCS, "document", "bulk"))
    await until(lambda: len(held.calls) == 1)  # six micro-batches, one request
    second = asyncio.create_task(batcher.embed(["7"], "query"))
    await until(lambda: len(held.calls) == 2)
    with pytest.raises(OverloadedError):
        await batcher.embed(["8"], "document", "bulk")
    held.release_all()
    assert norms(await second) == [7.0]
    assert norms(await first) == [float(t) for t in DOCS]


# -- through the HTTP app, with the real model ------------------------------------------


class GatedRealEmbedder:
    """The real model; while ``gate`` is closed, query passes wait for it. Records
    the size of every query pass."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.model_name, self.model_id = inner.model_name, inner.model_id
        self.dim, self.max_seq_length = inner.dim, inner.max_seq_length
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.query_passes: list[int] = []

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        if input_type == "query":
            self.query_passes.append(len(texts))
            self.entered.set()
            assert self.gate.wait(DEADLINE_S), "the test never opened the gate"
        return self.inner.embed(texts, input_type)

    def token_counts(self, texts: list[str]):
        return self.inner.token_counts(texts)


WORDS = (
    "protein galaxy violin harbour enzyme glacier orbit falcon copper vaccine".split()
)
QUERIES = [f"{a} {b}" for a, b in zip(WORDS, WORDS[3:] + WORDS[:3], strict=True)]


def test_concurrent_searches_return_what_sequential_ones_do(real_embedder, tmp_path):
    from fastapi.testclient import TestClient

    from app.api.app import create_app
    from app.settings import Settings

    model = GatedRealEmbedder(real_embedder)
    # The queries are searched twice: without the embedding cache, so both times
    # they reach the model.
    settings = Settings(data_dir=tmp_path / "data", embed_cache_entries=0)
    app = create_app(settings, embedder=model)
    docs = [
        {"id": f"d{i}", "text": f"{WORDS[i % 10]} and {WORDS[(i * 3) % 10]} no. {i}"}
        for i in range(40)
    ]

    def search(client: TestClient, query: str) -> list[tuple[str, float]]:
        r = client.post("/v1/collections/kb/search", json={"query": query, "k": 5})
        assert r.status_code == 200, r.text
        body = r.json()
        return [("query", body["query"]["norm"])] + [
            (h["id"], h["score"]) for h in body["hits"]
        ]

    with TestClient(app) as client:
        assert client.post("/v1/collections", json={"name": "kb"}).status_code == 201
        r = client.put("/v1/collections/kb/documents", json={"documents": docs})
        assert r.status_code == 200, r.text
        sequential = [search(client, q) for q in QUERIES]
        assert model.query_passes == [1] * len(QUERIES)

        batcher = client.app_state["service"].context.batcher
        model.gate.clear()
        model.entered.clear()
        model.query_passes.clear()
        lanes = batcher.lanes  # passes side by side (one per core, by default)
        with ThreadPoolExecutor(len(QUERIES)) as threads:
            held = []  # one search per lane, each held in its own pass
            for q in QUERIES[:lanes]:
                held.append(threads.submit(search, client, q))
                _wait_for(lambda: len(model.query_passes) == len(held))
            rest = [threads.submit(search, client, q) for q in QUERIES[lanes:]]
            _wait_for(lambda: batcher.pending == len(QUERIES) - lanes)
            model.gate.set()
            concurrent = [f.result(DEADLINE_S) for f in held + rest]
    # The queued searches shared one pass.
    assert model.query_passes == [1] * lanes + [len(QUERIES) - lanes]
    for seq, conc in zip(sequential, concurrent, strict=True):
        assert [d for d, _ in conc] == [d for d, _ in seq]
        assert np.allclose([s for _, s in conc], [s for _, s in seq], atol=1e-5)


def _wait_for(condition: Callable[[], bool]) -> None:
    """Block until ``condition`` holds (bounded by a generous deadline)."""
    done = threading.Event()
    for _ in range(int(DEADLINE_S / 0.005)):
        if condition():
            return
        done.wait(0.005)
    raise AssertionError("condition never held")


class HeldDocumentsEmbedder:
    """The real model, recording every pass (input type and token counts); while
    ``hold`` is set, document passes wait for ``gate``."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.model_name, self.model_id = inner.model_name, inner.model_id
        self.dim, self.max_seq_length = inner.dim, inner.max_seq_length
        self.hold = threading.Event()
        self.gate = threading.Event()
        self.passes: list[tuple[InputType, list[int]]] = []

    def token_counts(self, texts: list[str]):
        return self.inner.token_counts(texts)

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        self.passes.append((input_type, self.inner.token_counts(texts).tolist()))
        if input_type == "document" and self.hold.is_set():
            assert self.gate.wait(DEADLINE_S), "the test never opened the gate"
        return self.inner.embed(texts, input_type)


def test_a_search_during_an_upsert_is_answered_before_its_remaining_passes(
    real_embedder, tmp_path
):
    from fastapi.testclient import TestClient

    from app.api.app import create_app
    from app.settings import Settings

    model = HeldDocumentsEmbedder(real_embedder)
    settings = Settings(data_dir=tmp_path / "data")
    app = create_app(settings, embedder=model)
    # 24 texts of 100 words or more: a few to a pass of 512 padded tokens.
    docs = [
        {"id": f"d{i}", "text": " ".join(WORDS[(i + j) % 10] for j in range(100 + i))}
        for i in range(24)
    ]
    with TestClient(app) as client:
        assert client.post("/v1/collections", json={"name": "kb"}).status_code == 201
        first = {"documents": [{"id": "seed", "text": QUERIES[0]}]}
        assert client.put("/v1/collections/kb/documents", json=first).status_code == 200
        alone = model.inner.embed([d["text"] for d in docs], "document")
        model.passes.clear()
        model.hold.set()
        with ThreadPoolExecutor(1) as thread:
            upsert = thread.submit(
                client.put, "/v1/collections/kb/documents", json={"documents": docs}
            )
            # Its first passes, one per bulk lane, held.
            lanes = client.app_state["service"].context.batcher.lanes
            _wait_for(lambda: len(model.passes) == lanes)
            r = client.post("/v1/collections/kb/search", json={"query": QUERIES[1]})
            assert r.status_code == 200, r.text
            assert not upsert.done()
            kinds = [kind for kind, _ in model.passes]
            assert kinds == ["document"] * lanes + ["query"]
            model.gate.set()
            assert upsert.result(DEADLINE_S).status_code == 200
        kinds = [kind for kind, _ in model.passes]
        assert set(kinds[lanes + 1 :]) == {"document"}
        # Each of the upsert's passes is one micro-batch within the token budget.
        budget = settings.embed_max_batch_tokens
        document_passes = [n for kind, n in model.passes if kind == "document"]
        assert len(document_passes) >= 6
        assert all(len(n) * max(n) <= budget for n in document_passes)
        assert sum(len(n) for n in document_passes) == len(docs)
        # The stored documents are what embedding them in one call gives.
        stored = client.post(
            "/v1/collections/kb/documents/get", json={"ids": [d["id"] for d in docs]}
        ).json()["data"]
        assert np.allclose([d["norm"] for d in stored], alone.norms, rtol=1e-5)
