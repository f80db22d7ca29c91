"""The per-collection state of the Milvus backend, as rows of its state collection.

Meta, calibrators, judgments, query log and judging queue are JSON rows of the
normcal collection's state collection (``ncs_…``, :func:`create_state_collection`),
keyed by kind and key (with the dummy 2-dim vector Milvus requires of every
collection), so that several normcal replicas can share one Milvus with no local
state. :class:`MilvusState` is what ``CollectionState`` (``app.collections.base``)
asks of a collection besides its documents; it is given the guarded client and the
collection's lock (``reading``/``writing``: held, and the collection checked open).

State updates that read then write (query log counts, "activate unless deleted")
take the write lock: they are serialised within one process only.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Generic

from pymilvus import DataType

from app.collections.base import (
    C,
    CalibratorEntry,
    CalibratorLoader,
    active_profile,
    check_calibrator_cap,
    decodable,
)
from app.collections.milvus_client import (
    SEQS,
    Guarded,
    chunks,
    query_all,
    string_literal,
)
from app.exceptions import ConflictError, NotFoundError, StorageUnavailableError

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from app.collections.base import CollectionState
    from app.collections.milvus_layout import Layout

STATE_FIELDS = ["pk", "kind", "key", "n", "data"]
MAX_KEY_BYTES = 65_535  # Milvus's VARCHAR maximum
_DUMMY = [1.0, 0.0]  # the state collection's vector: Milvus requires one

Lock = Callable[[], AbstractContextManager[None]]
"""One of the collection's locks: held, and the collection checked open."""


def read_meta(client: Guarded, milvus: str) -> dict[str, Any]:
    """The meta rows of state collection ``milvus``, as a dict."""
    rows = query_all(client, milvus, 'kind == "meta"', STATE_FIELDS)
    return {r["key"]: r["data"]["value"] for r in rows}


def _from_version_1(client: Guarded, milvus: str) -> None:
    """Version 1 (no ``schema_version`` row) has version 2's collections and rows."""


SCHEMA_VERSION = 2
"""The layout of a normcal collection's Milvus collections this normcal writes.

Recorded as meta ``schema_version`` at create; 1 is a collection written before
the version was recorded (no such row). :data:`MIGRATIONS` brings an older one up.
"""
MIGRATIONS: dict[int, Callable[[Guarded, str], None]] = {1: _from_version_1}
"""Version ``v`` → the step that makes a collection at ``v`` one at ``v + 1``."""


def migrated(
    client: Guarded, milvus: str, name: str, meta: dict[str, Any]
) -> dict[str, Any]:
    """``name``'s ``meta`` (as read), its layout first migrated to :data:`SCHEMA_VERSION`.

    A collection written by a newer normcal is refused (503 naming both versions):
    this one would misread it. Each migration step records its version when done,
    so an interrupted migration resumes at the step it stopped in.
    """
    version = int(meta.get("schema_version", 1))
    if version > SCHEMA_VERSION:
        raise StorageUnavailableError(
            f"collection {name!r} was written by a newer normcal (Milvus schema "
            f"version {version}); this normcal reads versions up to "
            f"{SCHEMA_VERSION}: upgrade normcal to serve it"
        )
    while version < SCHEMA_VERSION:
        MIGRATIONS[version](client, milvus)
        version += 1
        write_meta(client, milvus, schema_version=version)
        logger.info("collection %s migrated to schema version %d", name, version)
    return {**meta, "schema_version": version}


def write_meta(client: Guarded, milvus: str, **values: Any) -> None:
    """Upsert meta rows of state collection ``milvus``."""
    client.upsert(milvus, [_row("meta", k, 0, {"value": v}) for k, v in values.items()])


def _row(kind: str, key: str, n: int, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "pk": _pk(kind, key),
        "kind": kind,
        "key": key,
        "n": n,
        "data": data,
        "v": _DUMMY,
    }


