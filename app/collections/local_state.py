"""The per-collection state of the local backend, in the collection's SQLite file.

Calibrators, feedback judgments, the opt-in query log and the judging queue: what
``CollectionState`` (``app.collections.base``) asks of a collection besides its
documents. :class:`LocalState` is given the collection's way in (its read lock and
"not closed" check, yielding the :class:`~app.collections.store.CollectionStore`)
and runs its SQL on the store's connection, under the store's mutex. These writes
take the collection's *read* lock: they touch no document, and the store serialises
its own transactions.

Calibrators are stored as JSON; storage knows nothing of how they are fitted or
scored. ``load_calibrator`` (``Profile.from_json``) turns them back into the owner's
type, and the active one is kept decoded in :attr:`LocalState.profile` for search.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Generic

from app.collections.base import (
    C,
    CalibratorEntry,
    CalibratorLoader,
    active_profile,
    check_calibrator_cap,
    decodable,
)
from app.collections.store import CollectionStore
from app.collections.store_files import write_meta
from app.exceptions import ConflictError, NotFoundError

if TYPE_CHECKING:
    from app.collections.base import CollectionState

Access = Callable[[], AbstractContextManager[CollectionStore]]
"""The collection's way in: its lock held and its openness checked, the store."""


class LocalState(Generic[C]):
    """One SQLite collection's calibrators, feedback, query log and judging queue.

    ``meta`` is the collection's cached meta, shared (the active calibrator's id is
    kept there); ``profile`` is the active calibrator, decoded, replaced by one
    assignment, so a search that reads it once sees the old one or the new one.
    """

    def __init__(
        self,
        name: str,
        access: Access,
        load_calibrator: CalibratorLoader[C],
        meta: dict[str, Any],
    ) -> None:
        self.name = name
        self._access = access
        self._load_calibrator = load_calibrator
        self._meta = meta
        self.profile: C | None = active_profile(
            name, meta.get("active_calibrator"), self.calibrator
        )

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._access() as store, store.connection() as conn:
            yield conn

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """The connection inside ``BEGIN IMMEDIATE`` … ``COMMIT``."""
        with self._access() as store, store.transaction() as conn:
            yield conn

    # -- calibrators --------------------------------------------------------------------
    def calibrator(self, calibrator_id: str) -> C:
        """Load a stored calibrator (``NotFoundError`` if absent)."""
        with self._reading() as conn:
            row = conn.execute(
                "SELECT profile FROM calibrators WHERE id = ?", (calibrator_id,)
            ).fetchone()
        if row is None:
            raise NotFoundError("calibrator", calibrator_id)
        return self._load_calibrator(dict(json.loads(row[0])))

    def calibrators(self, *, strict: bool = False) -> list[C]:
        """Every stored calibrator that decodes, oldest first.

        ``strict``: every one must decode, else the loader's ``ValueError``.
        """
        with self._reading() as conn:
            rows = conn.execute(
                "SELECT profile FROM calibrators ORDER BY created_at, id"
            ).fetchall()
        stored = [dict(json.loads(r[0])) for r in rows]
        return decodable(self.name, stored, self._load_calibrator, strict=strict)

    def calibrator_page(self, limit: int, after: int) -> list[CalibratorEntry]:
        """Up to ``limit`` stored calibrators past ``rowid`` ``after``, oldest first.

        Reads the id, method and time columns, never a profile.
        """
        with self._reading() as conn:
            rows = conn.execute(
                "SELECT rowid, id, method, created_at FROM calibrators"
                " WHERE rowid > ? ORDER BY rowid LIMIT ?",
                (after, limit),
            ).fetchall()
        return [
            CalibratorEntry(int(n), str(i), str(m), float(t)) for n, i, m, t in rows
        ]

    def calibrators_count(self) -> int:
        """How many calibrators are stored."""
        with self._reading() as conn:
            return _count_calibrators(conn)

    def add_calibrator(
        self, profile: C, *, activate: bool, cap: int | None = None
    ) -> None:
        """Store a fitted calibrator; activating it is part of the same commit.

        The count against ``cap`` is in the same transaction.
        """
        with self._writing() as conn:
            check_calibrator_cap(_count_calibrators(conn), cap)
            conn.execute(
                "INSERT INTO calibrators(id, created_at, method, profile)"
                " VALUES (?, ?, ?, ?)",
                (
                    profile.id,
                    profile.created_at,
                    profile.method,
                    json.dumps(profile.to_json()),
                ),
            )
            if activate:
                write_meta(conn, {"active_calibrator": profile.id})
        if activate:
            self._meta["active_calibrator"] = profile.id
            self.profile = profile

    def activate(self, calibrator_id: str) -> C:
        """Make a stored calibrator the active one (``NotFoundError`` if absent).

        One transaction: a concurrent delete cannot leave ``active_calibrator``
        naming a calibrator that no longer exists.
        """
        with self._writing() as conn:
            row = conn.execute(
                "SELECT profile FROM calibrators WHERE id = ?", (calibrator_id,)
            ).fetchone()
            if row is not None:
                write_meta(conn, {"active_calibrator": calibrator_id})
        if row is None:
            raise NotFoundError("calibrator", calibrator_id)
        profile = self._load_calibrator(dict(json.loads(row[0])))
        self._meta["active_calibrator"] = calibrator_id
        self.profile = profile
        return profile

    def deactivate(self) -> None:
        """Serve no fitted calibrator: the owner's default applies again."""
        with self._writing() as conn:
            conn.execute("DELETE FROM meta WHERE key = 'active_calibrator'")
        self._meta.pop("active_calibrator", None)
        self.profile = None

    def delete_calibrator(self, calibrator_id: str) -> None:
        """Delete a stored calibrator; the active one is refused (``ConflictError``).

        The check and the delete are one transaction.
        """
        with self._writing() as conn:
            row = conn.execute(
                "SELECT value FROM meta WHERE key = 'active_calibrator'"
            ).fetchone()
            active = row is not None and json.loads(row[0]) == calibrator_id
            gone = 0
            if not active:
                gone = conn.execute(
                    "DELETE FROM calibrators WHERE id = ?", (calibrator_id,)
                ).rowcount
        if active:
            raise ConflictError(
                f"calibrator {calibrator_id!r} is the active one of collection "
                f"{self.name!r}; activate another calibrator, or the default, "
                "before deleting it"
            )
        if not gone:
            raise NotFoundError("calibrator", calibrator_id)

    # -- feedback -----------------------------------------------------------------------
    def add_judgments(self, rows: Sequence[tuple[str, str, int]]) -> int:
        """Append ``(query, document_id, relevance)`` rows; return the new total."""
        now = time.time()
        with self._writing() as conn:
            conn.executemany(
                "INSERT INTO judgments(query, document_id, relevance, created_at)"
                " VALUES (?, ?, ?, ?)",
                [(q, d, int(r), now) for q, d, r in rows],
            )
            return int(conn.execute("SELECT COUNT(*) FROM judgments").fetchone()[0])

    def judgments(self) -> list[tuple[str, str, int]]:
        """All stored feedback judgments, oldest first."""
        with self._reading() as conn:
            rows = conn.execute(
                "SELECT query, document_id, relevance FROM judgments ORDER BY n"
            ).fetchall()
        return [(str(q), str(d), int(r)) for q, d, r in rows]

    def judgments_count(self) -> int:
        """How many feedback judgments are stored."""
        with self._reading() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM judgments").fetchone()[0])

    def judgments_page(
        self, limit: int, after: int
    ) -> list[tuple[int, str, str, int, float]]:
        """Up to ``limit`` judgments after cursor ``after``, in ``n`` order.

        Rows are ``(n, query, document_id, relevance, created_at)``.

        ``n`` is AUTOINCREMENT, never reused: a page boundary stays put while others
        add or delete feedback.
        """
        with self._reading() as conn:
            rows = conn.execute(
                "SELECT n, query, document_id, relevance, created_at FROM judgments"
                " WHERE n > ? ORDER BY n LIMIT ?",
                (after, limit),
            ).fetchall()
        return [(int(n), str(q), str(d), int(r), float(t)) for n, q, d, r, t in rows]

    def delete_judgments(
        self, query: str | None, document_id: str | None = None
    ) -> int:
        """Delete every judgment, one query text's, or one (query, document) pair's.

        ``document_id`` narrows ``query``'s judgments to that document's (the judging
        page's undo); it needs ``query``. Returns how many were deleted.
        """
        with self._writing() as conn:
            if query is None:
                cursor = conn.execute("DELETE FROM judgments")
            elif document_id is None:
                cursor = conn.execute("DELETE FROM judgments WHERE query = ?", (query,))
            else:
                cursor = conn.execute(
                    "DELETE FROM judgments WHERE query = ? AND document_id = ?",
                    (query, document_id),
                )
            return int(cursor.rowcount)

    # -- query log and judging queue ----------------------------------------------------
    def log_queries(
        self, queries: Sequence[str], retention: int, max_chars: int
    ) -> None:
        """Count searched query texts, keeping the ``retention`` most recent ones.

        Each is kept to its first ``max_chars`` characters: longer texts sharing
        them count as one entry, ``truncated`` from the first cut on.
        """
        with self._writing() as conn:
            _count_in_log(conn, queries, max_chars, time.time())
            _trim_query_log(conn, retention)

    def truncated_in_log(self, query: str) -> bool:
        """Whether the log's entry ``query`` was cut to fit (False: no such entry)."""
        with self._reading() as conn:
            row = conn.execute(
                "SELECT truncated FROM query_log WHERE query = ?", (query,)
            ).fetchone()
        return bool(row and row[0])

    def log_rerank(
        self,
        query: str,
        documents: str,
        confidence: float | None,
        retention: int,
        max_chars: int,
    ) -> None:
        """Log a rerank request: its query as a searched one, its documents (JSON).

        The documents replace those an earlier request of the same query logged;
        they are dropped with the query when the log trims it.
        """
        now = time.time()
        with self._writing() as conn:
            _count_in_log(conn, [query], max_chars, now)  # as a searched query
            conn.execute(
                "INSERT OR REPLACE INTO rerank_log(query, documents, confidence,"
                " logged_at) VALUES (?, ?, ?, ?)",
                (query[:max_chars], documents, confidence, now),
            )
            _trim_query_log(conn, retention)

    def rerank_lists(
        self, queries: Sequence[str]
    ) -> dict[str, tuple[str, float | None]]:
        """The logged documents (JSON) and confidence of each query that has them."""
        out: dict[str, tuple[str, float | None]] = {}
        with self._reading() as conn:
            for query in dict.fromkeys(queries):
                row = conn.execute(
                    "SELECT documents, confidence FROM rerank_log WHERE query = ?",
                    (query,),
                ).fetchone()
                if row is not None:
                    out[query] = (
                        str(row[0]),
                        None if row[1] is None else float(row[1]),
                    )
        return out

    def trim_query_log(self, retention: int) -> int:
        """Drop all but the ``retention`` most recent entries; return how many remain."""
        with self._writing() as conn:
            _trim_query_log(conn, retention)
            return int(conn.execute("SELECT COUNT(*) FROM query_log").fetchone()[0])

    def query_log_size(self) -> int:
        """Distinct queries in the query log."""
        with self._reading() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM query_log").fetchone()[0])

    def add_judging_queries(self, queries: Sequence[str]) -> int:
        """Queue queries to judge (already queued ones are kept once); return added."""
        now = time.time()
        with self._writing() as conn:
            before = conn.total_changes
            conn.executemany(
                "INSERT OR IGNORE INTO judging_queries(query, added_at) VALUES (?, ?)",
                [(q, now) for q in queries],
            )
            return conn.total_changes - before

    def judging_candidates(self, limit: int) -> tuple[str, list[str], int]:
        """Up to ``limit`` queries still to judge, and how many there are in all.

        Uploaded queries in upload order come first; only when none is left, the
        query log, most searched first. A query with stored feedback or a skip is
        never a candidate. Returns ``(source, queries, total)``.
        """
        done = (
            "query NOT IN (SELECT query FROM judgments)"
            " AND query NOT IN (SELECT query FROM judging_skips)"
        )
        sources = (
            ("uploaded", "judging_queries", "n"),
            ("log", "query_log", "count DESC, last_seen DESC, query"),
        )
        with self._reading() as conn:
            for source, table, order in sources:
                total = int(
                    conn.execute(
                        f"SELECT COUNT(*) FROM {table} WHERE {done}"
                    ).fetchone()[0]
                )
                if total:
                    rows = conn.execute(
                        f"SELECT query FROM {table} WHERE {done} ORDER BY {order}"
                        " LIMIT ?",
                        (limit,),
                    ).fetchall()
                    return source, [str(r[0]) for r in rows], total
        return "none", [], 0

    def skip_judging(self, query: str) -> bool:
        """Never offer ``query`` again; False when it is neither queued nor logged."""
        with self._writing() as conn:
            known = conn.execute(
                "SELECT 1 FROM judging_queries WHERE query = ?"
                " UNION ALL SELECT 1 FROM query_log WHERE query = ?",
                (query, query),
            ).fetchone()
            if known is None:
                return False
            conn.execute(
                "INSERT OR IGNORE INTO judging_skips(query, skipped_at) VALUES (?, ?)",
                (query, time.time()),
            )
            return True

    def unskip_judging(self, query: str) -> bool:
        """Offer a skipped ``query`` again; False when it was not skipped."""
        with self._writing() as conn:
            cursor = conn.execute("DELETE FROM judging_skips WHERE query = ?", (query,))
            return cursor.rowcount > 0

    def judging_counts(self) -> tuple[int, int, int]:
        """``(judged queries, of them with a relevant judgment, skipped queries)``."""
        with self._reading() as conn:
            judged, relevant = conn.execute(
                "SELECT COUNT(DISTINCT query),"
                " COUNT(DISTINCT CASE WHEN relevance > 0 THEN query END) FROM judgments"
            ).fetchone()
            skipped = conn.execute("SELECT COUNT(*) FROM judging_skips").fetchone()[0]
        return int(judged), int(relevant), int(skipped)


