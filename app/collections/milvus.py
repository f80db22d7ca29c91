"""A normcal collection stored in Milvus: the second backend behind ``CollectionBackend``.

Each normcal collection is two Milvus collections of its own, or (``NORMCAL_MILVUS_LAYOUT
=shared``) the rows of one tenant in collections many share
(:mod:`app.collections.milvus_layout`):

* documents (``ncd_…``, here): the unit vector (``FLOAT_VECTOR``, inner product =
  cosine), the raw norm, token count, truncation flag, text, metadata (JSON), a
  ``seq`` for keyset paging, and the BM25 sparse vector Milvus derives from the text
  itself (a schema ``Function``), so one search returns everything the calibrators
  need;
* state (``ncs_…``): meta, calibrators, judgments, query log and judging queue as
  JSON rows, :class:`~app.collections.milvus_state.MilvusState` (``state``).

Atomicity: Milvus has no multi-row transactions. One ``upsert`` call per batch is
idempotent by id (a retried batch converges to the same rows) but a failure or crash
in the middle may leave part of a batch applied, and a concurrent search may see part
of it. Reads use the consistency level of ``NORMCAL_MILVUS_CONSISTENCY`` (``Strong``
by default: a write is visible to the next read of any client once acknowledged;
docs/storage.md states what the other levels guarantee).

Outages and filters: every call goes through one guarded client, and filters are
built from typed values and checked again in Python
(:mod:`app.collections.milvus_client`), so a filter can only ever narrow a result.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import grpc
import numpy as np
from numpy.typing import NDArray
from pymilvus import DataType, Function, FunctionType, MilvusClient, MilvusException
from pymilvus.client.types import LoadState
from pymilvus.milvus_client import IndexParams

from app.collections import lexical
from app.collections.base import (
    C,
    CalibratorLoader,
    NewDocument,
    Pool,
    ReviseMetadata,
    StoredDocument,
)
from app.collections.index import IndexType
from app.collections.milvus_client import (
    BACKEND,
    DOCS,
    GRPC_OPTIONS,
    SEQS,
    STATE,
    CallOptions,
    Guarded,
    chunks,
    milvus_filter,
    query_all,
    refused,
    string_literal,
)
from app.collections.milvus_layout import (
    SHARED_DOCS,
    SHARED_STATE,
    Layout,
    PerCollection,
)
from app.collections.milvus_state import (
    SCHEMA_VERSION,
    MilvusState,
    create_state_collection,
    migrated,
)
from app.collections.pool import pool_of
from app.collections.term_counts import TOTAL, TermCounts
from app.concurrency import RWLock
from app.exceptions import (
    BackendUnsupportedError,
    ConflictError,
    InvalidRequestError,
    NormcalError,
    NotFoundError,
    StorageUnavailableError,
)
from app.schemas import filters
from app.settings import MILVUS_TERM_LOOKUPS, MILVUS_TOP_K
from calibration.features import LEXICAL_DEPTH
from calibration.fusion import hybrid_pool

if TYPE_CHECKING:
    from app.collections.base import CollectionBackend

logger = logging.getLogger(__name__)
T = TypeVar("T")

_DOC_FIELDS = ["id", "seq", "text", "metadata", "norm", "n_tokens", "truncated"]
_MAX_ID_BYTES = 1024  # Limits.max_id_chars (256) of up to 4 UTF-8 bytes each
_MAX_TEXT_BYTES = 65_535  # Milvus's VARCHAR maximum
_QUERY_WINDOW = MILVUS_TOP_K  # Milvus's cap on offset + limit of one query
_TOP_K = MILVUS_TOP_K  # Milvus's cap on the limit of one search
_INT64_END = 2**63 - 1  # past every seq
_PAGE_ROUNDS = 32  # narrowing rounds of one page before falling back to a full scan
_DF_TTL = 60.0  # seconds a cached document frequency may miss other replicas' writes
_NORM_SAMPLE = 5000
_MATCH_WINDOW = 1000  # candidate seqs a filtered page checks at a time, at least
_BM25_FEATURE = (
    "BM25 full-text search (a BM25 function and sparse vectors, Milvus 2.5+)"
)


class MilvusStorage(Generic[C]):
    """One Milvus (Lite file or server) holding normcal collections.

    ``uri`` is a file path (Milvus Lite, one process) or ``http(s)://host:port``.
    Milvus Lite 3.x is a pure-Python engine: right for tests and small data, slow
    beyond (hundreds of ms per call on a few thousand documents here).
    """

    def __init__(
        self,
        uri: str,
        load_calibrator: CalibratorLoader[C],
        *,
        token: str = "",
        index_type: IndexType = "flat",
        hnsw_m: int = 32,
        ef_search: int = 128,
        layout: Layout | None = None,
        options: CallOptions | None = None,
        client_options: dict[str, Any] | None = None,
        term_lookups: int = MILVUS_TERM_LOOKUPS,
    ) -> None:
        """Connect (``client_options``: more ``MilvusClient`` arguments, TLS, database).

        ``term_lookups``: new terms counted per query (``TermCounts``).
        """
        options = options or CallOptions()
        client = MilvusClient(
            uri=uri,
            token=token,
            timeout=options.timeout,
            grpc_options=GRPC_OPTIONS,
            **(client_options or {}),
        )
        self.client = Guarded(client, uri, options=options)
        self.layout: Layout = layout or PerCollection()
        self._load_calibrator = load_calibrator
        self._index_type: IndexType = index_type
        self._hnsw = {"M": hnsw_m, "efConstruction": max(ef_search, 64)}
        self.ef_search = ef_search
        self.term_lookups = term_lookups
        self._pastes_quotes: bool | None = None
        self._timeout = options.timeout

    def create(self, name: str, meta: dict[str, Any]) -> MilvusCollection[C]:
        """Create ``name``'s Milvus collections, or rows (``ConflictError`` if taken).

        Shared Milvus collections are created by the first normcal one that needs
        them; the meta (its name row last) is written once they exist. A create
        that fails part-way (a feature the engine lacks, an outage) removes what it
        made before reporting the failure: nothing is left behind.
        """
        if self.layout.exists(self.client, name):
            raise ConflictError(f"collection {name!r} already exists")
        self.layout.clear(self.client, name)
        dim = int(meta["dim"])
        docs = self.layout.documents(name, dim, self._index_type)
        state = self.layout.state(name)
        made = [m for m in (docs, state) if not self.client.has_collection(m)]
        try:
            if docs in made:
                self._create_documents(docs, dim)
                self.layout.verify(self.client, docs)
            if state in made:
                create_state_collection(self.client, state, self.layout)
            full = {
                **meta,
                "name": name,
                "index_type": self._index_type,
                "schema_version": SCHEMA_VERSION,
            }
            collection = MilvusCollection(name, self, self._load_calibrator, full)
            collection.set_meta(**{k: v for k, v in full.items() if k != "name"})
            collection.set_meta(name=name)
        except BaseException:
            self._remove(name, made)
            raise
        return collection

    def _remove(self, name: str, made: list[str]) -> None:
        """Remove what a failed create of ``name`` made, as far as Milvus answers.

        That is its rows in shared collections and the Milvus collections it
        created. The create's own error is the one reported, not one of this clean-up.
        """
        steps = [partial(self.layout.clear, self.client, name)] + [
            partial(self.client.drop_collection, milvus) for milvus in made
        ]
        for step in steps:
            try:
                step()
            except (MilvusException, NormcalError):
                continue

    def open(self, name: str) -> MilvusCollection[C]:
        """Open a stored collection (``NotFoundError`` if absent), migrated if older."""
        meta = self.layout.meta(self.client, name)
        if meta is None:
            raise NotFoundError("collection", name)
        meta = migrated(self.scoped(name), self.layout.state(name), name, meta)
        return MilvusCollection(name, self, self._load_calibrator, meta)

    def load_released(self) -> None:
        """Start loading every normcal Milvus collection that is not loaded.

        A restarted Milvus (Milvus Lite: every restart of normcal) has released them
        all; they load in the background (:class:`~app.collections.milvus_client.
        Reloads`), a few at a time, while start-up goes on: ``/readyz`` says which
        are still loading.
        """
        for milvus in self.client.list_collections():
            if not milvus.startswith((DOCS, STATE, SHARED_DOCS, SHARED_STATE)):
                continue
            state = self.client.get_load_state(milvus).get("state")
            if state != LoadState.Loaded:
                self.client.load_in_background(milvus)

    def loading(self) -> list[str]:
        """The collections still being loaded (readiness); failed loads start again."""
        self.client.reloads.retry()
        return sorted({self.layout.owner(m) for m in self.client.reloads.pending()})

    def open_all(self) -> dict[str, MilvusCollection[C]]:
        """Every stored collection, by name (shared layout: one query in all).

        Those being loaded are left out: they open on first use.
        """
        opened: dict[str, MilvusCollection[C]] = {}
        for name, meta in self.layout.metas(self.client).items():
            state = self.layout.state(name)
            try:
                current = migrated(self.scoped(name), state, name, meta)
            except StorageUnavailableError as error:  # e.g. a newer schema version
                logger.warning(
                    "collection %s opens on first use: %s", name, error.detail
                )
                continue
            opened[name] = MilvusCollection(name, self, self._load_calibrator, current)
        return opened

    def names(self) -> list[str]:
        """Names of the normcal collections stored, sorted."""
        return self.layout.names(self.client)

    def scoped(self, name: str) -> Guarded:
        """The client of normcal collection ``name``: its 404s, its rows only."""
        return self.client.for_collection(
            name, self.layout.scoped(self.client.raw, name)
        )

    def drop(self, name: str) -> None:
        """Drop everything of ``name`` (``NotFoundError`` if absent)."""
        if not self.layout.drop(self.client, name):
            raise NotFoundError("collection", name)

    def close(self) -> None:
        """Close the client (Milvus Lite releases its file lock)."""
        self.client.close()

    def _create_documents(self, milvus: str, dim: int) -> None:
        schema = self.layout.schema("id", _MAX_ID_BYTES)
        schema.add_field("seq", DataType.INT64)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
        schema.add_field(
            "text",
            DataType.VARCHAR,
            max_length=_MAX_TEXT_BYTES,
            enable_analyzer=True,
        )
        schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
        schema.add_field("metadata", DataType.JSON)
        schema.add_field("norm", DataType.DOUBLE)
        schema.add_field("n_tokens", DataType.INT64)
        schema.add_field("truncated", DataType.BOOL)
        schema.add_function(
            Function(
                name="bm25",
                function_type=FunctionType.BM25,
                input_field_names=["text"],
                output_field_names=["sparse"],
            )
        )
        # The collection is empty, so its indexes have nothing to build: pymilvus's
        # default (sync) create_index sleeps 0.5 s per index before it first asks
        # whether the build is done, 2 s of every create. The index is recorded when
        # the call returns; load_collection then waits for the load itself.
        steps = [
            (
                _BM25_FEATURE,
                lambda raw: raw.create_collection(
                    milvus,
                    schema=schema,
                    consistency_level="Strong",
                    **self.layout.options(),
                ),
            ),
            (
                f"the {self._index_type.upper()} vector index",
                lambda raw: raw.create_index(milvus, self._vector_index(), sync=False),
            ),
            (
                _BM25_FEATURE,
                lambda raw: raw.create_index(
                    milvus, self._lexical_indexes(), sync=False
                ),
            ),
        ]
        for feature, step in steps:
            self._supported(feature, step)
        self.client.load_collection(milvus)

    def _vector_index(self) -> IndexParams:
        index = self.client.prepare_index_params()
        if self._index_type == "hnsw":
            index.add_index(
                "vector", index_type="HNSW", metric_type="IP", params=self._hnsw
            )
        else:
            index.add_index("vector", index_type="FLAT", metric_type="IP")
        return index

    def _lexical_indexes(self) -> IndexParams:
        index = self.client.prepare_index_params()
        index.add_index(
            "sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25"
        )
        index.add_index("seq", index_type="INVERTED")
        return index

    def _supported(self, feature: str, step: Callable[[Any], object]) -> None:
        """Run one step of a create: the engine refusing it is a 422.

        The 422 names ``feature`` and the server's version, never a retried 503.
        A refusal is an answer of the server (an error with one of Milvus's integer
        codes, other than a transient one); no answer (an outage, a timeout: gRPC
        status codes) is a 503 as for any call.
        """
        try:
            step(self.client.raw)
        except MilvusException as error:
            if not refused(error):
                raise self.client.translate(error) from error
            raise BackendUnsupportedError(
                BACKEND,
                f"cannot create a collection: this Milvus "
                f"({self.server_version()}) does not serve {feature}: "
                f"{error.message}",
            ) from error

    def pastes_quotes(self) -> bool:
        """Whether this Milvus is Milvus Lite 2.x, which cannot store an id with ``'``.

        Its front end keeps rows in SQLite and pastes ids into its SQL between single
        quotes: the upsert of such an id fails ("internal error"), and a delete of
        one is undone by its next restart. Known from ``GetVersion``, which it alone
        does not implement; an outage leaves it unknown (``False``) until asked again.
        """
        if self._pastes_quotes is None:
            try:
                self.client.raw.get_server_version(timeout=self._timeout)
            except grpc.RpcError as error:
                if not isinstance(error, grpc.Call):
                    return False
                if error.code() != grpc.StatusCode.UNIMPLEMENTED:
                    return False
                self._pastes_quotes = True
            except MilvusException:
                return False
            else:
                self._pastes_quotes = False
        return self._pastes_quotes

    def server_version(self) -> str:
        """The Milvus server's version, as it reports it (Milvus Lite 2.x does not)."""
        try:
            return f"version {self.client.raw.get_server_version()}"
        except Exception:  # only for a message: any failure says "unknown"
            return "a Milvus that does not report its version, as Milvus Lite 2.x"


