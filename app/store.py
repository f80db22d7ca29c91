"""SQLite persistence of one collection: the durable truth the FAISS index derives from.

One file per collection, WAL journal. A write returns only after its transaction has
committed, so an acknowledged upsert survives a crash of the process (and, with
``synchronous=FULL``, of the machine).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS documents (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- FAISS id; never reused
    id TEXT NOT NULL UNIQUE,
    text TEXT NOT NULL,
    metadata TEXT NOT NULL,
    vector BLOB NOT NULL,                    -- float32 unit vector
    norm REAL NOT NULL,                      -- raw norm before normalisation
    n_tokens INTEGER NOT NULL,
    truncated INTEGER NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS calibrators (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    method TEXT NOT NULL,
    profile TEXT NOT NULL                    -- app.calibrators.Profile.to_json()
);
CREATE TABLE IF NOT EXISTS judgments (      -- feedback kept for the next fit
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    query TEXT NOT NULL,
    document_id TEXT NOT NULL,
    relevance INTEGER NOT NULL,
    created_at REAL NOT NULL
);
"""

MetadataValue = str | int | float | bool | None


@dataclass(frozen=True)
class NewDocument:
    """A document ready to be written: text plus its embedding."""

    id: str
    text: str
    metadata: dict[str, Any]
    vector: NDArray[np.float32]
    norm: float
    n_tokens: int
    truncated: bool


@dataclass(frozen=True)
class StoredDocument:
    """A document as read back (without its vector)."""

    seq: int
    id: str
    text: str
    metadata: dict[str, Any]
    norm: float
    n_tokens: int
    truncated: bool