def _count_calibrators(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT COUNT(*) FROM calibrators").fetchone()[0])


def _count_in_log(
    conn: sqlite3.Connection, queries: Sequence[str], max_chars: int, now: float
) -> None:
    """Count ``queries`` in the query log, each kept to its first ``max_chars``."""
    conn.executemany(
        "INSERT INTO query_log(query, first_seen, last_seen, count, truncated)"
        " VALUES (?, ?, ?, 1, ?) ON CONFLICT(query) DO UPDATE SET"
        " last_seen = excluded.last_seen, count = count + 1,"
        " truncated = max(truncated, excluded.truncated)",
        [(q[:max_chars], now, now, int(len(q) > max_chars)) for q in queries],
    )


def _trim_query_log(conn: sqlite3.Connection, retention: int) -> None:
    conn.execute(
        "DELETE FROM query_log WHERE query IN (SELECT query FROM query_log"
        " ORDER BY last_seen DESC, rowid DESC LIMIT -1 OFFSET ?)",
        (retention,),
    )
    conn.execute(
        "DELETE FROM rerank_log WHERE query NOT IN (SELECT query FROM query_log)"
    )


if TYPE_CHECKING:

    def _conforming(state: LocalState[C]) -> CollectionState[C]:
        """The type-checked proof that the SQLite state is a ``CollectionState``."""
        return state