def _document(row: dict[str, Any]) -> StoredDocument:
    return StoredDocument(
        seq=int(row["seq"]),
        id=str(row["id"]),
        text=str(row["text"]),
        metadata=dict(row["metadata"]),
        norm=float(row["norm"]),
        n_tokens=int(row["n_tokens"]),
        truncated=bool(row["truncated"]),
    )


def _and(*exprs: str) -> str:
    """The conjunction of the non-empty ``exprs``, each parenthesised."""
    return " and ".join(f"({e})" for e in exprs if e)


def _in_windows(
    fetch: Callable[[str], list[T]],
    seq: Callable[[T], int],
    cap: int,
    lo: int = 0,
    hi: int = _INT64_END,
) -> list[T]:
    """Every row ``fetch`` finds with a seq in ``[lo, hi)``, though it returns at most ``cap``.

    ``fetch`` is given the range as an expression. A range with ``cap`` rows (some
    may be missing) is split at the median seq of those listed, so each half holds
    at least half of them and fewer rows than the whole: about ``4 * rows / cap``
    calls in all. Seqs are unique per document; ``cap`` rows sharing one cannot be
    told apart and are an error rather than a silent miss.
    """
    bounds = [f"seq >= {lo}"] if lo > 0 else []
    bounds += [f"seq < {hi}"] if hi < _INT64_END else []
    rows = fetch(" and ".join(bounds))
    if len(rows) < cap:
        return rows
    seqs = sorted(seq(row) for row in rows)
    median = seqs[len(seqs) // 2]
    if median == seqs[0]:
        raise StorageUnavailableError(
            f"{cap} rows share seq {median}: they cannot be listed in windows"
        )
    return _in_windows(fetch, seq, cap, lo, median) + _in_windows(
        fetch, seq, cap, median, hi
    )


class MilvusCollection(Generic[C]):
    """One normcal collection in Milvus (see the module docstring).

    The lock only orders this process's calls and makes ``close`` wait for them;
    Milvus itself serialises nothing across replicas.
    """

    def __init__(
        self,
        name: str,
        storage: MilvusStorage[C],
        load_calibrator: CalibratorLoader[C],
        meta: dict[str, Any],
    ) -> None:
        self.name = name
        self._client = storage.scoped(name)
        self.meta: dict[str, Any] = meta
        self._docs = storage.layout.documents(name, int(meta["dim"]), self.index_type)
        self._ef_search = storage.ef_search
        self._pastes_quotes = storage.pastes_quotes
        self.lock = RWLock()
        self.closed = False
        self._terms = TermCounts(
            self._count_terms, per_query=storage.term_lookups, ttl=_DF_TTL
        )
        self.state = MilvusState(
            name,
            self._client,
            storage.layout.state(name),
            (self._reading, self._writing),
            load_calibrator,
            meta,
        )

    @property
    def index_type(self) -> IndexType:
        """The vector index kind chosen at creation (``flat`` or ``hnsw``)."""
        return "hnsw" if self.meta.get("index_type") == "hnsw" else "flat"

    @contextmanager
    def _reading(self) -> Iterator[None]:
        with self.lock.read():
            self._check_open()
            yield

    @contextmanager
    def _writing(self) -> Iterator[None]:
        with self.lock.write():
            self._check_open()
            yield

    def _check_open(self) -> None:
        if self.closed:
            raise NotFoundError("collection", self.name)

    # -- documents ----------------------------------------------------------------------
    def upsert(self, docs: Sequence[NewDocument]) -> None:
        """One Milvus upsert of the batch; each document gets a new seq.

        An id no expression can address (:func:`string_literal`: a line break), or
        that this Milvus cannot store (:meth:`MilvusStorage.pastes_quotes`), is
        refused before anything is written.
        """
        for i, doc in enumerate(docs):
            string_literal(doc.id, field=f"documents.{i}.id")
            if "'" in doc.id and self._pastes_quotes():
                raise InvalidRequestError(
                    f"documents.{i}.id: this Milvus (Milvus Lite 2.x) cannot store an "
                    "id containing ' (its front end pastes ids into SQL); use a "
                    "Milvus server, Milvus Lite 3.x or the local backend",
                    field=f"documents.{i}.id",
                )
            if len(doc.text.encode()) > _MAX_TEXT_BYTES:
                raise InvalidRequestError(
                    f"document {doc.id!r}: the {BACKEND} backend stores at most "
                    f"{_MAX_TEXT_BYTES} bytes of text",
                    field="text",
                )
        first = SEQS.take(len(docs))
        rows = [
            {
                "id": d.id,
                "seq": first + i,
                "vector": np.asarray(d.vector, dtype=np.float32).tolist(),
                "text": d.text,
                "metadata": d.metadata,
                "norm": float(d.norm),
                "n_tokens": int(d.n_tokens),
                "truncated": bool(d.truncated),
            }
            for i, d in enumerate(docs)
        ]
        with self._writing():
            self._client.upsert(self._docs, rows)
            self._terms.forget()

    def delete(self, doc_id: str) -> None:
        """Delete one document (``NotFoundError`` if absent)."""
        with self._writing():
            if not self._client.get(self._docs, ids=[doc_id], output_fields=["id"]):
                raise NotFoundError("document", doc_id)
            self._client.delete(self._docs, ids=[doc_id])
            self._terms.forget()

    def get(self, doc_id: str) -> StoredDocument:
        """Read one document (``NotFoundError`` if absent)."""
        doc = self.get_many([doc_id]).get(doc_id)
        if doc is None:
            raise NotFoundError("document", doc_id)
        return doc

    def get_many(self, ids: Sequence[str]) -> dict[str, StoredDocument]:
        """The stored documents among ``ids``, by id."""
        out: dict[str, StoredDocument] = {}
        with self._reading():
            for chunk in chunks(sorted(set(ids))):
                for row in self._client.get(
                    self._docs, ids=chunk, output_fields=_DOC_FIELDS
                ):
                    out[str(row["id"])] = _document(row)
        return out

    def update_metadata(
        self, ids: Sequence[str], revise: ReviseMetadata
    ) -> list[StoredDocument]:
        """Upsert the rows of ``ids`` as read, but for the metadata.

        The same seq, the same float32 vector (Milvus returns it exactly) and the same
        text, from which Milvus derives the same BM25 entry.
        """
        with self._writing():
            rows = {
                str(row["id"]): row
                for chunk in chunks(sorted(set(ids)))
                for row in self._client.get(
                    self._docs, ids=chunk, output_fields=[*_DOC_FIELDS, "vector"]
                )
            }
            missing = next((i for i in ids if i not in rows), None)
            if missing is not None:
                raise NotFoundError("document", missing)
            new = [
                {**rows[i], "metadata": revise(i, dict(rows[i]["metadata"]))}
                for i in ids
            ]
            self._client.upsert(self._docs, new)
        return [_document(row) for row in new]

    def page(
        self, after: int, limit: int, where: filters.Node = filters.MATCH_ALL
    ) -> list[StoredDocument]:
        """Up to ``limit`` documents matching ``where`` past seq ``after``, in seq order.

        Milvus queries have no ORDER BY (Milvus Lite ignores ``order_by_fields``), so
        the page is found by a narrowing keyset window (:meth:`_page_seqs`): a few
        capped queries of the ``seq`` field, then one read of the page's rows. A
        filter Milvus applies exactly narrows those queries; any other is applied
        by :meth:`_matching_seqs`.
        """
        pre = milvus_filter(where)
        with self._reading():
            if pre.exact:
                seqs = self._page_seqs(int(after), limit, pre.expr)
            else:
                seqs = self._matching_seqs(int(after), limit, where, pre.expr)
            if not seqs:
                return []
            rows = self._client.query(
                self._docs, filter=f"seq in {seqs}", output_fields=_DOC_FIELDS
            )
        return sorted((_document(r) for r in rows), key=lambda d: d.seq)

    def _matching_seqs(
        self, after: int, limit: int, where: filters.Node, expr: str
    ) -> list[int]:
        """The ``limit`` smallest seqs above ``after`` of documents ``where`` matches.

        ``expr`` selects a superset: its seqs are read a window at a time (at least
        :data:`_MATCH_WINDOW`), each window's metadata checked by
        :func:`~app.schemas.filters.evaluate`, until ``limit`` match or none is left.
        """
        found: list[int] = []
        window = max(limit, _MATCH_WINDOW)
        while len(found) < limit:
            seqs = self._page_seqs(after, window, expr)
            if not seqs:
                break
            rows = self._client.query(
                self._docs, filter=f"seq in {seqs}", output_fields=["seq", "metadata"]
            )
            found += sorted(
                int(r["seq"]) for r in rows if filters.evaluate(where, r["metadata"])
            )
            if len(seqs) < window:
                break
            after = seqs[-1]
        return found[:limit]

    def count(self, where: filters.Node) -> int:
        """How many documents match ``where``: one count if Milvus applies it exactly.

        Otherwise the superset Milvus selects is read (seq and metadata) and checked.
        """
        pre = milvus_filter(where)
        with self._reading():
            if pre.exact:
                return self._count(pre.expr)
            rows = query_all(self._client, self._docs, pre.expr, ["seq", "metadata"])
        return sum(1 for r in rows if filters.evaluate(where, r["metadata"]))

    def _page_seqs(self, after: int, limit: int, where: str = "") -> list[int]:
        """The ``limit`` smallest seqs above ``after``, reading a bounded window.

        A query capped at :data:`_QUERY_WINDOW` rows returns *some* seqs of its range;
        if it is not full it returned all of them. If it is full, the ``limit``-th
        smallest seq it saw bounds the answer from above, so the range shrinks to
        ``(after, bound]`` and is read again: each round either completes or narrows
        (Milvus returns rows roughly in insertion order, so one narrowing usually
        suffices). Past :data:`_PAGE_ROUNDS` rounds, every seq above ``after`` is
        scanned (the old, always-correct way). ``where``: an expression every seq
        returned must also satisfy.
        """
        narrowed = f" and ({where})" if where else ""
        expr = f"seq > {after}{narrowed}"
        for _ in range(_PAGE_ROUNDS):
            rows = self._client.query(
                self._docs, filter=expr, output_fields=["seq"], limit=_QUERY_WINDOW
            )
            seqs = sorted(int(r["seq"]) for r in rows)
            if len(seqs) < _QUERY_WINDOW:
                return seqs[:limit]
            bound = seqs[min(limit, len(seqs)) - 1]
            narrower = f"seq > {after} and seq <= {bound}{narrowed}"
            if narrower == expr:  # a full window that cannot narrow: scan
                break
            expr = narrower
        return sorted(int(r["seq"]) for r in self._all_rows(expr, ["seq"]))[:limit]

    def _all_rows(self, expr: str, fields: list[str]) -> list[dict[str, Any]]:
        """Every document row matching ``expr``: its ``fields`` and ``seq``.

        Not pymilvus's query iterator, which pages by primary key and pastes the
        last id of a page into the next page's filter, unescaped (an id ending in
        ``"`` rewrote it): queries of seq ranges, each capped at
        :data:`_QUERY_WINDOW` rows, split until every one is under the cap
        (:func:`_in_windows`).
        """
        wanted = list(dict.fromkeys([*fields, "seq"]))

        def window(bounds: str) -> list[dict[str, Any]]:
            return list(
                self._client.query(
                    self._docs,
                    filter=_and(bounds, expr),
                    output_fields=wanted,
                    limit=_QUERY_WINDOW,
                )
            )

        return _in_windows(window, lambda row: int(row["seq"]), _QUERY_WINDOW)

    def delete_where(self, where: filters.Node) -> int:
        """Delete every document matching ``where``; return how many.

        The matching ids are read and checked, then deleted by id: never by a filter
        that could match more than was checked.
        """
        expr = milvus_filter(where).expr
        with self._writing():
            rows = self._all_rows(expr, ["id", "metadata"])
            ids = [r["id"] for r in rows if filters.evaluate(where, r["metadata"])]
            for chunk in chunks(ids):
                self._client.delete(self._docs, ids=chunk)
            self._terms.forget()
        return len(ids)

    def delete_ids(self, ids: Sequence[str]) -> int:
        """Delete the documents among ``ids`` (unknown ones are skipped); how many."""
        with self._writing():
            found = [
                str(row["id"])
                for chunk in chunks(sorted(set(ids)))
                for row in self._client.get(self._docs, ids=chunk, output_fields=["id"])
            ]
            for chunk in chunks(found):
                self._client.delete(self._docs, ids=chunk)
            if found:
                self._terms.forget()
        return len(found)

    def search(
        self,
        vectors: NDArray[np.float32],
        texts: Sequence[str],
        n: int,
        where: filters.Node = filters.MATCH_ALL,
    ) -> list[Pool]:
        """The hybrid pool of each query: dense top-``n`` by IP, then Milvus's BM25.

        One dense request and one BM25 request carry every query of the call.
        BM25 is Milvus's (its analyzer, IDF per segment in Milvus Lite), listed to
        depth ``max(n, LEXICAL_DEPTH)``: a dense hit beyond it scores 0, where the
        SQLite backend scores every match. ``idf_mass`` uses cached document
        frequencies (:meth:`_idf_masses`). A filter Milvus cannot apply exactly
        (:class:`~app.collections.milvus_client.MilvusFilter`) is first resolved to
        the seqs it matches, so that the top ``n`` are the filter's top ``n``.
        """
        fields = [*_DOC_FIELDS, "vector"]
        ef = max(self._ef_search, n)  # HNSW's ef must be at least the top k
        with self._reading():
            expr = self._exact_filter(where)
            dense = self._client.search(
                self._docs,
                data=np.asarray(vectors, dtype=np.float32).tolist(),
                anns_field="vector",
                limit=n,
                filter=expr,
                output_fields=fields,
                search_params={"metric_type": "IP", "params": {"ef": ef}},
            )
            lex = self._lexical(texts, max(n, LEXICAL_DEPTH), expr, fields)
        masses = self._idf_masses(texts)  # no lock held: see TermCounts
        return [
            self._pool(vectors[i], n, where, dense[i], lex[i], masses[i])
            for i in range(len(texts))
        ]

    def _exact_filter(self, where: filters.Node) -> str:
        """A Milvus expression matching exactly the documents ``where`` matches.

        An inexact pre-filter is read (seq and metadata of the rows it selects) and
        checked by :func:`~app.schemas.filters.evaluate`: one scan of the superset.
        No match is ``seq < 0`` (seqs are microseconds since the epoch): the engine
        fails on ``seq in []``.
        """
        pre = milvus_filter(where)
        if pre.exact:
            return pre.expr
        rows = self._all_rows(pre.expr, ["seq", "metadata"])
        seqs = sorted(
            int(r["seq"]) for r in rows if filters.evaluate(where, r["metadata"])
        )
        return f"seq in {seqs}" if seqs else "seq < 0"

    def _pool(
        self,
        vector: NDArray[np.float32],
        n: int,
        where: filters.Node,
        dense: Sequence[dict[str, Any]],
        lex: Sequence[dict[str, Any]],
        idf_mass: float,
    ) -> Pool:
        rows = {}
        cosine: dict[str, float] = {}
        bm25: dict[str, float] = {}
        dense_ids: list[str] = []
        for hit in dense:
            entity = hit["entity"]
            if filters.evaluate(where, entity["metadata"]):
                rows[entity["id"]] = entity
                cosine[entity["id"]] = float(hit["distance"])
                dense_ids.append(entity["id"])
        lex_ids: list[str] = []
        for hit in lex:
            entity = hit["entity"]
            if filters.evaluate(where, entity["metadata"]):
                rows.setdefault(entity["id"], entity)
                # BM25 is never negative; Milvus Lite reports it as a negative distance.
                bm25[entity["id"]] = abs(float(hit["distance"]))
                lex_ids.append(entity["id"])
        shape = hybrid_pool(dense_ids, lex_ids, n)
        for doc_id in shape.members:
            if doc_id not in cosine:
                stored = np.asarray(rows[doc_id]["vector"], dtype=np.float32)
                cosine[doc_id] = float(np.dot(stored, vector))
        return pool_of(
            shape,
            {d: _document(rows[d]) for d in shape.members},
            cosine,
            np.array([bm25.get(d, 0.0) for d in shape.members], dtype=np.float64),
            idf_mass=idf_mass,
            top=bm25[lex_ids[0]] if lex_ids else 0.0,
        )

    def _lexical(
        self, texts: Sequence[str], depth: int, expr: str, fields: list[str]
    ) -> list[list[dict[str, Any]]]:
        """BM25 hits of every text, in one request (none for a text without terms)."""
        asked = [i for i, t in enumerate(texts) if lexical.query_terms(t)]
        out: list[list[dict[str, Any]]] = [[] for _ in texts]
        if asked:
            found = self._client.search(
                self._docs,
                data=[texts[i] for i in asked],
                anns_field="sparse",
                limit=depth,
                filter=expr,
                output_fields=fields,
                search_params={"metric_type": "BM25"},
            )
            for i, hits in zip(asked, found, strict=True):
                out[i] = list(hits)
        return out

    def _idf_masses(self, texts: Sequence[str]) -> list[float]:
        """Each query's IDF mass, by the IDF of Milvus's own BM25.

        That is ``log(1 + (N - n + 0.5) / (n + 0.5))`` (always positive), where FTS5
        uses ``log((N - n + 0.5) / (n + 0.5))`` floored at 1e-6. The ``lex`` feature
        is a BM25 score over this mass, so both must use the engine's IDF: with
        FTS5's, a term in half the collection or more added ~0 to the mass but a
        positive IDF to Milvus's score, and ``lex`` exploded (a probability of 1.0
        for any match in a two-document collection). With it, ``lex`` is at most
        ``k1 + 1`` = 2.2, as on the local backend.

        Document frequencies come from the collection's
        :class:`~app.collections.term_counts.TermCounts`: cached, at most
        ``NORMCAL_MILVUS_TERM_LOOKUPS`` new terms counted per query, all of a search
        in one Milvus call (:meth:`_count_terms`), no lock held meanwhile. A term
        left past the bound counts as in no document (the largest IDF: ``lex`` is
        understated, never above its ceiling). This process's writes clear the
        cache; other replicas' writes are seen within :data:`_DF_TTL` seconds.
        Between the two, ``idf_mass`` is that of a slightly older collection state,
        where the SQLite backend's is exact: a normalisation scale that moves by the
        log of a relative change in counts, so the ``lex`` feature drifts by far
        less than the calibrators' noise.
        """
        terms = [lexical.query_terms(t) for t in texts]
        if not any(terms):
            return [0.0] * len(texts)
        df = self._terms.frequencies(terms)
        total = df[TOTAL]
        if total == 0:
            return [0.0] * len(texts)
        return [
            sum(
                math.log1p((total - df.get(t, 0) + 0.5) / (df.get(t, 0) + 0.5))
                for t in ts
            )
            for ts in terms
        ]

    def _count_terms(self, terms: list[str]) -> dict[str, int]:
        """Document frequencies of ``terms`` (:data:`TOTAL`: the documents).

        A one-term BM25 search lists exactly the documents containing the term (a
        document without it scores nothing), but at most :data:`_TOP_K` of them:
        one search carries every term; a term with that many hits is counted again
        in seq windows (:func:`_in_windows`), exact at any frequency in about
        ``4 * df / _TOP_K`` searches.
        """
        counts = {TOTAL: self._count("")} if TOTAL in terms else {}
        asked = [t for t in terms if t != TOTAL]
        for chunk in chunks(asked):
            found = self._client.search(
                self._docs,
                data=chunk,
                anns_field="sparse",
                limit=_TOP_K,
                output_fields=[],
                search_params={"metric_type": "BM25"},
            )
            for term, hits in zip(chunk, found, strict=True):
                counts[term] = len(hits)
                if len(hits) == _TOP_K:
                    counts[term] = len(self._term_hits(term))
        return counts

    def _term_hits(self, term: str) -> list[int]:
        """The seqs of every document containing ``term``, in seq windows."""

        def window(bounds: str) -> list[int]:
            (hits,) = self._client.search(
                self._docs,
                data=[term],
                anns_field="sparse",
                limit=_TOP_K,
                filter=bounds,
                output_fields=["seq"],
                search_params={"metric_type": "BM25"},
            )
            return [int(hit["entity"]["seq"]) for hit in hits]

        return _in_windows(window, int, _TOP_K)

    def _count(self, expr: str) -> int:
        rows = self._client.query(self._docs, filter=expr, output_fields=["count(*)"])
        return int(rows[0]["count(*)"])

    def counts(self) -> tuple[int, int, int]:
        """Documents, BM25-indexed documents and vectors: one Milvus row each."""
        with self._reading():
            count = self._count("")
        return count, count, count

    def missing(self, ids: Sequence[str]) -> list[str]:
        """The ids among ``ids`` that are not stored, sorted and deduplicated."""
        known = self.get_many(ids)
        return [i for i in sorted(set(ids)) if i not in known]

    def norm_sample(self) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
        """Raw norms and token counts of up to 5000 documents (Milvus's order)."""
        with self._reading():
            rows = self._client.query(
                self._docs,
                filter="",
                limit=_NORM_SAMPLE,
                output_fields=["norm", "n_tokens"],
            )
        return (
            np.array([r["norm"] for r in rows], dtype=np.float64),
            np.array([r["n_tokens"] for r in rows], dtype=np.int64),
        )

    def set_meta(self, **values: Any) -> None:
        """Persist meta keys (state rows) and refresh the cached copy."""
        self.state.set_meta(**values)

    def refresh(self) -> None:
        """Follow the active calibrator another replica may have set (the registry's)."""
        self.state.refresh()

    def close(self) -> None:
        """Wait for in-flight work; later calls get 404 (the client is the storage's)."""
        with self.lock.write():
            self.closed = True


if TYPE_CHECKING:

    def _conforming(collection: MilvusCollection[C]) -> CollectionBackend[C]:
        """The type-checked proof that the Milvus collection is a backend."""
        return collection
