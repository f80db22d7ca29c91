"""The SQLite file format of a collection: its schema, and whole-file operations.

One file per collection, WAL journal. A new file is built complete (schema and meta
in one transaction) by :func:`build_store` before it gets its final name; a copy is
taken with SQLite's online backup (:func:`backup_database`); a file is looked at
strictly read-only (:func:`count_documents`; checked in full by
:func:`app.collections.checks.check_file`). The schema is
what :mod:`app.collections.checks` compares a file against;
:class:`app.collections.store.CollectionStore` opens a checked file for writing.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from app.collections import lexical
from app.exceptions import InsufficientStorageError

# 5 added the rerank log (the documents of logged rerank requests); 4 the query log's
# ``truncated`` flag; 3 the lexical index (FTS5, ``app.collections.lexical``); 2 the
# judging tables (query log, uploaded queries, skips). An older file gets them on its
# first writable open;
# ``app.collections.checks`` accepts exactly these schemas.
SCHEMA_VERSION = 5
DEFAULT_STEMMER: lexical.Stemmer = "porter"

# One statement per entry, so that a new file gets its schema and its meta in a single
# transaction (``executescript`` would commit in between).
SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE documents (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- FAISS id, never reused
    id TEXT NOT NULL UNIQUE,
    text TEXT NOT NULL,
    metadata TEXT NOT NULL,
    vector BLOB NOT NULL,                    -- float32 unit vector
    norm REAL NOT NULL,                      -- raw norm before normalisation
    n_tokens INTEGER NOT NULL,
    truncated INTEGER NOT NULL,
    updated_at REAL NOT NULL
)""",
    """CREATE TABLE calibrators (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    method TEXT NOT NULL,
    profile TEXT NOT NULL                    -- calibration.profile.Profile.to_json()
)""",
    """CREATE TABLE judgments (      -- feedback kept for the next fit
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    query TEXT NOT NULL,
    document_id TEXT NOT NULL,
    relevance INTEGER NOT NULL,
    created_at REAL NOT NULL
)""",
)
ADDED_SCHEMA = (  # version 2
    """CREATE TABLE IF NOT EXISTS query_log (  -- opt-in log of searched query texts
    query TEXT PRIMARY KEY,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    count INTEGER NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS query_log_last_seen ON query_log(last_seen)",
    """CREATE TABLE IF NOT EXISTS judging_queries (  -- uploaded queries to judge
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    query TEXT NOT NULL UNIQUE,
    added_at REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS judging_skips (
    query TEXT PRIMARY KEY,
    skipped_at REAL NOT NULL
)""",
)
ADDED_TABLES = ("query_log", "judging_queries", "judging_skips")
# Version 4: a logged query cut to limits.max_logged_query_chars says so.
QUERY_LOG_FLAG = "ALTER TABLE query_log ADD COLUMN truncated INTEGER NOT NULL DEFAULT 0"
RERANK_SCHEMA = (  # version 5
    """CREATE TABLE IF NOT EXISTS rerank_log (  -- logged rerank requests' documents
    query TEXT PRIMARY KEY,                  -- also in query_log while kept
    documents TEXT NOT NULL,                 -- JSON, in the request's order
    confidence REAL,                         -- when logged (the judging order)
    logged_at REAL NOT NULL
)""",
)
RERANK_TABLE = "rerank_log"
FILE_MODE = 0o600  # -wal and -shm files inherit the database file's mode


class UnusableStoreError(Exception):
    """A collection file that is not a complete normcal database (``reason`` says why)."""


@contextmanager
def storage_errors() -> Iterator[None]:
    """Report a full disk as :class:`InsufficientStorageError` (HTTP 507).

    SQLite rolls the failed transaction back, so nothing was half-written.
    """
    try:
        yield
    except sqlite3.Error as error:
        if getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            raise InsufficientStorageError(
                "the disk holding the data dir is full; nothing was written"
            ) from error
        raise
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise InsufficientStorageError(
                "the disk holding the data dir is full; nothing was written"
            ) from error
        raise


def build_store(path: Path, meta: dict[str, Any], *, synchronous: str) -> None:
    """Write a complete new collection file at ``path`` (which must not exist).

    The file is created 0600, then schema and meta are written in ONE transaction and
    the file is fsynced, so whoever renames it into place renames a whole collection.
    """
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("PRAGMA journal_mode=WAL")
        stemmer = meta.setdefault("stemmer", DEFAULT_STEMMER)
        with Transaction(conn):
            statements = (*SCHEMA, *ADDED_SCHEMA, QUERY_LOG_FLAG, *RERANK_SCHEMA)
            for statement in (*statements, *lexical.schema(stemmer)):
                conn.execute(statement)
            write_meta(conn, {**meta, "schema_version": SCHEMA_VERSION})
    finally:
        conn.close()  # checkpoints the WAL into the file and removes it
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def backup_database(source: Path, target: Path) -> None:
    """Copy the database at ``source`` into a new file ``target`` (which must not exist).

    SQLite's online backup API in ONE step copies every page inside one read
    transaction of a separate read-only connection: the copy is one committed state
    even while other connections write, and writers are never blocked (WAL). The copy
    is switched to a rollback journal, so it is one self-contained file, created
    0600 and fsynced before whoever renames it into place does so.
    """
    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    src = sqlite3.connect(f"{file_uri(source)}?mode=ro", uri=True)
    try:
        dst = sqlite3.connect(target, isolation_level=None)
        try:
            src.backup(dst, pages=-1)
            dst.execute("PRAGMA journal_mode=DELETE")
        finally:
            dst.close()
    finally:
        src.close()
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def count_documents(path: Path) -> int:
    """Documents in a (checked) collection file, read read-only."""
    conn = sqlite3.connect(f"{file_uri(path)}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM documents").fetchone()[0])
    finally:
        conn.close()


class Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any exception.

    SQLite may already have rolled back by itself (a full disk, for one), hence the
    ``in_transaction`` checks.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            try:
                self._conn.execute("COMMIT")
                return
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")


def write_meta(conn: sqlite3.Connection, values: dict[str, Any]) -> None:
    """Set meta keys (JSON-encoded) inside the caller's transaction."""
    conn.executemany(
        "INSERT INTO meta(key, value) VALUES(?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
        [(k, json.dumps(v)) for k, v in values.items()],
    )


def file_uri(path: Path) -> str:
    """The ``file:`` URI of ``path``, for SQLite's URI parameters (``mode=ro``)."""
    return "file:" + quote(str(path.absolute()))


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
