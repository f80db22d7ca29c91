"""Acknowledged writes survive ``kill -9``; nothing is half-written."""

from __future__ import annotations

import sqlite3
import threading

import httpx
import pytest

from tests.support.server import ServerProcess

BATCH = 4
ACKED_BEFORE_KILL = 25
WORDS = "alpha beta gamma delta kappa sigma omega lambda theta zeta".split()


def _batch(i: int) -> list[dict]:
    return [
        {
            "id": f"b{i}-{j}",
            "text": f"Record {i}-{j}: "
            + " ".join(WORDS[(i * 7 + j * 3 + n) % 10] for n in range(12)),
            "metadata": {"batch": i},
        }
        for j in range(BATCH)
    ]


@pytest.mark.server
def test_acknowledged_upserts_survive_kill_9(tmp_path):
    server = ServerProcess(tmp_path / "data").start()
    acked: list[int] = []
    attempted: list[int] = []
    stop = threading.Event()
    enough_acked = threading.Event()  # also set if the writer gives up early

    def writer() -> None:
        try:
            with httpx.Client(base_url=server.url, timeout=120) as c:
                r = c.post("/v1/collections", json={"name": "crash"})
                assert r.status_code == 201
                i = 0
                while not stop.is_set():
                    attempted.append(i)
                    # Each request also replaces the previous batch (same texts), so
                    # the kill can land mid-replacement: a delete and an insert in
                    # SQLite, the FTS5 index and FAISS alike.
                    again = _batch(i - 1) if i else []
                    try:
                        r = c.put(
                            "/v1/collections/crash/documents",
                            json={"documents": _batch(i) + again},
                        )
                    except httpx.TransportError:
                        return  # the server died mid-request
                    if r.status_code == 200:
                        acked.append(i)
                        if len(acked) == ACKED_BEFORE_KILL:
                            enough_acked.set()
                    i += 1
        finally:
            enough_acked.set()

    thread = threading.Thread(target=writer)
    try:
        thread.start()
        # An event, not a clock: the bound only stops a hang on a stuck server.
        enough_acked.wait(600)
        # The writer sends back to back, so the kill usually lands mid-request; the
        # checks below hold whether or not it does.
        server.kill()
    finally:
        stop.set()
        thread.join(120)
    assert len(acked) >= ACKED_BEFORE_KILL

    db = tmp_path / "data" / "crash.sqlite3"
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        # FTS5's own check: its postings are exactly those of the documents table.
        conn.execute(
            "INSERT INTO documents_fts(documents_fts) VALUES('integrity-check')"
        )
        fts = conn.execute("SELECT count(*) FROM documents_fts_docsize").fetchone()[0]
        rows = conn.execute("SELECT count(*) FROM documents").fetchone()[0]
        assert fts == rows
    finally:
        conn.close()

    server = ServerProcess(tmp_path / "data").start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            info = c.get("/v1/collections/crash").json()
            assert info["documents"] == info["lexical_indexed"] == info["indexed"]
            present = dict.fromkeys(attempted, 0)
            for i in attempted:
                for doc in _batch(i):
                    r = c.get(f"/v1/collections/crash/documents/{doc['id']}")
                    if r.status_code == 200:
                        assert r.json()["text"] == doc["text"]
                        present[i] += 1
            # Every acknowledged batch is whole; an unacknowledged one is all or nothing.
            assert all(present[i] == BATCH for i in acked)
            assert all(n in (0, BATCH) for n in present.values())
            assert info["documents"] == sum(present.values())
            # ... and searchable: each acknowledged text finds itself first.
            docs = [d for i in acked for d in _batch(i)]
            for start in range(0, len(docs), 32):
                chunk = docs[start : start + 32]
                r = c.post(
                    "/v1/collections/crash/search",
                    json={"queries": [d["text"] for d in chunk], "k": 1},
                )
                top = [res["hits"][0]["id"] for res in r.json()["results"]]
                assert top == [d["id"] for d in chunk]
            # ... and the BM25 index holds exactly the surviving documents.
            r = c.post(
                "/v1/collections/crash/search",
                json={"query": "record", "mode": "lexical", "k": 100},
            )
            assert len(r.json()["hits"]) == min(100, info["documents"])
    finally:
        # uvicorn re-raises the SIGTERM after its graceful shutdown
        assert server.stop() in (0, -15)
    # The lifespan closed SQLite cleanly: the last connection checkpointed the WAL away.
    assert not (tmp_path / "data" / "crash.sqlite3-wal").exists()