def create_state_collection(client: Guarded, milvus: str, layout: Layout) -> None:
    """Create the Milvus collection holding normcal collections' state rows."""
    schema = layout.schema("pk", 80)
    schema.add_field("kind", DataType.VARCHAR, max_length=16)
    schema.add_field("key", DataType.VARCHAR, max_length=MAX_KEY_BYTES)
    schema.add_field("n", DataType.INT64)
    schema.add_field("data", DataType.JSON)
    schema.add_field("v", DataType.FLOAT_VECTOR, dim=len(_DUMMY))
    index = client.prepare_index_params()
    index.add_index("v", index_type="FLAT", metric_type="IP")
    client.create_collection(
        milvus, schema=schema, consistency_level="Strong", **layout.options()
    )
    # Empty: nothing to build, so no 0.5 s wait for it (MilvusStore._create_documents).
    client.create_index(milvus, index, sync=False)
    client.load_collection(milvus)


class MilvusState(Generic[C]):
    """One Milvus collection's calibrators, feedback, query log and judging queue.

    ``meta`` is the collection's cached meta, shared (the active calibrator's id is
    kept there); ``profile`` is the active calibrator, decoded, replaced by one
    assignment, so a search that reads it once sees the old one or the new one.
    """

    def __init__(
        self,
        name: str,
        client: Guarded,
        milvus: str,
        locks: tuple[Lock, Lock],
        load_calibrator: CalibratorLoader[C],
        meta: dict[str, Any],
    ) -> None:
        self.name = name
        self._client = client
        self._collection = milvus
        self._reading, self._writing = locks
        self._load_calibrator = load_calibrator
        self._meta = meta
        self.profile: C | None = active_profile(
            name, meta.get("active_calibrator"), self.calibrator
        )

    # -- rows ---------------------------------------------------------------------------
    def _rows(
        self, kind: str, fields: list[str] = STATE_FIELDS
    ) -> list[dict[str, Any]]:
        return query_all(
            self._client, self._collection, f"kind == {string_literal(kind)}", fields
        )

    def _put(self, kind: str, items: Sequence[tuple[str, int, dict[str, Any]]]) -> None:
        if items:
            self._client.upsert(
                self._collection, [_row(kind, key, n, data) for key, n, data in items]
            )

    def _remove(self, kind: str, keys: Sequence[str]) -> None:
        for chunk in chunks([_pk(kind, k) for k in keys]):
            self._client.delete(self._collection, ids=chunk)

    def set_meta(self, **values: Any) -> None:
        """Persist meta keys (one state row each) and refresh the cached copy."""
        with self._reading():
            self._put("meta", [(k, 0, {"value": v}) for k, v in values.items()])
        self._meta.update(values)

    # -- feedback -----------------------------------------------------------------------
    def _judgment_rows(self) -> list[dict[str, Any]]:
        return sorted(self._rows("judgment"), key=lambda r: int(r["n"]))

    def judgments(self) -> list[tuple[str, str, int]]:
        """Stored feedback ``(query, document_id, relevance)``, oldest first."""
        with self._reading():
            rows = self._judgment_rows()
        return [
            (
                str(r["data"]["query"]),
                str(r["data"]["document_id"]),
                int(r["data"]["relevance"]),
            )
            for r in rows
        ]

    def judgments_count(self) -> int:
        """How many feedback judgments are stored."""
        with self._reading():
            return len(self._rows("judgment"))

    def add_judgments(self, rows: Sequence[tuple[str, str, int]]) -> int:
        """Store feedback for the next fit; return the new total."""
        now = time.time()
        first = SEQS.take(len(rows))
        with self._writing():
            self._put(
                "judgment",
                [
                    (
                        str(first + i),
                        first + i,
                        {
                            "query": q,
                            "document_id": d,
                            "relevance": int(r),
                            "created_at": now,
                        },
                    )
                    for i, (q, d, r) in enumerate(rows)
                ],
            )
            return len(self._rows("judgment"))

    def judgments_page(
        self, limit: int, after: int
    ) -> list[tuple[int, str, str, int, float]]:
        """Up to ``limit`` ``(n, query, document_id, relevance, created_at)`` after ``after``."""
        with self._reading():
            rows = [r for r in self._judgment_rows() if int(r["n"]) > after][:limit]
        return [
            (
                int(r["n"]),
                str(r["data"]["query"]),
                str(r["data"]["document_id"]),
                int(r["data"]["relevance"]),
                float(r["data"]["created_at"]),
            )
            for r in rows
        ]

    def delete_judgments(
        self, query: str | None, document_id: str | None = None
    ) -> int:
        """Delete stored feedback (all, one query's, or one pair's); return how many."""
        with self._writing():
            keys = [
                r["key"]
                for r in self._rows("judgment")
                if query is None
                or (
                    r["data"]["query"] == query
                    and document_id in (None, r["data"]["document_id"])
                )
            ]
            self._remove("judgment", keys)
        return len(keys)

    # -- query log and judging queue ----------------------------------------------------
    def log_queries(
        self, queries: Sequence[str], retention: int, max_chars: int
    ) -> None:
        """Count searched query texts, keeping the ``retention`` most recent.

        Each is kept to its first ``max_chars`` characters (``truncated`` when cut).
        """
        now = time.time()
        kept = [q[:max_chars] for q in queries]
        with self._writing():
            known = {r["key"]: r["data"] for r in self._rows("log")}
            for query, text in zip(queries, kept, strict=True):
                entry = known.get(text) or {"first_seen": now, "count": 0}
                known[text] = {
                    **entry,
                    "last_seen": now,
                    "count": entry["count"] + 1,
                    "truncated": entry.get("truncated", False) or text != query,
                }
            self._put("log", [(q, 0, known[q]) for q in dict.fromkeys(kept)])
            self._trim(retention)

    def truncated_in_log(self, query: str) -> bool:
        """Whether the log's entry ``query`` was cut to fit (False: no such entry)."""
        with self._reading():
            rows = self._client.get(
                self._collection, ids=[_pk("log", query)], output_fields=["data"]
            )
        return bool(rows and rows[0]["data"].get("truncated"))

    def log_rerank(
        self,
        query: str,
        documents: str,
        confidence: float | None,
        retention: int,
        max_chars: int,
    ) -> None:
        """Log a rerank request: its query as a searched one, its documents (JSON)."""
        with self._writing():
            data = {"documents": documents, "confidence": confidence}
            self._put("rerank", [(query[:max_chars], 0, data)])
        # The most recent: kept by the trim.
        self.log_queries([query], retention, max_chars)

    def rerank_lists(
        self, queries: Sequence[str]
    ) -> dict[str, tuple[str, float | None]]:
        """The logged documents (JSON) and confidence of each query that has them."""
        wanted = list(dict.fromkeys(queries))
        if not wanted:
            return {}
        with self._reading():
            rows = self._client.get(
                self._collection,
                ids=[_pk("rerank", q) for q in wanted],
                output_fields=["key", "data"],
            )
        return {
            str(r["key"]): (str(r["data"]["documents"]), r["data"]["confidence"])
            for r in rows
        }

    def _trim(self, retention: int) -> int:
        rows = sorted(self._rows("log"), key=lambda r: -r["data"]["last_seen"])
        gone = [r["key"] for r in rows[retention:]]
        self._remove("log", gone)
        self._remove("rerank", gone)
        return min(len(rows), retention)

    def trim_query_log(self, retention: int) -> int:
        """Apply a new retention now; return how many log entries remain."""
        with self._writing():
            return self._trim(retention)

    def query_log_size(self) -> int:
        """Distinct queries in the query log."""
        with self._reading():
            return len(self._rows("log"))

    def add_judging_queries(self, queries: Sequence[str]) -> int:
        """Queue uploaded queries to judge; return how many were new."""
        with self._writing():
            queued = {r["key"] for r in self._rows("queue")}
            new = [q for q in dict.fromkeys(queries) if q not in queued]
            first = SEQS.take(len(new))
            self._put("queue", [(q, first + i, {}) for i, q in enumerate(new)])
        return len(new)

    def judging_candidates(self, limit: int) -> tuple[str, list[str], int]:
        """Uploaded queries first, in upload order; then the log, most searched first."""
        with self._reading():
            done = {r["data"]["query"] for r in self._rows("judgment")}
            done |= {r["key"] for r in self._rows("skip")}
            queue = sorted(self._rows("queue"), key=lambda r: int(r["n"]))
            log = sorted(
                self._rows("log"),
                key=lambda r: (-r["data"]["count"], -r["data"]["last_seen"], r["key"]),
            )
        for source, rows in (("uploaded", queue), ("log", log)):
            todo = [str(r["key"]) for r in rows if r["key"] not in done]
            if todo:
                return source, todo[:limit], len(todo)
        return "none", [], 0

    def skip_judging(self, query: str) -> bool:
        """Never offer ``query`` again; False when it is neither queued nor logged."""
        with self._writing():
            known = self._client.get(
                self._collection,
                ids=[_pk("queue", query), _pk("log", query)],
                output_fields=["pk"],
            )
            if not known:
                return False
            self._put("skip", [(query, 0, {"skipped_at": time.time()})])
        return True

    def unskip_judging(self, query: str) -> bool:
        """Offer a skipped ``query`` again; False when it was not skipped."""
        with self._writing():
            skipped = self._client.get(
                self._collection, ids=[_pk("skip", query)], output_fields=["pk"]
            )
            if not skipped:
                return False
            self._remove("skip", [query])
        return True

    def judging_counts(self) -> tuple[int, int, int]:
        """``(judged queries, with a relevant judgment, skipped)``."""
        with self._reading():
            judged = [r["data"] for r in self._rows("judgment")]
            skipped = len(self._rows("skip"))
        relevant = {j["query"] for j in judged if j["relevance"] > 0}
        return len({j["query"] for j in judged}), len(relevant), skipped

    # -- calibrators --------------------------------------------------------------------
    def _stored_calibrator(self, calibrator_id: str) -> dict[str, Any] | None:
        rows = self._client.get(
            self._collection,
            ids=[_pk("calibrator", calibrator_id)],
            output_fields=["data"],
        )
        return dict(rows[0]["data"]["profile"]) if rows else None

    def calibrator(self, calibrator_id: str) -> C:
        """Load a stored calibrator (``NotFoundError`` if absent)."""
        with self._reading():
            data = self._stored_calibrator(calibrator_id)
        if data is None:
            raise NotFoundError("calibrator", calibrator_id)
        return self._load_calibrator(data)

    def calibrators(self) -> list[C]:
        """Every stored calibrator, oldest first."""
        with self._reading():
            rows = sorted(
                self._rows("calibrator"), key=lambda r: (int(r["n"]), r["key"])
            )
        return decodable(
            self.name, [dict(r["data"]["profile"]) for r in rows], self._load_calibrator
        )

    def calibrator_page(self, limit: int, after: int) -> list[CalibratorEntry]:
        """Up to ``limit`` stored calibrators past seq ``after``, oldest first.

        The positions come from one query of keys and seqs; only the page's rows are
        read whole (their JSON holds the method beside the profile).
        """
        with self._reading():
            found = self._rows("calibrator", ["key", "n"])
            page = sorted((int(r["n"]), str(r["key"])) for r in found if r["n"] > after)
            page = page[:limit]
            rows = (
                self._client.get(
                    self._collection,
                    ids=[_pk("calibrator", key) for _, key in page],
                    output_fields=["key", "data"],
                )
                if page
                else []
            )
        data = {str(r["key"]): r["data"] for r in rows}
        return [
            CalibratorEntry(
                n,
                key,
                str(data[key]["method"]),
                # Stored before the time was kept beside the profile: its seq.
                float(data[key].get("created_at", n / 1e6)),
            )
            for n, key in page
            if key in data  # deleted meanwhile
        ]

    def calibrators_count(self) -> int:
        """How many calibrators are stored."""
        with self._reading():
            return len(self._rows("calibrator", ["key"]))

    def add_calibrator(
        self, profile: C, *, activate: bool, cap: int | None = None
    ) -> None:
        """Store a fitted calibrator, then (a second write) activate it.

        Counted against ``cap`` under the write lock (within this process).
        """
        data = {
            "method": profile.method,
            "created_at": profile.created_at,
            "profile": profile.to_json(),
        }
        with self._writing():
            check_calibrator_cap(len(self._rows("calibrator", ["key"])), cap)
            self._put("calibrator", [(profile.id, SEQS.take(1), data)])
            if activate:
                self._put("meta", [("active_calibrator", 0, {"value": profile.id})])
        if activate:
            self._meta["active_calibrator"] = profile.id
            self.profile = profile

    def activate(self, calibrator_id: str) -> C:
        """Make a stored calibrator the active one (``NotFoundError`` if absent)."""
        with self._writing():
            data = self._stored_calibrator(calibrator_id)
            if data is None:
                raise NotFoundError("calibrator", calibrator_id)
            self._put("meta", [("active_calibrator", 0, {"value": calibrator_id})])
        profile = self._load_calibrator(data)
        self._meta["active_calibrator"] = calibrator_id
        self.profile = profile
        return profile

    def deactivate(self) -> None:
        """Serve no fitted calibrator: the owner's default applies again."""
        with self._writing():
            self._remove("meta", ["active_calibrator"])
        self._meta.pop("active_calibrator", None)
        self.profile = None

    def delete_calibrator(self, calibrator_id: str) -> None:
        """Delete a stored calibrator; the active one is refused (``ConflictError``)."""
        with self._writing():
            active = self._client.get(
                self._collection,
                ids=[_pk("meta", "active_calibrator")],
                output_fields=["data"],
            )
            if active and active[0]["data"]["value"] == calibrator_id:
                raise ConflictError(
                    f"calibrator {calibrator_id!r} is the active one of collection "
                    f"{self.name!r}; activate another calibrator, or the default, "
                    "before deleting it"
                )
            if self._stored_calibrator(calibrator_id) is None:
                raise NotFoundError("calibrator", calibrator_id)
            self._remove("calibrator", [calibrator_id])

    def refresh(self) -> None:
        """Follow the active calibrator another replica may have set: one point query.

        ``meta`` and ``profile`` are cached per process; the registry calls this on
        every lookup (about 2 ms on Milvus Lite), so a replica serves another's
        activation from its next request on. A collection another replica dropped
        is a ``NotFoundError`` here: its Milvus collection is gone, or (shared
        layout) its name row.
        """
        keys = [_pk("meta", "active_calibrator"), _pk("meta", "name")]
        with self._reading():
            rows = self._client.get(
                self._collection, ids=keys, output_fields=["key", "data"]
            )
        found = {r["key"]: r["data"]["value"] for r in rows}
        if "name" not in found:
            raise NotFoundError("collection", self.name)
        active = found.get("active_calibrator")
        if active == self._meta.get("active_calibrator"):
            return
        profile = self.calibrator(active) if active else None
        if active:
            self._meta["active_calibrator"] = active
        else:
            self._meta.pop("active_calibrator", None)
        self.profile = profile


def _pk(kind: str, key: str) -> str:
    return f"{kind}:{hashlib.sha256(key.encode()).hexdigest()}"


if TYPE_CHECKING:

    def _conforming(state: MilvusState[C]) -> CollectionState[C]:
        """The type-checked proof that the Milvus state is a ``CollectionState``."""
        return state
