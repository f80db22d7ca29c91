"""A normcal collection stored in Milvus: the second backend behind ``CollectionBackend``.

Each normcal collection is two Milvus collections (names from :func:`milvus_name`):

* documents (``ncd_…``): the unit vector (``FLOAT_VECTOR``, inner product = cosine),
  the raw norm, token count, truncation flag, text, metadata (JSON), a ``seq`` for
  keyset paging, and the BM25 sparse vector Milvus derives from the text itself
  (a schema ``Function``), so one search returns everything the calibrators need;
* state (``ncs_…``): meta, calibrators, judgments, query log and judging queue as
  JSON rows (with the dummy 2-dim vector Milvus requires of every collection), so
  that several normcal replicas can share one Milvus with no local state.

Atomicity: Milvus has no multi-row transactions. One ``upsert`` call per batch is
idempotent by id (a retried batch converges to the same rows) but a failure or crash
in the middle may leave part of a batch applied, and a concurrent search may see part
of it. Reads use the ``Strong`` consistency level, so a write is visible to the next
read of any client once acknowledged. State updates that read then write (query log
counts, "activate unless deleted") are serialised within one process only.

Outages: every call into pymilvus goes through one :class:`Guarded` client, which
turns a failure of Milvus (unreachable, timed out, or failing server-side) into
:class:`~app.exceptions.StorageUnavailableError` (HTTP 503 with ``Retry-After``), and
reloads a collection a restarted server left released. pymilvus reconnects by
itself, so the same process serves again once Milvus is back.

Filters are built from typed values by :func:`metadata_filter`, never by pasting a
user's string: strings become escaped literals, and every row read back is checked
against ``where`` in Python too, so a filter can only ever narrow a result.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic

import numpy as np
from numpy.typing import NDArray
from pymilvus import (
    DataType,
    Function,
    FunctionType,
    MilvusClient,
    MilvusException,
)
from pymilvus.exceptions import ParamError

from app.collections import lexical
from app.collections.base import (
    C,
    CalibratorLoader,
    Hit,
    MetadataValue,
    NewDocument,
    Pool,
    StoredDocument,
    active_profile,
    decodable,
)
from app.collections.index import IndexType
from app.concurrency import RWLock
from app.exceptions import (
    BackendUnsupportedError,
    ConflictError,
    InvalidRequestError,
    NormcalError,
    NotFoundError,
    StorageUnavailableError,
)
from calibration.features import LEXICAL_DEPTH, LexicalEvidence
from calibration.fusion import candidate_pool, lexical_ranks

if TYPE_CHECKING:
    from app.collections.base import CollectionBackend

BACKEND = "milvus"
_DOCS, _STATE = "ncd_", "ncs_"
_DOC_FIELDS = ["id", "seq", "text", "metadata", "norm", "n_tokens", "truncated"]
_STATE_FIELDS = ["pk", "kind", "key", "n", "data"]
_MAX_ID_BYTES = 1024  # Limits.max_id_chars (256) of up to 4 UTF-8 bytes each
_MAX_TEXT_BYTES = 65_535  # Milvus's VARCHAR maximum
_QUERY_BATCH = 1000  # rows per query-iterator page and per get/delete by ids
_QUERY_WINDOW = 16_384  # Milvus's cap on offset + limit of one query
_PAGE_ROUNDS = 32  # narrowing rounds of one page before falling back to a full scan
_DF_TTL = 60.0  # seconds a cached document frequency may miss other replicas' writes
_NORM_SAMPLE = 5000
_DUMMY = [1.0, 0.0]  # the state collection's vector: Milvus requires one
_INT64 = (-(2**63), 2**63 - 1)
_RETRY_AFTER = 5  # seconds a client is told to wait when Milvus does not answer
_NOT_FOUND = 100  # Milvus's error code of a collection that does not exist
_NOT_LOADED = 101  # ... of one not loaded (a restarted server releases them all)


def milvus_name(name: str, kind: str = _DOCS) -> str:
    """The Milvus collection name of normcal collection ``name`` (injective).

    Milvus allows letters, digits and ``_``; normcal names have ``-`` too. Letters
    and digits stay, ``_`` becomes ``_u``, ``-`` ``_d`` and any other character
    ``_x`` + 6 hex digits: a prefix-free code, so two names never collide, and the
    prefix (``ncd_`` documents, ``ncs_`` state) keeps the two kinds apart.
    """
    out = [kind]
    for ch in name:
        if ch.isascii() and ch.isalnum():
            out.append(ch)
        else:
            out.append({"_": "_u", "-": "_d"}.get(ch, f"_x{ord(ch):06x}"))
    return "".join(out)


def _string(value: str) -> str:
    r"""A Milvus expression string literal denoting exactly ``value``.

    The expression grammar knows the escapes ``\\ \" \n \r \t``; any other
    control character could not be written back, so it is refused rather than
    passed through.
    """
    for ch in value:
        if (ord(ch) < 0x20 and ch not in "\n\r\t") or ord(ch) == 0x7F:
            raise InvalidRequestError(
                f"filter values for the {BACKEND} backend cannot contain control "
                f"character U+{ord(ch):04X}",
                field="where",
            )
    escaped = (
        value.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )
    return f'"{escaped}"'


def _literal(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise InvalidRequestError(
                f"filter value {value} is outside the 64-bit range of the "
                f"{BACKEND} backend",
                field="where",
            )
        return str(value)
    if not math.isfinite(value):
        raise InvalidRequestError("filter values must be finite", field="where")
    return repr(float(value))


def metadata_filter(where: dict[str, MetadataValue]) -> str:
    """A Milvus filter true when metadata equals ``where`` on every key ("" = all)."""
    clauses = []
    for key, value in where.items():
        field = f"metadata[{_string(key)}]"
        if value is None:
            clauses.append(f"{field} is null")
        else:
            clauses.append(f"{field} == {_literal(value)}")
    return " and ".join(clauses)


def matches(metadata: dict[str, Any], where: dict[str, MetadataValue]) -> bool:
    """Whether ``metadata`` equals ``where`` on every key, JSON types kept apart.

    The SQLite store's semantics (``true`` is not ``1``, ``"1"`` is not ``1``, a null
    needs the key present); applied to every row Milvus returns for a filter.
    """
    for key, value in where.items():
        if key not in metadata:
            return False
        have = metadata[key]
        if value is None or isinstance(value, bool | str):
            if type(have) is not type(value) or have != value:
                return False
        elif isinstance(have, bool) or not isinstance(have, int | float):
            return False
        elif have != value:
            return False
    return True


class _SeqClock:
    """Increasing int64 seqs: microseconds since the epoch, never repeated here.

    Shared by every collection of the process. Across replicas the order follows
    the clocks: paging misses nothing as long as they agree to within the time
    between a write and a page that should see it.
    """

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def take(self, count: int) -> int:
        """The first of ``count`` consecutive new seqs."""
        with self._lock:
            first = max(time.time_ns() // 1000, self._last + 1)
            self._last = first + count - 1
            return first


SEQS = _SeqClock()


class Guarded:
    """A ``MilvusClient`` whose every call reports Milvus's failures as normcal's.

    The one place pymilvus errors are translated (see the module docstring):

    * an error pymilvus or the server puts on the request itself (``ParamError``,
      ``is_input_error``) is normcal's to interpret and passes unchanged: normcal
      checks users' input before any call, so one reaching Milvus is a bug or a
      missing engine feature (``create`` turns that into a 422);
    * a collection not found is a 404 when the wrapped client serves one normcal
      collection (``collection``), e.g. after another replica dropped it;
    * a released collection is loaded and the call retried once;
    * anything else (no connection, timeout, server failure) is a 503 naming Milvus
      and its URI, never the token; nothing was written that a retry would not
      converge (upserts are idempotent by id).
    """

    def __init__(self, client: Any, uri: str, collection: str | None = None) -> None:
        self.raw = client
        self._uri = uri
        self._collection = collection

    def for_collection(self, name: str) -> Guarded:
        """The same client, reporting a missing Milvus collection as ``name``'s 404."""
        return Guarded(self.raw, self._uri, name)

    def __getattr__(self, method: str) -> Any:
        call = getattr(self.raw, method)

        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                result = self._call(call, args, kwargs)
            except MilvusException as error:
                ours = self._translate(error)
                if ours is None:
                    raise
                raise ours from error
            if method.endswith("_iterator"):  # its next() calls Milvus too
                return Guarded(result, self._uri, self._collection)
            return result

        return guarded

    def _call(self, call: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        try:
            return call(*args, **kwargs)
        except MilvusException as error:
            if error.code != _NOT_LOADED or not args:
                raise
            self.raw.load_collection(args[0])  # args[0]: the collection's name
            return call(*args, **kwargs)

    def _translate(self, error: MilvusException) -> NormcalError | None:
        """The error to report for ``error``; None: the caller's to interpret."""
        if isinstance(error, ParamError) or error.is_input_error:
            return None
        if error.code == _NOT_FOUND and self._collection is not None:
            return NotFoundError("collection", self._collection)
        return StorageUnavailableError(
            f"Milvus at {self._uri} is unavailable: {error.message or error}",
            retry_after=_RETRY_AFTER,
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
    ) -> None:
        self.client = Guarded(MilvusClient(uri=uri, token=token), uri)
        self._load_calibrator = load_calibrator
        self._index_type: IndexType = index_type
        self._hnsw = {"M": hnsw_m, "efConstruction": max(ef_search, 64)}
        self.ef_search = ef_search

    def create(self, name: str, meta: dict[str, Any]) -> MilvusCollection[C]:
        """Create both Milvus collections of ``name`` (``ConflictError`` if taken)."""
        docs, state = milvus_name(name, _DOCS), milvus_name(name, _STATE)
        if self.client.has_collection(docs) or self.client.has_collection(state):
            raise ConflictError(f"collection {name!r} already exists")
        self._create_documents(docs, int(meta["dim"]))
        self._create_state(state)
        collection = MilvusCollection(name, self, self._load_calibrator, {})
        collection.set_meta(**{**meta, "name": name, "index_type": self._index_type})
        return collection

    def open(self, name: str) -> MilvusCollection[C]:
        """Open a stored collection (``NotFoundError`` if absent)."""
        state = milvus_name(name, _STATE)
        if not self.client.has_collection(state):
            raise NotFoundError("collection", name)
        rows = _all(self.client, state, 'kind == "meta"', _STATE_FIELDS)
        meta = {r["key"]: r["data"]["value"] for r in rows}
        return MilvusCollection(name, self, self._load_calibrator, meta)

    def names(self) -> list[str]:
        """Names of the normcal collections stored, sorted."""
        found: list[str] = []
        for milvus in self.client.list_collections():
            if milvus.startswith(_STATE):
                rows = self.client.query(
                    milvus,
                    filter='kind == "meta" and key == "name"',
                    output_fields=["data"],
                )
                found.extend(str(r["data"]["value"]) for r in rows)
        return sorted(found)

    def drop(self, name: str) -> None:
        """Drop both Milvus collections of ``name`` (``NotFoundError`` if absent)."""
        kinds = [milvus_name(name, k) for k in (_DOCS, _STATE)]
        present = [m for m in kinds if self.client.has_collection(m)]
        if not present:
            raise NotFoundError("collection", name)
        for milvus in present:
            self.client.drop_collection(milvus)

    def close(self) -> None:
        """Close the client (Milvus Lite releases its file lock)."""
        self.client.close()

    def _create_documents(self, milvus: str, dim: int) -> None:
        schema = MilvusClient.create_schema(auto_id=False)
        schema.add_field(
            "id", DataType.VARCHAR, is_primary=True, max_length=_MAX_ID_BYTES
        )
        schema.add_field("seq", DataType.INT64)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
        schema.add_field(
            "text",
            DataType.VARCHAR,
            max_length=_MAX_TEXT_BYTES,
            enable_analyzer=True,
            enable_match=True,
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
        index = self.client.prepare_index_params()
        if self._index_type == "hnsw":
            index.add_index(
                "vector", index_type="HNSW", metric_type="IP", params=self._hnsw
            )
        else:
            index.add_index("vector", index_type="FLAT", metric_type="IP")
        index.add_index(
            "sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25"
        )
        index.add_index("seq", index_type="INVERTED")
        try:
            self.client.create_collection(
                milvus, schema=schema, index_params=index, consistency_level="Strong"
            )
        except MilvusException as error:
            raise BackendUnsupportedError(
                BACKEND,
                f"cannot create a collection with BM25 full-text search: "
                f"{error.message}",
            ) from error

    def _create_state(self, milvus: str) -> None:
        schema = MilvusClient.create_schema(auto_id=False)
        schema.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=80)
        schema.add_field("kind", DataType.VARCHAR, max_length=16)
        schema.add_field("key", DataType.VARCHAR, max_length=_MAX_TEXT_BYTES)
        schema.add_field("n", DataType.INT64)
        schema.add_field("data", DataType.JSON)
        schema.add_field("v", DataType.FLOAT_VECTOR, dim=len(_DUMMY))
        index = self.client.prepare_index_params()
        index.add_index("v", index_type="FLAT", metric_type="IP")
        self.client.create_collection(
            milvus, schema=schema, index_params=index, consistency_level="Strong"
        )


def _all(
    client: Guarded, milvus: str, filter_: str, fields: list[str]
) -> list[dict[str, Any]]:
    """Every row matching ``filter_`` (a query iterator: no result-size cap)."""
    iterator = client.query_iterator(
        milvus, batch_size=_QUERY_BATCH, filter=filter_, output_fields=fields
    )
    rows: list[dict[str, Any]] = []
    try:
        while batch := iterator.next():
            rows.extend(batch)
    finally:
        iterator.close()
    return rows


def _chunks(items: Sequence[Any]) -> Iterator[list[Any]]:
    for start in range(0, len(items), _QUERY_BATCH):
        yield list(items[start : start + _QUERY_BATCH])


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


def _pk(kind: str, key: str) -> str:
    return f"{kind}:{hashlib.sha256(key.encode()).hexdigest()}"


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
        self._client = storage.client.for_collection(name)
        self._docs = milvus_name(name, _DOCS)
        self._state = milvus_name(name, _STATE)
        self._ef_search = storage.ef_search
        self._load_calibrator = load_calibrator
        self.lock = RWLock()
        self.closed = False
        self.meta: dict[str, Any] = meta
        # term -> document frequency ("" -> documents), counted at _df_at (monotonic)
        self._df: dict[str, int] = {}
        self._df_at = 0.0
        self._df_lock = threading.Lock()
        active = meta.get("active_calibrator")
        self.profile: C | None = active_profile(name, active, self.calibrator)

    @property
    def state(self) -> MilvusCollection[C]:
        """Its calibrators, feedback, query log and judging queue (for now, itself)."""
        return self

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
        """One Milvus upsert of the batch; each document gets a new seq."""
        for doc in docs:
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
            self._forget_frequencies()

    def delete(self, doc_id: str) -> None:
        """Delete one document (``NotFoundError`` if absent)."""
        with self._writing():
            if not self._client.get(self._docs, ids=[doc_id], output_fields=["id"]):
                raise NotFoundError("document", doc_id)
            self._client.delete(self._docs, ids=[doc_id])
            self._forget_frequencies()

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
            for chunk in _chunks(sorted(set(ids))):
                for row in self._client.get(
                    self._docs, ids=chunk, output_fields=_DOC_FIELDS
                ):
                    out[str(row["id"])] = _document(row)
        return out

    def page(self, after: int, limit: int) -> list[StoredDocument]:
        """Up to ``limit`` documents with a seq above ``after``, in seq order.

        Milvus queries have no ORDER BY (Milvus Lite ignores ``order_by_fields``), so
        the page is found by a narrowing keyset window (:meth:`_page_seqs`): a few
        capped queries of the ``seq`` field, then one read of the page's rows.
        """
        with self._reading():
            seqs = self._page_seqs(int(after), limit)
            if not seqs:
                return []
            rows = self._client.query(
                self._docs, filter=f"seq in {seqs}", output_fields=_DOC_FIELDS
            )
        return sorted((_document(r) for r in rows), key=lambda d: d.seq)

    def _page_seqs(self, after: int, limit: int) -> list[int]:
        """The ``limit`` smallest seqs above ``after``, reading a bounded window.

        A query capped at :data:`_QUERY_WINDOW` rows returns *some* seqs of its range;
        if it is not full it returned all of them. If it is full, the ``limit``-th
        smallest seq it saw bounds the answer from above, so the range shrinks to
        ``(after, bound]`` and is read again: each round either completes or narrows
        (Milvus returns rows roughly in insertion order, so one narrowing usually
        suffices). Past :data:`_PAGE_ROUNDS` rounds, every seq above ``after`` is
        scanned (the old, always-correct way).
        """
        expr = f"seq > {after}"
        for _ in range(_PAGE_ROUNDS):
            rows = self._client.query(
                self._docs, filter=expr, output_fields=["seq"], limit=_QUERY_WINDOW
            )
            seqs = sorted(int(r["seq"]) for r in rows)
            if len(seqs) < _QUERY_WINDOW:
                return seqs[:limit]
            bound = seqs[min(limit, len(seqs)) - 1]
            narrower = f"seq > {after} and seq <= {bound}"
            if narrower == expr:  # a full window that cannot narrow: scan
                break
            expr = narrower
        return sorted(
            int(r["seq"]) for r in _all(self._client, self._docs, expr, ["seq"])
        )[:limit]

    def delete_where(self, where: dict[str, MetadataValue]) -> int:
        """Delete every document matching ``where`` (all when empty); return how many.

        The matching ids are read and checked, then deleted by id: never by a filter
        that could match more than was checked.
        """
        expr = metadata_filter(where)
        with self._writing():
            rows = _all(self._client, self._docs, expr, ["id", "metadata"])
            ids = [r["id"] for r in rows if matches(r["metadata"], where)]
            for chunk in _chunks(ids):
                self._client.delete(self._docs, ids=chunk)
            self._forget_frequencies()
        return len(ids)

    def delete_ids(self, ids: Sequence[str]) -> int:
        """Delete the documents among ``ids`` (unknown ones are skipped); how many."""
        with self._writing():
            found = [
                str(row["id"])
                for chunk in _chunks(sorted(set(ids)))
                for row in self._client.get(self._docs, ids=chunk, output_fields=["id"])
            ]
            for chunk in _chunks(found):
                self._client.delete(self._docs, ids=chunk)
        return len(found)

    def search(
        self,
        vectors: NDArray[np.float32],
        texts: Sequence[str],
        n: int,
        where: dict[str, MetadataValue] | None = None,
    ) -> list[Pool]:
        """The hybrid pool of each query: dense top-``n`` by IP, then Milvus's BM25.

        One dense request and one BM25 request carry every query of the call.
        BM25 is Milvus's (its analyzer, IDF per segment in Milvus Lite), listed to
        depth ``max(n, LEXICAL_DEPTH)``: a dense hit beyond it scores 0, where the
        SQLite backend scores every match. ``idf_mass`` uses cached document
        frequencies (:meth:`_idf_masses`).
        """
        where = where or {}
        expr = metadata_filter(where)
        fields = [*_DOC_FIELDS, "vector"]
        with self._reading():
            dense = self._client.search(
                self._docs,
                data=np.asarray(vectors, dtype=np.float32).tolist(),
                anns_field="vector",
                limit=n,
                filter=expr,
                output_fields=fields,
                search_params={"metric_type": "IP", "params": {"ef": self._ef_search}},
            )
            lex = self._lexical(texts, max(n, LEXICAL_DEPTH), expr, fields)
            masses = self._idf_masses(texts)
        return [
            self._pool(vectors[i], n, where, dense[i], lex[i], masses[i])
            for i in range(len(texts))
        ]

    def _pool(
        self,
        vector: NDArray[np.float32],
        n: int,
        where: dict[str, MetadataValue],
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
            if matches(entity["metadata"], where):
                rows[entity["id"]] = entity
                cosine[entity["id"]] = float(hit["distance"])
                dense_ids.append(entity["id"])
        lex_ids: list[str] = []
        for hit in lex:
            entity = hit["entity"]
            if matches(entity["metadata"], where):
                rows.setdefault(entity["id"], entity)
                # BM25 is never negative; Milvus Lite reports it as a negative distance.
                bm25[entity["id"]] = abs(float(hit["distance"]))
                lex_ids.append(entity["id"])
        ids = candidate_pool(dense_ids, lex_ids, n)
        for doc_id in ids:
            if doc_id not in cosine:
                stored = np.asarray(rows[doc_id]["vector"], dtype=np.float32)
                cosine[doc_id] = float(np.dot(stored, vector))
        in_dense = set(dense_ids)
        at = {d: i for i, d in enumerate(ids)}
        return Pool(
            hits=[Hit(_document(rows[d]), cosine[d]) for d in ids],
            n_dense=sum(1 for d in ids if d in in_dense),
            lexical_order=[at[d] for d in lex_ids[:n] if d in at],
            lexical=LexicalEvidence(
                bm25=np.array([bm25.get(d, 0.0) for d in ids], dtype=np.float64),
                rank=lexical_ranks(ids, lex_ids),
                idf_mass=idf_mass,
                top=bm25[lex_ids[0]] if lex_ids else 0.0,
            ),
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

        Document frequencies are ``text_match`` counts (the terms are
        ``lexical.query_terms``: word characters only, no quoting issue), kept in a
        per-collection cache with the document total they were counted against: a
        term costs one count the first time any query uses it. This process's writes
        clear the cache; other replicas' writes are seen within :data:`_DF_TTL`
        seconds. Between the two, ``idf_mass`` is that of a slightly older collection
        state, where the SQLite backend's is exact: a normalisation scale that moves
        by the log of a relative change in counts, so the ``lex`` feature drifts by
        far less than the calibrators' noise.
        """
        terms = [lexical.query_terms(t) for t in texts]
        if not any(terms):
            return [0.0] * len(texts)
        with self._df_lock:
            if time.monotonic() - self._df_at > _DF_TTL:
                self._df.clear()
            if not self._df:
                self._df_at = time.monotonic()
                self._df[""] = self._count("")
            for term in dict.fromkeys(t for ts in terms for t in ts):
                if term not in self._df:
                    self._df[term] = self._count(f"text_match(text, {_string(term)})")
            df = dict(self._df)
        total = df[""]
        if total == 0:
            return [0.0] * len(texts)
        return [
            sum(math.log1p((total - df[t] + 0.5) / (df[t] + 0.5)) for t in ts)
            for ts in terms
        ]

    def _forget_frequencies(self) -> None:
        """Drop cached document frequencies: this process just changed the documents."""
        with self._df_lock:
            self._df.clear()

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

    # -- state rows ---------------------------------------------------------------------
    def _rows(self, kind: str) -> list[dict[str, Any]]:
        return _all(
            self._client, self._state, f"kind == {_string(kind)}", _STATE_FIELDS
        )

    def _put(self, kind: str, items: Sequence[tuple[str, int, dict[str, Any]]]) -> None:
        if items:
            self._client.upsert(
                self._state,
                [
                    {
                        "pk": _pk(kind, key),
                        "kind": kind,
                        "key": key,
                        "n": n,
                        "data": data,
                        "v": _DUMMY,
                    }
                    for key, n, data in items
                ],
            )

    def _remove(self, kind: str, keys: Sequence[str]) -> None:
        for chunk in _chunks([_pk(kind, k) for k in keys]):
            self._client.delete(self._state, ids=chunk)

    def set_meta(self, **values: Any) -> None:
        """Persist meta keys (one state row each) and refresh the cached copy."""
        with self._reading():
            self._put("meta", [(k, 0, {"value": v}) for k, v in values.items()])
        self.meta.update(values)

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

    def delete_judgments(self, query: str | None) -> int:
        """Delete stored feedback (all, or one query's); return how many."""
        with self._writing():
            keys = [
                r["key"]
                for r in self._rows("judgment")
                if query is None or r["data"]["query"] == query
            ]
            self._remove("judgment", keys)
        return len(keys)

    # -- query log and judging queue ----------------------------------------------------
    def log_queries(self, queries: Sequence[str], retention: int) -> None:
        """Count searched query texts, keeping the ``retention`` most recent."""
        now = time.time()
        with self._writing():
            known = {r["key"]: r["data"] for r in self._rows("log")}
            for query in queries:
                entry = known.get(query) or {"first_seen": now, "count": 0}
                known[query] = {**entry, "last_seen": now, "count": entry["count"] + 1}
            self._put("log", [(q, 0, known[q]) for q in dict.fromkeys(queries)])
            self._trim(retention)

    def _trim(self, retention: int) -> int:
        rows = sorted(self._rows("log"), key=lambda r: -r["data"]["last_seen"])
        self._remove("log", [r["key"] for r in rows[retention:]])
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
                self._state,
                ids=[_pk("queue", query), _pk("log", query)],
                output_fields=["pk"],
            )
            if not known:
                return False
            self._put("skip", [(query, 0, {"skipped_at": time.time()})])
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
            self._state, ids=[_pk("calibrator", calibrator_id)], output_fields=["data"]
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

    def add_calibrator(self, profile: C, *, activate: bool) -> None:
        """Store a fitted calibrator, then (a second write) activate it."""
        data = {"method": profile.method, "profile": profile.to_json()}
        with self._writing():
            self._put("calibrator", [(profile.id, SEQS.take(1), data)])
            if activate:
                self._put("meta", [("active_calibrator", 0, {"value": profile.id})])
        if activate:
            self.meta["active_calibrator"] = profile.id
            self.profile = profile

    def activate(self, calibrator_id: str) -> C:
        """Make a stored calibrator the active one (``NotFoundError`` if absent)."""
        with self._writing():
            data = self._stored_calibrator(calibrator_id)
            if data is None:
                raise NotFoundError("calibrator", calibrator_id)
            self._put("meta", [("active_calibrator", 0, {"value": calibrator_id})])
        profile = self._load_calibrator(data)
        self.meta["active_calibrator"] = calibrator_id
        self.profile = profile
        return profile

    def deactivate(self) -> None:
        """Serve no fitted calibrator: the owner's default applies again."""
        with self._writing():
            self._remove("meta", ["active_calibrator"])
        self.meta.pop("active_calibrator", None)
        self.profile = None

    def delete_calibrator(self, calibrator_id: str) -> None:
        """Delete a stored calibrator; the active one is refused (``ConflictError``)."""
        with self._writing():
            active = self._client.get(
                self._state,
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
        is a ``NotFoundError`` here.
        """
        key = [_pk("meta", "active_calibrator")]
        with self._reading():
            rows = self._client.get(self._state, ids=key, output_fields=["data"])
        active = rows[0]["data"]["value"] if rows else None
        if active == self.meta.get("active_calibrator"):
            return
        profile = self.calibrator(active) if active else None
        if active:
            self.meta["active_calibrator"] = active
        else:
            self.meta.pop("active_calibrator", None)
        self.profile = profile

    def close(self) -> None:
        """Wait for in-flight work; later calls get 404 (the client is the storage's)."""
        with self.lock.write():
            self.closed = True


if TYPE_CHECKING:

    def _conforming(collection: MilvusCollection[C]) -> CollectionBackend[C]:
        """The type-checked proof that the Milvus collection is a backend."""
        return collection
