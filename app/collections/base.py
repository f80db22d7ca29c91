"""The storage seam: what the service needs of one collection, whatever stores it.

Two contracts, by aggregate: :class:`CollectionBackend` (documents and hybrid search)
and :class:`CollectionState` (calibrators, feedback, query log, judging queue),
which a collection offers as ``collection.state``. Each backend implements both, the
state by composition (it is given the collection's lock and its connection or
client):

* local: ``app.collections.local_collection.Collection`` (SQLite + FAISS, one file
  per collection) with ``app.collections.local_state.LocalState``;
* Milvus: ``app.collections.milvus.MilvusCollection`` (one Milvus collection for the
  documents) with ``app.collections.milvus_state.MilvusState`` (one for the state).

mypy checks each against its contract (the ``_conforming`` proofs beside them), so
a method added to one and not the other fails the type check, not a request.
:class:`Registry` is the set of collections, whichever backend holds them.

This module also holds the types both backends share (documents, pools, hits,
calibrators as storage sees them, quarantined collections): it imports no backend.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
from numpy.typing import NDArray

from app.collections.index import IndexType
from app.exceptions import CollectionUnavailableError, LimitExceededError
from app.schemas import filters
from calibration.features import LexicalEvidence

if TYPE_CHECKING:  # the one capability only the local backend offers
    from app.collections.snapshots import Snapshots

logger = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class Hit:
    """One search result."""

    document: StoredDocument
    score: float


@dataclass(frozen=True)
class Pool:
    """The hybrid candidate pool of one query (``calibration.fusion.candidate_pool``).

    ``hits`` holds the dense top-``n`` (first ``n_dense`` entries, cosine order), then
    the BM25 top-``n`` not among them (BM25 order), each with its cosine; ``lexical``
    is the BM25 evidence of every hit (ranks in the BM25 list of depth
    ``LEXICAL_DEPTH``); ``lexical_order`` the indices into ``hits`` of the BM25
    top-``n``, best first (kept apart from the ranks, which stop at
    ``LEXICAL_DEPTH`` while ``n`` may be deeper).
    """

    hits: list[Hit]
    n_dense: int
    lexical: LexicalEvidence
    lexical_order: list[int]

    def dense_top(self, k: int) -> list[int]:
        """Indices into ``hits`` of the dense top-``k``, best first."""
        return list(range(min(k, self.n_dense)))

    def lexical_top(self, k: int) -> list[int]:
        """Indices into ``hits`` of the BM25 top-``k``, best first."""
        return self.lexical_order[:k]


@dataclass(frozen=True)
class Unavailable:
    """A quarantined collection: its file and why it could not be opened."""

    name: str
    path: Path
    reason: str

    def error(self) -> CollectionUnavailableError:
        """The 503 every request on it gets."""
        return CollectionUnavailableError(self.name, self.path.name, self.reason)


class StoredCalibrator(Protocol):
    """What storage needs of a calibrator: its id, its method, its JSON."""

    @property
    def id(self) -> str:
        """Unique id, the key it is stored and activated under."""
        ...

    @property
    def method(self) -> str:
        """Calibration method, stored beside the JSON for listings."""
        ...

    @property
    def created_at(self) -> float:
        """When it was made (seconds since the epoch), stored beside the JSON too."""
        ...

    def to_json(self) -> dict[str, Any]:
        """The JSON that ``load_calibrator`` turns back into the object."""
        ...


C = TypeVar("C", bound=StoredCalibrator)


@dataclass(frozen=True)
class CalibratorEntry:
    """A stored calibrator as a listing shows it, read without its JSON."""

    position: int  # grows with each one stored: where a listing's page ends
    id: str
    method: str
    created_at: float


# A document's new metadata from its id and current metadata (may raise to refuse).
ReviseMetadata = Callable[[str, dict[str, Any]], dict[str, Any]]
# Turns a stored calibrator's JSON back into the owner's object.
CalibratorLoader = Callable[[dict[str, Any]], C]


def check_calibrator_cap(stored: int, cap: int | None) -> None:
    """Refuse (``LimitExceededError``) one more calibrator when ``cap`` are stored."""
    if cap is not None and stored >= cap:
        raise LimitExceededError(
            "calibrators",
            cap,
            stored + 1,
            rule="limits.max_calibrators_per_collection: delete one "
            "(DELETE .../calibrators/{id}) first",
        )


def active_profile(
    collection: str, active: str | None, load: Callable[[str], C]
) -> C | None:
    """The stored active calibrator; None (the owner's default) if it does not decode.

    A profile stored before profiles were checked may not decode today: that is
    logged and the collection still serves, rather than being quarantined.
    """
    if not active:
        return None
    try:
        return load(active)
    except ValueError as error:
        logger.warning(
            "the active calibrator %s of %s does not decode (%s); serving the default",
            active,
            collection,
            getattr(error, "field", None) or "profile",
        )
        return None


def decodable(
    collection: str,
    stored: Sequence[dict[str, Any]],
    load: CalibratorLoader[C],
    *,
    strict: bool = False,
) -> list[C]:
    """The stored calibrators that decode; a row that does not is logged and skipped.

    A profile stored before profiles were checked may not decode today; it must not
    make every listing of the collection fail (the loader raises ``ValueError``,
    of which ``calibration``'s format errors are). ``strict``: raise instead (a
    snapshot about to be restored must decode whole).
    """
    out = []
    for data in stored:
        try:
            out.append(load(data))
        except ValueError as error:
            if strict:
                raise
            logger.warning(
                "a stored calibrator of %s does not decode (%s); left out",
                collection,
                getattr(error, "field", None) or "profile",
            )
    return out


class CollectionState(Protocol[C]):
    """One collection's state besides its documents, whatever stores it.

    Calibrators (and which one is active), feedback judgments, the opt-in query log
    and the judging queue. ``app.collections.local_state.LocalState`` (in the
    collection's SQLite file) and ``app.collections.milvus_state.MilvusState`` (in
    its Milvus state collection) satisfy it; a collection offers it as ``state``.
    """

    @property
    def profile(self) -> C | None:
        """The active calibrator, decoded; None serves the owner's default."""
        ...

    # -- feedback -----------------------------------------------------------------------
    def judgments(self) -> list[tuple[str, str, int]]:
        """Stored feedback ``(query, document_id, relevance)``, oldest first."""
        ...

    def judgments_count(self) -> int:
        """How many feedback judgments are stored."""
        ...

    def add_judgments(self, rows: Sequence[tuple[str, str, int]]) -> int:
        """Store feedback for the next fit; return the new total."""
        ...

    def judgments_page(
        self, limit: int, after: int
    ) -> list[tuple[int, str, str, int, float]]:
        """Up to ``limit`` ``(n, query, document_id, relevance, created_at)`` after ``after``."""
        ...

    def delete_judgments(
        self, query: str | None, document_id: str | None = None
    ) -> int:
        """Delete stored feedback (all, one query's, or one pair's); return how many."""
        ...

    # -- query log and judging queue ----------------------------------------------------
    def log_queries(
        self, queries: Sequence[str], retention: int, max_chars: int
    ) -> None:
        """Count searched query texts in the opt-in query log.

        A text is kept to its first ``max_chars`` characters, the entry flagged
        ``truncated`` when that cut it; the ``retention`` most recent are kept.
        """
        ...

    def truncated_in_log(self, query: str) -> bool:
        """Whether the log's entry ``query`` was cut to fit (False: no such entry)."""
        ...

    def log_rerank(
        self,
        query: str,
        documents: str,
        confidence: float | None,
        retention: int,
        max_chars: int,
    ) -> None:
        """Log a rerank request: its query in the query log, its documents (JSON).

        The query is kept to its first ``max_chars`` characters, as searched ones are.
        """
        ...

    def rerank_lists(
        self, queries: Sequence[str]
    ) -> dict[str, tuple[str, float | None]]:
        """The logged documents (JSON) and confidence of each query that has them."""
        ...

    def trim_query_log(self, retention: int) -> int:
        """Apply a new retention now; return how many log entries remain."""
        ...

    def query_log_size(self) -> int:
        """Distinct queries in the query log."""
        ...

    def add_judging_queries(self, queries: Sequence[str]) -> int:
        """Queue uploaded queries to judge; return how many were new."""
        ...

    def judging_candidates(self, limit: int) -> tuple[str, list[str], int]:
        """``(source, up to limit queries, how many in all)`` still to judge."""
        ...

    def skip_judging(self, query: str) -> bool:
        """Never offer ``query`` again; False when it is neither queued nor logged."""
        ...

    def unskip_judging(self, query: str) -> bool:
        """Offer a skipped ``query`` again; False when it was not skipped."""
        ...

    def judging_counts(self) -> tuple[int, int, int]:
        """``(judged queries, with a relevant judgment, skipped)``."""
        ...

    # -- calibrators ---------------------------------------------------------------------
    def calibrator(self, calibrator_id: str) -> C:
        """Load a stored calibrator (``NotFoundError`` if absent)."""
        ...

    def calibrators(self) -> list[C]:
        """Every stored calibrator, oldest first."""
        ...

    def calibrator_page(self, limit: int, after: int) -> list[CalibratorEntry]:
        """Up to ``limit`` stored calibrators past position ``after``, oldest first."""
        ...

    def calibrators_count(self) -> int:
        """How many calibrators are stored."""
        ...

    def add_calibrator(
        self, profile: C, *, activate: bool, cap: int | None = None
    ) -> None:
        """Store a fitted calibrator, optionally making it the active one.

        With ``cap``, refused (``LimitExceededError``, nothing stored) when ``cap``
        are stored already; counting and storing are one step.
        """
        ...

    def activate(self, calibrator_id: str) -> C:
        """Make a stored calibrator the active one (``NotFoundError`` if absent)."""
        ...

    def deactivate(self) -> None:
        """Serve no fitted calibrator: the owner's default applies again."""
        ...

    def delete_calibrator(self, calibrator_id: str) -> None:
        """Delete a stored calibrator; the active one is refused (``ConflictError``)."""
        ...


class CollectionBackend(Protocol[C]):
    """One collection's documents and hybrid search (see the module docstring)."""

    name: str
    meta: dict[str, Any]
    """Cached meta (``model``, ``dim``, ``active_calibrator``, settings, …)."""

    @property
    def state(self) -> CollectionState[C]:
        """Its calibrators, feedback, query log and judging queue."""
        ...

    @property
    def index_type(self) -> IndexType:
        """The kind of vector index serving the collection."""
        ...

    # -- documents ----------------------------------------------------------------------
    def upsert(self, docs: Sequence[NewDocument]) -> None:
        """Insert or replace documents by id (a replaced one gets a new ``seq``)."""
        ...

    def delete(self, doc_id: str) -> None:
        """Delete one document (``NotFoundError`` if absent)."""
        ...

    def get(self, doc_id: str) -> StoredDocument:
        """Read one document (``NotFoundError`` if absent)."""
        ...

    def page(
        self, after: int, limit: int, where: filters.Node = filters.MATCH_ALL
    ) -> list[StoredDocument]:
        """Up to ``limit`` documents matching ``where`` past seq ``after``, in seq order."""
        ...

    def count(self, where: filters.Node) -> int:
        """How many documents match ``where``."""
        ...

    def get_many(self, ids: Sequence[str]) -> dict[str, StoredDocument]:
        """The stored documents among ``ids``, by id."""
        ...

    def delete_where(self, where: filters.Node) -> int:
        """Delete every document matching ``where``; return how many."""
        ...

    def delete_ids(self, ids: Sequence[str]) -> int:
        """Delete the documents among ``ids`` (unknown ones are skipped); how many."""
        ...

    def update_metadata(
        self, ids: Sequence[str], revise: ReviseMetadata
    ) -> list[StoredDocument]:
        """Set each document's metadata to ``revise(id, its metadata)``, as one write.

        Text, vector, norm, token count, BM25 entry and ``seq`` stay as they are.
        ``NotFoundError`` for the first id absent; then, as when ``revise`` raises,
        nothing changes. Returns the documents as stored now, in ``ids`` order.
        """
        ...

    def search(
        self,
        vectors: NDArray[np.float32],
        texts: Sequence[str],
        n: int,
        where: filters.Node = filters.MATCH_ALL,
    ) -> list[Pool]:
        """The hybrid pool of depth ``n`` of each query, restricted by ``where``."""
        ...

    def counts(self) -> tuple[int, int, int]:
        """Documents stored, in the lexical index, and in the vector index."""
        ...

    def missing(self, ids: Sequence[str]) -> list[str]:
        """The ids among ``ids`` that are not stored, sorted and deduplicated."""
        ...

    def norm_sample(self) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
        """Raw norms and token counts of stored documents (for norm references)."""
        ...

    def set_meta(self, **values: Any) -> None:
        """Persist meta keys and refresh the cached copy."""
        ...

    def close(self) -> None:
        """Wait for in-flight work, then release the storage; later calls get 404."""
        ...


class Registry(Protocol[C]):
    """What the service needs of the set of collections, whichever backend holds them.

    ``app.collections.registry.CollectionRegistry`` (one SQLite file per collection
    under the data dir) and ``app.collections.milvus_registry.MilvusRegistry`` (one
    Milvus) satisfy it; both enforce the same rules (case-insensitive unique names,
    the serving model's identity on use).
    """

    backend: str
    """``local`` or ``milvus``: names the backend in messages."""

    @property
    def snapshots(self) -> Snapshots | None:
        """The snapshots of its collections (the local backend's files), or None."""
        ...

    def load(self) -> None:
        """Open what is stored (never raises for one bad collection)."""
        ...

    def create(self, name: str, **extra_meta: Any) -> CollectionBackend[C]:
        """Create an empty collection (``ConflictError`` if the name is taken)."""
        ...

    def get(self, name: str) -> CollectionBackend[C]:
        """A collection (404 if absent, 503 if unavailable)."""
        ...

    def get_compatible(self, name: str) -> CollectionBackend[C]:
        """A collection whose vectors come from the serving model (409 if not)."""
        ...

    def names(self) -> list[str]:
        """Names of the collections being served, sorted."""
        ...

    def unavailable(self) -> list[Unavailable]:
        """Collections that cannot be served, by name."""
        ...

    def loading(self) -> list[str]:
        """Collections the storage is still loading (Milvus after a restart), sorted."""
        ...

    def storage_problem(self) -> str | None:
        """Why nothing can be written now (None when all is well)."""
        ...

    def drop(self, name: str) -> None:
        """Delete a collection and everything stored for it."""
        ...

    def close(self) -> None:
        """Close every collection and the storage."""
        ...


CLIENT_EMBEDDING = "client"
"""``meta["embedding"]`` of a collection whose clients send the vectors."""


def own_vectors(meta: dict[str, Any]) -> bool:
    """Whether a collection's vectors are the client's own (no server-side model).

    Its meta records the client's ``model`` (a name only) and ``dim``, no ``model_id``.
    """
    return meta.get("embedding") == CLIENT_EMBEDDING
