"""SQLite persistence of one collection's documents: the truth the FAISS index derives from.

One file per collection, WAL journal (its format: :mod:`app.collections.store_files`).
A write returns only after its transaction has committed, so an acknowledged upsert
survives a crash of the process (and, with ``synchronous=FULL``, of the machine). A
new file is built complete by :func:`~app.collections.store_files.build_store` before
it gets its final name, and an existing one is checked in full, read-only, by
:func:`app.collections.checks.check_file` before it is opened for writing, so a broken
file is reported and never modified. The per-collection state (calibrators, feedback,
query log, judging queue) shares the connection: :mod:`app.collections.local_state`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from app.collections import lexical
from app.collections.base import NewDocument, ReviseMetadata, StoredDocument
from app.collections.postings import LexicalBuilds, Postings, PostingsBuild, Ranking
from app.collections.store_files import (
    ADDED_SCHEMA,
    ADDED_TABLES,
    DEFAULT_STEMMER,
    QUERY_LOG_FLAG,
    RERANK_SCHEMA,
    RERANK_TABLE,
    SCHEMA_VERSION,
    Transaction,
    file_uri,
    storage_errors,
    write_meta,
)
from app.exceptions import FilterTimeoutError, NotFoundError
from app.schemas import filters

if TYPE_CHECKING:
    from app.collections.connections import OpenConnections

logger = logging.getLogger(__name__)

_LEXICAL_BATCH = 5000  # documents indexed per statement when an old file gains FTS
_PROGRESS_OPS = 1000  # SQLite instructions between two looks at a filter's deadline

Derive = Callable[[list[int], list[int]], None]
"""Applies a document write to derived state, given its removed and new seqs."""


class CollectionStore:
    """The SQLite file of one collection.

    A single connection is shared by the service's worker threads; ``_mutex``
    serialises its use (SQLite transactions are per connection). The connection is
    opened lazily and may be closed by :class:`OpenConnections` while idle; it is
    reopened (never created: ``mode=rw``) on the next use.

    Lexical searches are answered from an in-memory copy of the FTS5 postings
    (:class:`Postings`) once it is built, and by FTS5 itself until then. The build
    runs in the background (:class:`LexicalBuilds`), on its own read-only connection
    and in one read transaction begun under the mutex, so its snapshot holds exactly
    the store's writes committed before; those committing later are queued and
    applied, in order, when the built postings are swapped in under the mutex. A
    commit by any other connection (``PRAGMA data_version`` moves) drops the
    postings or discards the build that it overtook, and the next search starts a
    new one: under a constant stream of foreign writes searches stay on FTS5. The
    store's own document writes update the postings after they commit, under the
    mutex, so they never answer from a state the file has left. A released
    connection drops them (memory); closing cancels a build and waits for it.
    Searching them needs the mutex only for the freshness check, and the caller must
    keep writes out while a search scores (``Collection`` does, with its read-write
    lock).
    """

    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "FULL",
        connections: OpenConnections | None = None,
        builds: LexicalBuilds | None = None,
        filter_timeout_ms: int | None = None,
    ) -> None:
        self.path = path
        self._synchronous = synchronous
        self._filter_timeout_ms = filter_timeout_ms
        self._connections = connections
        self._own_builds = builds is None
        self._builds = LexicalBuilds(1) if builds is None else builds
        self._mutex = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._upgraded = False  # the version-2 tables exist
        self._postings: Postings | None = None
        self._postings_version = -1  # ``PRAGMA data_version`` the postings are of
        self._build: PostingsBuild | None = None  # the build under way (one at a time)
        self._failed_version: int | None = None  # a build failed at this version

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        """The open connection, held under the mutex; a full disk becomes a 507."""
        with self._mutex, storage_errors():
            if self._closed:
                raise NotFoundError("collection", self.path.stem)
            if self._conn is None:
                self._conn = self._connect()
            yield self._conn
        if self._connections is not None:
            self._connections.used(self)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            f"{file_uri(self.path)}?mode=rw",
            uri=True,
            check_same_thread=False,
            isolation_level=None,
            timeout=30.0,
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            if not self._upgraded:
                _upgrade(conn)
                self._upgraded = True
        except BaseException:
            conn.close()
            raise
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection inside ``BEGIN IMMEDIATE`` … ``COMMIT``."""
        with self.connection() as conn, Transaction(conn):
            yield conn

    @contextmanager
    def _write_documents(
        self, derive: Derive | None
    ) -> Iterator[tuple[sqlite3.Connection, _Changes]]:
        """:meth:`transaction` for ``documents``, with what derives from them, as one unit.

        Before COMMIT, after the caller's statements: the new texts are tokenised
        for the postings, then ``derive(removed, new seqs)`` runs (the caller's
        FAISS change). Anything failing up to and including COMMIT rolls the
        transaction back, and the postings are untouched; undoing ``derive`` is the
        caller's (``Collection`` rebuilds its index from the file). After COMMIT the
        postings only drop and append arrays, still under the mutex, so no search
        sees the file ahead of them; should even that fail, they are dropped (the
        next search rebuilds them from the file) and the committed write stands.
        """
        changes = _Changes([], [])
        with self.connection() as conn:
            with Transaction(conn):
                yield conn, changes
                postings = self._postings
                tokens = (
                    postings.tokens_of(changes.added)
                    if postings is not None and changes.added
                    else None
                )
                if derive is not None:
                    derive(changes.removed, [seq for seq, _ in changes.added])
            if self._build is not None and self._build.deltas is not None:
                self._build.deltas.append((changes.removed, changes.added))
            if postings is not None:
                try:
                    postings.apply(changes.removed, changes.added, tokens)
                except Exception:
                    logger.exception(
                        "lexical postings of %s dropped after a write", self.path
                    )
                    self._drop_postings()  # rebuilt from the file by the next search

    def _drop_postings(self) -> None:
        self._postings = None  # a search still scoring keeps its reference

    def _cancel_build(self) -> PostingsBuild | None:
        """Discard the build under way (under the mutex); the caller may wait on it."""
        build, self._build = self._build, None
        if build is not None and not self._builds.cancel(build):
            build.interrupt()
        return build

    def _fresh_postings(self, conn: sqlite3.Connection) -> Postings | None:
        """The postings if they are of the file's state (under the mutex).

        Otherwise None, and a build is started unless one is under way or the last
        one failed at this very state of the file (it would fail again).
        """
        version = _data_version(conn)
        if self._postings is not None and version == self._postings_version:
            return self._postings
        self._drop_postings()
        if self._build is None and self._failed_version != version:
            self._build = PostingsBuild(self._run_build)
            self._builds.submit(self._build)
        return None

    def _run_build(self, build: PostingsBuild) -> None:
        """Build the postings on a connection of its own, then swap them in."""
        started = time.perf_counter()
        version = -1  # no state of the file read yet
        try:
            with self._mutex:
                if build is not self._build or self._conn is None:
                    return  # cancelled, or the connection was released meanwhile
                version = _data_version(self._conn)
                row = self._conn.execute(
                    "SELECT value FROM meta WHERE key = 'stemmer'"
                ).fetchone()
                stemmer = json.loads(row[0]) if row else DEFAULT_STEMMER
                conn = build.open(f"{file_uri(self.path)}?mode=ro")
                Postings.prepare(conn)
                conn.execute("BEGIN")
                conn.execute("SELECT 1 FROM documents LIMIT 1").fetchall()  # snapshot
                build.deltas = []
            postings = Postings.read(conn, stemmer)
            conn.execute("COMMIT")
        except Exception as error:  # sqlite3 or memory: searches stay on FTS5
            with self._mutex:
                if build is self._build:
                    self._build = None
                    self._failed_version = version
                    logger.error(
                        "lexical postings of %s not built, searches stay on FTS5: %s",
                        self.path,
                        error,
                    )
            return
        finally:
            build.close()
        self._swap(build, postings, version, time.perf_counter() - started)

    def _swap(
        self, build: PostingsBuild, postings: Postings, version: int, seconds: float
    ) -> None:
        """Serve the built postings, with the writes that committed during the build."""
        with self._mutex:
            if build is not self._build:
                return  # cancelled: closed, released or dropped meanwhile
            self._build = None
            if self._conn is None or _data_version(self._conn) != version:
                logger.info(
                    "lexical postings of %s overtaken by another connection's write;"
                    " the next search builds them again",
                    self.path,
                )
                return
            try:
                for removed, added in build.deltas or []:
                    postings.apply(removed, added)
            except Exception as error:
                logger.error("lexical postings of %s not updated: %s", self.path, error)
                return
            self._postings, self._postings_version = postings, version
        logger.debug(
            "lexical postings of %s: %d documents in %.2fs",
            self.path,
            postings.count,
            seconds,
        )

    def start_lexical(self) -> None:
        """Start building the in-memory postings in the background, if they need it."""
        with self.connection() as conn:
            self._fresh_postings(conn)

    def wait_lexical(self, timeout: float) -> bool:
        """Whether the in-memory postings serve searches, after up to ``timeout`` s.

        Starts builds as needed and waits for them (for tests and benchmarks).
        """
        deadline = time.monotonic() + timeout
        while True:
            with self.connection() as conn:
                if self._fresh_postings(conn) is not None:
                    return True
                build = self._build
            remaining = deadline - time.monotonic()
            if build is None or remaining <= 0 or not build.done.wait(remaining):
                return False

    def wait_build(self, timeout: float) -> bool:
        """Whether no postings build is under way, after up to ``timeout`` s for it.

        Starts none (unlike :meth:`wait_lexical`): start-up waits for the builds
        opening the collections began.
        """
        with self._mutex:
            build = self._build
        return build is None or build.done.wait(timeout)

    def release_connection(self) -> bool:
        """Close the connection if the store is idle (for the LRU); False if busy."""
        if not self._mutex.acquire(blocking=False):
            return False
        try:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                # data_version is per connection, and an idle store's postings are
                # memory best given back.
                self._drop_postings()
                self._cancel_build()
                self._failed_version = None
            return True
        finally:
            self._mutex.release()

    # -- metadata -------------------------------------------------------------------
    def get_meta(self) -> dict[str, Any]:
        """Return every meta key with its JSON-decoded value."""
        with self.connection() as conn:
            rows = conn.execute("SELECT key, value FROM meta").fetchall()
        return {k: json.loads(v) for k, v in rows}

    def set_meta(self, **values: Any) -> None:
        """Set meta keys atomically."""
        with self.transaction() as conn:
            write_meta(conn, values)

    # -- documents ------------------------------------------------------------------
    def upsert(
        self, docs: Sequence[NewDocument], derive: Derive | None = None
    ) -> tuple[list[int], list[int]]:
        """Insert or replace documents in one transaction.

        Returns ``(removed_seqs, new_seqs)``: a replaced document gets a fresh ``seq``
        so that the index can drop the old vector and add the new one (``derive``
        gets the same, before COMMIT: see :meth:`_write_documents`).
        """
        now = time.time()
        with self._write_documents(derive) as (conn, changes):
            ids = [d.id for d in docs]
            removed = list(_seqs_by_id(conn, ids).values())
            # Deleted explicitly (not by REPLACE) so the lexical index's trigger fires.
            for _ in _in_chunks(conn, "DELETE FROM documents WHERE seq IN", removed):
                pass
            new: list[int] = []
            for d in docs:
                cur = conn.execute(
                    "INSERT INTO documents"
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
            changes.removed.extend(removed)
            changes.added.extend(zip(new, (d.text for d in docs), strict=True))
        return removed, new

    def delete(self, doc_id: str, derive: Derive | None = None) -> int | None:
        """Delete one document; return its seq, or None if it did not exist."""
        with self._write_documents(derive) as (conn, changes):
            row = conn.execute(
                "DELETE FROM documents WHERE id = ? RETURNING seq", (doc_id,)
            ).fetchone()
            changes.removed.extend([] if row is None else [int(row[0])])
        return None if row is None else int(row[0])

    def get(self, doc_id: str) -> StoredDocument | None:
        """Read one document by id."""
        with self.connection() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM documents WHERE id = ?", (doc_id,)
            ).fetchone()
        return None if row is None else _to_document(row)

    def get_by_seqs(self, seqs: Sequence[int]) -> dict[int, StoredDocument]:
        """Read documents by seq (unknown seqs are absent from the result)."""
        with self.connection() as conn:
            docs = [
                _to_document(row)
                for row in _in_chunks(
                    conn, f"SELECT {_COLUMNS} FROM documents WHERE seq IN", seqs
                )
            ]
        return {doc.seq: doc for doc in docs}

    def seqs_of(self, ids: Sequence[str]) -> dict[str, int]:
        """Map document ids to seqs (unknown ids are absent)."""
        with self.connection() as conn:
            return _seqs_by_id(conn, ids)

    def lexical_search(
        self, text: str, allowed: NDArray[np.int64] | None, *, depth: int
    ) -> Ranking:
        """The BM25 top ``depth`` among ``allowed``, the IDF mass, any seq's BM25.

        Exactly ``lexical.search`` and ``lexical.idf_mass``, from the in-memory
        postings. Until they are built, and for a query with a term FTS5 splits into
        several tokens (a phrase), FTS5 answers itself, where only the first
        ``depth`` hits are those of the full query (``lexical.search_with_mass``).
        """
        with self.connection() as conn:
            postings = self._fresh_postings(conn)
            if postings is None:
                return self._fts5_ranking(conn, text, allowed, depth)
        found = postings.rank(text, allowed, depth)
        if found is not None:
            return found
        with self.connection() as conn:
            return self._fts5_ranking(conn, text, allowed, depth)

    @staticmethod
    def _fts5_ranking(
        conn: sqlite3.Connection,
        text: str,
        allowed: NDArray[np.int64] | None,
        depth: int,
    ) -> Ranking:
        hits, mass = lexical.search_with_mass(conn, text, None, allowed, depth=depth)
        return Ranking.of_hits(hits, mass, depth)

    def vectors_of(self, seqs: Sequence[int]) -> dict[int, NDArray[np.float32]]:
        """Unit vectors of the given seqs (unknown seqs are absent)."""
        with self.connection() as conn:
            return {
                int(seq): np.frombuffer(blob, dtype=np.float32)
                for seq, blob in _in_chunks(
                    conn, "SELECT seq, vector FROM documents WHERE seq IN", seqs
                )
            }

    def lexical_count(self) -> int:
        """Documents in the lexical index (its own count, not the content table's)."""
        with self.connection() as conn:
            row = conn.execute(
                f"SELECT count(*) FROM {lexical.FTS_TABLE}_docsize"
            ).fetchone()
        return int(row[0])

    def count(self, where: filters.Node = filters.MATCH_ALL) -> int:
        """Number of documents (whose metadata matches ``where``)."""
        with self.connection() as conn, self._scan(conn, where) as (condition, params):
            row = conn.execute(
                f"SELECT COUNT(*) FROM documents WHERE {condition}", params
            ).fetchone()
        return int(row[0])

    def filter_seqs(self, where: filters.Node) -> NDArray[np.int64]:
        """Seqs of documents whose metadata matches ``where``."""
        with self.connection() as conn:
            return np.array(self._matching(conn, where), dtype=np.int64)

    def _matching(self, conn: sqlite3.Connection, where: filters.Node) -> list[int]:
        """Seqs of the documents matching ``where``; a filter's scan has a deadline."""
        with self._scan(conn, where) as (condition, params):
            rows = conn.execute(f"SELECT seq FROM documents WHERE {condition}", params)
            return [r[0] for r in rows]

    @contextmanager
    def _scan(
        self, conn: sqlite3.Connection, where: filters.Node
    ) -> Iterator[tuple[str, list[str | int | float]]]:
        """The exact condition of ``where``, its statements under the deadline.

        Match-all is ``1``, with no deadline: reading every row is not a filter's
        scan.
        """
        if where == filters.MATCH_ALL:
            yield "1", []
            return
        with self._deadline(conn):
            yield _exact_condition(conn, where)

    @contextmanager
    def _deadline(self, conn: sqlite3.Connection) -> Iterator[None]:
        """The statements run inside, stopped past ``filter_timeout_ms``.

        SQLite calls the progress handler every :data:`_PROGRESS_OPS` virtual
        machine instructions (a fraction of a millisecond even over wide metadata);
        once the deadline has passed it answers "stop", the statement fails with
        SQLITE_INTERRUPT and its transaction, if any, rolls back.
        """
        if self._filter_timeout_ms is None:
            yield
            return
        end = time.monotonic() + self._filter_timeout_ms / 1000
        conn.set_progress_handler(lambda: time.monotonic() > end, _PROGRESS_OPS)
        try:
            yield
        except sqlite3.OperationalError as error:
            if error.sqlite_errorcode != sqlite3.SQLITE_INTERRUPT:
                raise
            raise FilterTimeoutError(self.path.stem, self._filter_timeout_ms) from None
        finally:
            conn.set_progress_handler(None, 0)

    def page(
        self, after: int, limit: int, where: filters.Node = filters.MATCH_ALL
    ) -> list[StoredDocument]:
        """Up to ``limit`` documents (matching ``where``) with a seq above ``after``.

        In seq order. Keyset paging on the never-reused ``seq``: a page is one
        indexed range read, whatever the depth, and writes between pages shift
        nothing already passed. With a filter, the range is read until ``limit``
        documents match (or it ends).
        """
        with self.connection() as conn, self._scan(conn, where) as (condition, params):
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM documents WHERE seq > ? AND {condition}"
                " ORDER BY seq LIMIT ?",
                (after, *params, limit),
            ).fetchall()
        return [_to_document(row) for row in rows]

    def get_many(self, ids: Sequence[str]) -> dict[str, StoredDocument]:
        """Read documents by id (unknown ids are absent from the result)."""
        with self.connection() as conn:
            docs = [
                _to_document(row)
                for row in _in_chunks(
                    conn, f"SELECT {_COLUMNS} FROM documents WHERE id IN", ids
                )
            ]
        return {doc.id: doc for doc in docs}

    def delete_where(
        self, where: filters.Node, derive: Derive | None = None
    ) -> list[int]:
        """Delete, in one transaction, every document matching ``where``.

        :data:`~app.schemas.filters.MATCH_ALL` matches every document. Returns the
        deleted seqs (for the index); the lexical index follows by its delete trigger.
        Only the filter's scan has a deadline, not the deletion (its triggers' work
        grows with the documents matched, however cheap the filter).
        """
        with self._write_documents(derive) as (conn, changes):
            seqs = self._matching(conn, where)
            changes.removed.extend(
                int(seq)
                for (seq,) in _in_chunks(
                    conn, "DELETE FROM documents WHERE seq IN", seqs, " RETURNING seq"
                )
            )
        return changes.removed

    def delete_ids(self, ids: Sequence[str], derive: Derive | None = None) -> list[int]:
        """Delete, in one transaction, the documents among ``ids``; their seqs."""
        with self._write_documents(derive) as (conn, changes):
            changes.removed.extend(
                int(seq)
                for (seq,) in _in_chunks(
                    conn, "DELETE FROM documents WHERE id IN", ids, " RETURNING seq"
                )
            )
        return changes.removed

    def update_metadata(
        self, ids: Sequence[str], revise: ReviseMetadata
    ) -> list[StoredDocument]:
        """Rewrite the metadata column of the documents ``ids`` in one transaction.

        Only ``metadata`` changes: no trigger of the lexical index fires (they watch
        ``text``), and ``seq``, the vector and the postings are untouched.
        """
        with self.transaction() as conn:
            found = {
                row[1]: row
                for row in _in_chunks(
                    conn, f"SELECT {_COLUMNS} FROM documents WHERE id IN", ids
                )
            }
            missing = next((i for i in ids if i not in found), None)
            if missing is not None:
                raise NotFoundError("document", missing)
            out = []
            for doc_id in ids:
                old = _to_document(found[doc_id])
                metadata = revise(doc_id, old.metadata)
                conn.execute(
                    "UPDATE documents SET metadata = ?, updated_at = ? WHERE seq = ?",
                    (json.dumps(metadata, ensure_ascii=False), time.time(), old.seq),
                )
                out.append(dataclasses.replace(old, metadata=metadata))
        return out

    def iter_vectors(
        self, batch: int = 4096
    ) -> Iterator[tuple[NDArray[np.int64], NDArray[np.float32]]]:
        """Yield ``(seqs, unit vectors)`` in chunks, for (re)building the index."""
        last = -1
        while True:
            with self.connection() as conn:
                rows = conn.execute(
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
        with self.connection() as conn:
            rows = conn.execute(
                "SELECT norm, n_tokens FROM documents ORDER BY seq LIMIT ?", (limit,)
            ).fetchall()
        return (
            np.array([r[0] for r in rows], dtype=np.float64),
            np.array([r[1] for r in rows], dtype=np.int64),
        )

    def close(self) -> None:
        """Close the connection (checkpointing the WAL) for good.

        A build under way is cancelled and waited for first: its connection is
        read-only, and the last connection to close removes the WAL only if it can
        checkpoint (a read-only last closer left ``-wal`` and ``-shm`` behind).
        """
        with self._mutex:
            self._closed = True
            self._drop_postings()
            build = self._cancel_build()
        if build is not None:
            build.done.wait()
        with self._mutex:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        if self._own_builds:
            self._builds.join()
        if self._connections is not None:
            self._connections.forget(self)


@dataclass(frozen=True)
class _Changes:
    """What a transaction did to ``documents``: removed seqs, added (seq, text)."""

    removed: list[int]
    added: list[tuple[int, str]]


_COLUMNS = "seq, id, text, metadata, norm, n_tokens, truncated"


def _upgrade(conn: sqlite3.Connection) -> None:
    """Add the tables of later schema versions to an older file (idempotent).

    An older file's lexical index is built here, from its documents, in the same
    transaction that records it: a crash part-way leaves the old version, rebuilt on
    the next open.
    """
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    logged = {r[1] for r in conn.execute("PRAGMA table_info(query_log)")}
    if "truncated" in logged and all(
        t in tables for t in (*ADDED_TABLES, RERANK_TABLE, lexical.FTS_TABLE)
    ):
        return
    with Transaction(conn):
        for statement in (*ADDED_SCHEMA, *RERANK_SCHEMA):
            conn.execute(statement)
        if "truncated" not in logged:
            conn.execute(QUERY_LOG_FLAG)
        if lexical.FTS_TABLE not in tables:
            _build_lexical_index(conn)
        write_meta(conn, {"schema_version": SCHEMA_VERSION})


def _build_lexical_index(conn: sqlite3.Connection) -> None:
    """Create the lexical index of an older file and fill it, logging progress."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'stemmer'").fetchone()
    stemmer = json.loads(row[0]) if row else DEFAULT_STEMMER
    for statement in lexical.schema(stemmer):
        conn.execute(statement)
    total = int(conn.execute("SELECT count(*) FROM documents").fetchone()[0])
    path = conn.execute("PRAGMA database_list").fetchone()[2]
    logger.info("building the lexical index of %s: %d documents", path, total)
    started, done, last = time.perf_counter(), 0, -1
    while True:
        rows = conn.execute(
            "SELECT seq, text FROM documents WHERE seq > ? ORDER BY seq LIMIT ?",
            (last, _LEXICAL_BATCH),
        ).fetchall()
        if not rows:
            break
        conn.executemany(
            f"INSERT INTO {lexical.FTS_TABLE}(rowid, text) VALUES (?, ?)", rows
        )
        done, last = done + len(rows), int(rows[-1][0])
        logger.info("lexical index of %s: %d of %d documents", path, done, total)
    write_meta(conn, {"stemmer": stemmer})
    logger.info(
        "built the lexical index of %s in %.1fs", path, time.perf_counter() - started
    )


_NUMBER = "('integer','real')"
# How json.dumps writes a NUL in a key or string (SQL has no backslash escapes).
_NUL_ESCAPE = "'\\u0000'"
_EVALUATE = "normcal_evaluate"


def _exact_condition(
    conn: sqlite3.Connection, where: filters.Node
) -> tuple[str, list[str | int | float]]:
    r""":func:`_filter_condition`, exact for metadata that holds a NUL too.

    SQLite's JSON functions end a string at a NUL (``"alice\u0000mallory"`` reads
    as ``"alice"``). The API refuses NUL in metadata, but a file written before it
    did, or restored from such a snapshot, may hold one: the few rows whose JSON
    text has the escape are matched by the evaluator itself, registered on the
    connection for this statement (the caller holds the store's mutex). Any other
    row never reaches Python.
    """
    condition, params = _filter_condition(where)
    conn.create_function(
        _EVALUATE, 1, lambda text: filters.evaluate(where, json.loads(text))
    )
    exact = (
        f"CASE WHEN instr(metadata, {_NUL_ESCAPE}) THEN {_EVALUATE}(metadata)"
        f" ELSE {condition} END"
    )
    return exact, params


def _filter_condition(node: filters.Node) -> tuple[str, list[str | int | float]]:
    """A SQL condition on ``documents`` true where metadata matches ``node``.

    The meaning is :func:`app.schemas.filters.evaluate`'s. Every key and value is a
    bound parameter. A key is looked up by a JSON path (:func:`_by_path`) when it
    can be written in one, else matched through ``json_each`` (:func:`_key_match`).
    JSON types are told apart by ``json_type`` (``true`` is not ``1``, ``"1"`` is
    not ``1``), which the SQL value alone would not. An empty conjunction is ``1``:
    true.
    """
    if isinstance(node, filters.And | filters.Or):
        joined = [_filter_condition(p) for p in node.parts]
        if not joined:
            return ("1" if isinstance(node, filters.And) else "0"), []
        glue = " AND " if isinstance(node, filters.And) else " OR "
        return "(" + glue.join(c for c, _ in joined) + ")", [
            v for _, params in joined for v in params
        ]
    if isinstance(node, filters.Not):
        condition, params = _filter_condition(node.part)
        return f"NOT {condition}", params
    if _addressable(node.key):
        return _by_path(node)
    match, params = _key_match(node)
    return (
        f"EXISTS (SELECT 1 FROM json_each(documents.metadata) AS m WHERE {match})",
        [node.key, *params],
    )


def _addressable(key: str) -> bool:
    r"""Whether a JSON path finds ``key`` on every SQLite: it is written unescaped.

    SQLite before 3.45 compares a path's label with the key as written in the JSON
    text, escapes and all; ``json.dumps`` writes a key without ``"``, ``\`` or
    control characters as it is, and a path quotes it (``$."a.b"``).
    """
    return json.dumps(key, ensure_ascii=False)[1:-1] == key


def _by_path(
    node: filters.In | filters.Compare | filters.Exists,
) -> tuple[str, list[str | int | float]]:
    """The condition of one key found by its JSON path.

    ``json_type`` and ``json_extract`` of one row share one parse of its metadata
    (SQLite caches it within a statement), where a ``json_each`` per condition
    parses it again each time: 20 to 30 times faster for 64 conditions.
    """
    path = f'$."{node.key}"'
    if isinstance(node, filters.Exists):
        return "json_type(metadata, ?) IS NOT NULL", [path]
    # Never NULL, so that NOT of a condition on a missing key is true (SQL's NULL
    # would make it unknown, hence false).
    kind = "coalesce(json_type(metadata, ?), '')"
    value = "json_extract(metadata, ?)"
    if isinstance(node, filters.Compare):
        kinds = "= 'text'" if isinstance(node.value, str) else f"IN {_NUMBER}"
        symbol = filters.SYMBOL[node.op]
        return f"({kind} {kinds} AND {value} {symbol} ?)", [path, path, node.value]
    parts: list[str] = []
    params: list[str | int | float] = []
    strings = [v for v in node.values if isinstance(v, str)]
    numbers = [v for v in node.values if filters.is_number(v)]
    for kinds, group in (("= 'text'", strings), (f"IN {_NUMBER}", numbers)):
        if len(group) == 1:
            parts.append(f"({kind} {kinds} AND {value} = ?)")
            params += [path, path, *group]
        elif group:
            listed = "IN (SELECT value FROM json_each(?))"
            parts.append(f"({kind} {kinds} AND {value} {listed})")
            params += [path, path, json.dumps(group)]
    constants = sorted(
        {json.dumps(v) for v in node.values if v is None or v is True or v is False}
    )
    if constants:
        parts.append(f"{kind} IN ({', '.join('?' * len(constants))})")
        params += [path, *constants]
    if not parts:
        return "0", []
    return "(" + " OR ".join(parts) + ")", params


def _key_match(
    node: filters.In | filters.Compare | filters.Exists,
) -> tuple[str, list[str | int | float]]:
    """The ``WHERE`` of one key's ``json_each`` row ``m`` (after ``m.key = ?``)."""
    if isinstance(node, filters.Exists):
        return "m.key = ?", []
    if isinstance(node, filters.Compare):
        kind = "= 'text'" if isinstance(node.value, str) else f"IN {_NUMBER}"
        symbol = filters.SYMBOL[node.op]
        return f"m.key = ? AND m.type {kind} AND m.value {symbol} ?", [node.value]
    same_type = f"(v.type = m.type OR (v.type IN {_NUMBER} AND m.type IN {_NUMBER}))"
    return (
        f"m.key = ? AND EXISTS (SELECT 1 FROM json_each(?) AS v WHERE {same_type}"
        " AND v.value IS m.value)",
        [json.dumps(list(node.values))],
    )


def _seqs_by_id(conn: sqlite3.Connection, ids: Sequence[str]) -> dict[str, int]:
    return {
        str(doc_id): int(seq)
        for doc_id, seq in _in_chunks(
            conn, "SELECT id, seq FROM documents WHERE id IN", ids
        )
    }


def _data_version(conn: sqlite3.Connection) -> int:
    """Moves whenever another connection commits to the file (per connection)."""
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


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


def _in_chunks(
    conn: sqlite3.Connection, sql: str, values: Sequence[Any], tail: str = ""
) -> Iterator[tuple[Any, ...]]:
    """Rows of ``sql`` + ``(?, ?, …)`` + ``tail`` over ``values``, 500 at a time.

    SQLite bounds the number of parameters of one statement, so a long ``IN`` list
    is run in chunks (``sql`` ends with ``IN``; ``tail`` is e.g. a RETURNING clause).
    """
    for chunk in _chunks(list(values), 500):
        yield from conn.execute(f"{sql} ({','.join('?' * len(chunk))}){tail}", chunk)


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