class CollectionStore:
    """The SQLite file of one collection.

    A single connection is shared by the service's worker threads; ``_mutex``
    serialises its use (SQLite transactions are per connection).
    """

    def __init__(self, path: Path, *, synchronous: str = "FULL") -> None:
        self.path = path
        self._mutex = threading.Lock()
        self._conn = sqlite3.connect(
            path, check_same_thread=False, isolation_level=None, timeout=30.0
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA synchronous={synchronous}")
        self._conn.executescript(_SCHEMA)

    # -- metadata -------------------------------------------------------------------
    def get_meta(self) -> dict[str, Any]:
        """Return every meta key with its JSON-decoded value."""
        with self._mutex:
            rows = self._conn.execute("SELECT key, value FROM meta").fetchall()
        return {k: json.loads(v) for k, v in rows}

    def set_meta(self, **values: Any) -> None:
        """Set meta keys atomically."""
        with self._mutex, self._transaction():
            self._set_meta_unlocked(**values)

    def _set_meta_unlocked(self, **values: Any) -> None:
        self._conn.executemany(
            "INSERT INTO meta(key, value) VALUES(?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            [(k, json.dumps(v)) for k, v in values.items()],
        )

    # -- documents ------------------------------------------------------------------
    def upsert(self, docs: Sequence[NewDocument]) -> tuple[list[int], list[int]]:
        """Insert or replace documents in one transaction.

        Returns ``(removed_seqs, new_seqs)``: a replaced document gets a fresh ``seq``
        so that the index can drop the old vector and add the new one.
        """
        now = time.time()
        with self._mutex, self._transaction():
            ids = [d.id for d in docs]
            removed = list(self._seqs_by_id(ids).values())
            new: list[int] = []
            for d in docs:
                cur = self._conn.execute(
                    "INSERT OR REPLACE INTO documents"
                    "(id, text, metadata, vector, norm, n_tokens, truncated, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq",
                    (
                        d.id,
                        d.text,
                        json.dumps(d.metadata, ensure_ascii=False),
                        np.ascontiguousarray(d.vector, dtype=np.float32).tobytes(),
                        float(d.norm),
                        int(d.n_tokens),
                        int(d.truncated),
                        now,
                    ),
                )
                new.append(int(cur.fetchone()[0]))
        return removed, new

    def delete(self, doc_id: str) -> int | None:
        """Delete one document; return its seq, or None if it did not exist."""
        with self._mutex, self._transaction():
            row = self._conn.execute(
                "DELETE FROM documents WHERE id = ? RETURNING seq", (doc_id,)
            ).fetchone()
        return None if row is None else int(row[0])

    def get(self, doc_id: str) -> StoredDocument | None:
        """Read one document by id."""
        with self._mutex:
            row = self._conn.execute(
                f"SELECT {_COLUMNS} FROM documents WHERE id = ?", (doc_id,)
            ).fetchone()
        return None if row is None else _to_document(row)

    def get_by_seqs(self, seqs: Sequence[int]) -> dict[int, StoredDocument]:
        """Read documents by seq (unknown seqs are absent from the result)."""
        out: dict[int, StoredDocument] = {}
        with self._mutex:
            for chunk in _chunks(list(seqs), 500):
                marks = ",".join("?" * len(chunk))
                for row in self._conn.execute(
                    f"SELECT {_COLUMNS} FROM documents WHERE seq IN ({marks})", chunk
                ):
                    doc = _to_document(row)
                    out[doc.seq] = doc
        return out

    def seqs_of(self, ids: Sequence[str]) -> dict[str, int]:
        """Map document ids to seqs (unknown ids are absent)."""
        with self._mutex:
            return self._seqs_by_id(ids)

    def count(self) -> int:
        """Number of documents."""
        with self._mutex:
            return int(
                self._conn.execute("SELECT COUNT(*) FROM documents").fetchone()[0]
            )

    def filter_seqs(self, where: dict[str, MetadataValue]) -> NDArray[np.int64]:
        """Seqs of documents whose metadata equals ``where`` on every key."""
        clauses: list[str] = []
        params: list[str | int | float] = []
        for key, value in where.items():
            path = '$."' + key.replace('"', '""') + '"'
            if value is None:
                clauses.append("json_type(metadata, ?) = 'null'")
                params.append(path)
            else:
                kind = {bool: "'true','false'", str: "'text'"}.get(
                    type(value), "'integer','real'"
                )
                clauses.append(
                    f"json_type(metadata, ?) IN ({kind}) AND json_extract(metadata, ?) = ?"
                )
                params += [path, path, int(value) if isinstance(value, bool) else value]
        sql = "SELECT seq FROM documents"
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        with self._mutex:
            rows = self._conn.execute(sql, params).fetchall()
        return np.array([r[0] for r in rows], dtype=np.int64)

    def iter_vectors(
        self, batch: int = 4096
    ) -> Iterator[tuple[NDArray[np.int64], NDArray[np.float32]]]:
        """Yield ``(seqs, unit vectors)`` in chunks, for (re)building the index."""
        last = -1
        while True:
            with self._mutex:
                rows = self._conn.execute(
                    "SELECT seq, vector FROM documents WHERE seq > ? ORDER BY seq LIMIT ?",
                    (last, batch),
                ).fetchall()
            if not rows:
                return
            seqs = np.array([r[0] for r in rows], dtype=np.int64)
            vectors = np.stack([np.frombuffer(r[1], dtype=np.float32) for r in rows])
            last = int(seqs[-1])
            yield seqs, vectors

    def norm_sample(
        self, limit: int = 5000
    ) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
        """Raw norms and token counts of up to ``limit`` documents (for norm references)."""
        with self._mutex:
            rows = self._conn.execute(
                "SELECT norm, n_tokens FROM documents ORDER BY seq LIMIT ?", (limit,)
            ).fetchall()
        return (
            np.array([r[0] for r in rows], dtype=np.float64),
            np.array([r[1] for r in rows], dtype=np.int64),
        )

    # -- calibrators and judgments ------------------------------------------------------
    def save_calibrator(
        self, calibrator_id: str, method: str, profile: dict[str, Any], *, active: bool
    ) -> None:
        """Store a fitted profile, and make it the active one in the same transaction."""
        with self._mutex, self._transaction():
            self._conn.execute(
                "INSERT INTO calibrators(id, created_at, method, profile) VALUES (?, ?, ?, ?)",
                (calibrator_id, time.time(), method, json.dumps(profile)),
            )
            if active:
                self._set_meta_unlocked(active_calibrator=calibrator_id)

    def load_calibrator(self, calibrator_id: str) -> dict[str, Any] | None:
        """The stored profile JSON of a calibrator, or None."""
        with self._mutex:
            row = self._conn.execute(
                "SELECT profile FROM calibrators WHERE id = ?", (calibrator_id,)
            ).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def list_calibrators(self) -> list[dict[str, Any]]:
        """Every stored profile JSON, oldest first."""
        with self._mutex:
            rows = self._conn.execute(
                "SELECT profile FROM calibrators ORDER BY created_at, id"
            ).fetchall()
        return [dict(json.loads(r[0])) for r in rows]

    def add_judgments(self, rows: Sequence[tuple[str, str, int]]) -> int:
        """Append ``(query, document_id, relevance)`` rows; return the new total."""
        now = time.time()
        with self._mutex, self._transaction():
            self._conn.executemany(
                "INSERT INTO judgments(query, document_id, relevance, created_at)"
                " VALUES (?, ?, ?, ?)",
                [(q, d, int(r), now) for q, d, r in rows],
            )
            return int(
                self._conn.execute("SELECT COUNT(*) FROM judgments").fetchone()[0]
            )

    def judgments(self) -> list[tuple[str, str, int]]:
        """All stored feedback judgments, oldest first."""
        with self._mutex:
            rows = self._conn.execute(
                "SELECT query, document_id, relevance FROM judgments ORDER BY n"
            ).fetchall()
        return [(str(q), str(d), int(r)) for q, d, r in rows]

    def close(self) -> None:
        """Close the connection (checkpointing the WAL)."""
        with self._mutex:
            self._conn.close()

    # -- helpers ----------------------------------------------------------------------
    def _seqs_by_id(self, ids: Sequence[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for chunk in _chunks(list(ids), 500):
            marks = ",".join("?" * len(chunk))
            for doc_id, seq in self._conn.execute(
                f"SELECT id, seq FROM documents WHERE id IN ({marks})", chunk
            ):
                out[str(doc_id)] = int(seq)
        return out

    def _transaction(self) -> _Transaction:
        return _Transaction(self._conn)


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any exception."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self._conn.execute("ROLLBACK" if exc_type else "COMMIT")


_COLUMNS = "seq, id, text, metadata, norm, n_tokens, truncated"


def _to_document(row: tuple[Any, ...]) -> StoredDocument:
    seq, doc_id, text, metadata, norm, n_tokens, truncated = row
    return StoredDocument(
        seq=int(seq),
        id=str(doc_id),
        text=str(text),
        metadata=json.loads(metadata),
        norm=float(norm),
        n_tokens=int(n_tokens),
        truncated=bool(truncated),
    )


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
