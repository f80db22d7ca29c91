"""Parallel upserts and searches on one collection stay consistent.

Writers upsert (and re-upsert) batches while readers search, through the real ASGI
stack in-process, until enough work is done (the run ends on counts, never on a
clock, so a busy machine only makes it slower). Afterwards every acknowledged
document is searchable and SQLite and FAISS agree; during the run no search returned
an id twice or a hit whose text is not that document's text; and the event loop
stayed free: CPU work ran on pool threads, and ``/healthz`` answered 200 while an
embedding call was running (how fast it answers is measured by
``benchmarks/load.py``).
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
import time

import httpx
import pytest
from asgi_lifespan import LifespanManager

from app.api.app import create_app
from app.collections.registry import Collection
from app.settings import Settings

MIN_ACKED = 96  # documents acknowledged; writers stop once every goal is met
MIN_SEARCHES = 30
MIN_DELETED = 8
SAFETY_S = 300.0  # only bounds a hang; the goals are counts
DELETER = 9_000_000  # id range of the deleter's documents
WORDS = (
    "river mountain protein galaxy violin harbour enzyme glacier poem lantern "
    "orbit falcon copper meadow circuit thunder saffron vaccine canyon marble"
).split()


def _text(i: int) -> str:
    rng = random.Random(i)
    return f"record {i}: " + " ".join(rng.choice(WORDS) for _ in range(10))


@pytest.fixture
def anyio_backend():
    return "asyncio"


class ThreadRecordingEmbedder:
    """The real embedder, noting which thread each call ran on and counting calls
    started and finished (to tell whether one is running)."""

    def __init__(self, inner):
        self.inner = inner
        self.model_name, self.dim = inner.model_name, inner.dim
        self.model_id = inner.model_id
        self.max_seq_length = inner.max_seq_length
        self.threads: set[str] = set()
        self.started = self.finished = 0
        self._lock = threading.Lock()

    def embed(self, texts, input_type):
        self.threads.add(threading.current_thread().name)
        with self._lock:
            self.started += 1
        try:
            return self.inner.embed(texts, input_type)
        finally:
            with self._lock:
                self.finished += 1

    def token_counts(self, texts):
        return self.inner.token_counts(texts)


@pytest.mark.slow
@pytest.mark.anyio
async def test_parallel_upserts_and_searches_stay_consistent(
    tmp_path, embedder, monkeypatch
):
    settings = Settings(data_dir=tmp_path / "data", worker_threads=2)
    recording = ThreadRecordingEmbedder(embedder)
    app = create_app(settings, embedder=recording)
    cpu_threads: set[str] = set()
    original = {name: getattr(Collection, name) for name in ("search", "upsert")}

    def recorded(name):
        def call(self, *args, **kwargs):
            cpu_threads.add(threading.current_thread().name)
            return original[name](self, *args, **kwargs)

        return call

    for name in original:
        monkeypatch.setattr(Collection, name, recorded(name))
    acked: set[int] = set()
    kept: set[int] = set()  # the deleter's documents still stored
    errors: list[str] = []
    searches = deleted = 0
    pings = pings_during_embedding = 0
    safety = time.monotonic() + SAFETY_S

    def running() -> bool:
        met = (
            len(acked) >= MIN_ACKED
            and searches >= MIN_SEARCHES
            and pings_during_embedding >= 1
            and deleted >= MIN_DELETED
        )
        return not met and not errors and time.monotonic() < safety

    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", timeout=60
        ) as client:
            r = await client.post("/v1/collections", json={"name": "c"})
            assert r.status_code == 201

            async def writer(w: int) -> None:
                n = 0
                rng = random.Random(w)
                while running():
                    fresh = [w * 100_000 + n + j for j in range(4)]
                    n += 4
                    # Re-upsert two acknowledged ids too: replace = FAISS remove+add.
                    again = rng.sample(sorted(acked), min(2, len(acked)))
                    ids = fresh + [i for i in again if i not in fresh]
                    docs = [{"id": str(i), "text": _text(i)} for i in ids]
                    r = await client.put(
                        "/v1/collections/c/documents", json={"documents": docs}
                    )
                    if r.status_code != 200:
                        errors.append(f"upsert {r.status_code} {r.text}")
                        continue
                    acked.update(ids)

            async def deleter() -> None:
                """Adds two documents of its own, then deletes one of them."""
                nonlocal deleted
                n = 0
                while running():
                    ids = [DELETER + n, DELETER + n + 1]
                    n += 2
                    docs = [{"id": str(i), "text": _text(i)} for i in ids]
                    r = await client.put(
                        "/v1/collections/c/documents", json={"documents": docs}
                    )
                    if r.status_code != 200:
                        errors.append(f"upsert {r.status_code} {r.text}")
                        continue
                    kept.update(ids)
                    r = await client.delete(f"/v1/collections/c/documents/{ids[0]}")
                    if r.status_code != 204:
                        errors.append(f"delete {r.status_code} {r.text}")
                        continue
                    kept.discard(ids[0])
                    deleted += 1

            async def reader(s: int) -> None:
                nonlocal searches
                rng = random.Random(1000 + s)
                while running():
                    query = " ".join(rng.choice(WORDS) for _ in range(4))
                    mode = ("dense", "lexical", "hybrid")[searches % 3]
                    r = await client.post(
                        "/v1/collections/c/search",
                        json={
                            "query": query,
                            "k": 20,
                            "include_text": True,
                            "mode": mode,
                        },
                    )
                    if r.status_code != 200:
                        errors.append(f"search {r.status_code} {r.text}")
                        continue
                    hits = r.json()["hits"]
                    ids = [h["id"] for h in hits]
                    if len(ids) != len(set(ids)):
                        errors.append(f"duplicate ids {ids}")
                    for h in hits:
                        if h["text"] != _text(int(h["id"])):
                            errors.append(f"text mismatch for {h['id']}")
                        if mode == "lexical" and h["bm25"] <= 0:
                            errors.append(f"lexical hit without a query word {h}")
                    searches += 1

            async def pinger() -> None:
                nonlocal pings, pings_during_embedding
                while running():
                    started_before = recording.started
                    r = await client.get("/healthz")
                    assert r.status_code == 200
                    pings += 1
                    # Fewer calls finished than had started before the ping: one of
                    # them ran all through it, on a pool thread, as the loop served.
                    if recording.finished < started_before:
                        pings_during_embedding += 1
                    await asyncio.sleep(0.01)

            await asyncio.gather(
                *(writer(w) for w in range(3)),
                *(reader(s) for s in range(3)),
                deleter(),
                pinger(),
            )

            assert not errors, errors[:5]
            assert len(acked) >= MIN_ACKED and searches >= MIN_SEARCHES
            assert pings_during_embedding >= 1, (pings, "no ping while embedding")
            assert deleted >= MIN_DELETED
            info = (await client.get("/v1/collections/c")).json()
            stored = len(acked) + len(kept)
            assert info["documents"] == info["indexed"] == stored
            assert info["lexical_indexed"] == stored

            # Every acknowledged document is found by its own text.
            ordered = sorted(acked)
            for start in range(0, len(ordered), 32):
                chunk = ordered[start : start + 32]
                r = await client.post(
                    "/v1/collections/c/search",
                    json={"queries": [_text(i) for i in chunk], "k": 3},
                )
                assert r.status_code == 200, r.text
                for i, result in zip(chunk, r.json()["results"], strict=True):
                    assert str(i) in [h["id"] for h in result["hits"]], i

    # Deleted and replaced texts left no postings behind: FTS5's own check passes,
    # and a word every text holds matches exactly the stored documents.
    conn = sqlite3.connect(settings.data_dir / "c.sqlite3")
    try:
        conn.execute(
            "INSERT INTO documents_fts(documents_fts) VALUES('integrity-check')"
        )
        matched = conn.execute(
            "SELECT count(*) FROM documents_fts WHERE documents_fts MATCH 'record'"
        ).fetchone()[0]
    finally:
        conn.close()
    assert matched == stored

    # CPU work ran in the bounded pool, never on the event loop's thread.
    assert recording.threads and cpu_threads
    assert all(t.startswith("normcal-cpu") for t in recording.threads | cpu_threads)
