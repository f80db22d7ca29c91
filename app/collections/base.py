"""The storage seam: what the service needs of one collection, whatever stores it.

:class:`CollectionBackend` is the surface ``app.services`` uses. Two classes satisfy it:
``app.collections.registry.Collection`` (SQLite + FAISS, one file per collection) and
``app.collections.milvus.MilvusCollection`` (one Milvus collection for the documents,
one for the per-collection state). mypy checks both against it (``_conforming`` here
and in ``milvus.py``), so a method added to one and not the other fails the type
check, not a request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
from numpy.typing import NDArray

from app.collections.index import IndexType
from app.collections.registry import Pool, StoredCalibrator, Unavailable
from app.collections.store import MetadataValue, NewDocument, StoredDocument

C = TypeVar("C", bound=StoredCalibrator)


class CollectionBackend(Protocol[C]):
    """One collection's documents, search and state (see the module docstring)."""

    name: str
    meta: dict[str, Any]
    """Cached meta (``model``, ``dim``, ``active_calibrator``, settings, …)."""
    profile: C | None
    """The active calibrator, decoded; None serves the owner's default."""

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

    def page(self, after: int, limit: int) -> list[StoredDocument]:
        """Up to ``limit`` documents with a seq above ``after``, in seq order."""
        ...

    def get_many(self, ids: Sequence[str]) -> dict[str, StoredDocument]:
        """The stored documents among ``ids``, by id."""
        ...

    def delete_where(self, where: dict[str, MetadataValue]) -> int:
        """Delete every document matching ``where`` (all when empty); return how many."""
        ...

    def delete_ids(self, ids: Sequence[str]) -> int:
        """Delete the documents among ``ids`` (unknown ones are skipped); how many."""
        ...

    def search(
        self,
        vectors: NDArray[np.float32],
        texts: Sequence[str],
        n: int,
        where: dict[str, MetadataValue] | None = None,
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

    def delete_judgments(self, query: str | None) -> int:
        """Delete stored feedback (all, or one query's); return how many."""
        ...

    # -- query log and judging queue ----------------------------------------------------
    def log_queries(self, queries: Sequence[str], retention: int) -> None:
        """Count searched query texts in the opt-in query log."""
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

    def judging_counts(self) -> tuple[int, int, int]:
        """``(judged queries, with a relevant judgment, skipped)``."""
        ...

    # -- calibrators and meta -----------------------------------------------------------
    def calibrator(self, calibrator_id: str) -> C:
        """Load a stored calibrator (``NotFoundError`` if absent)."""
        ...

    def calibrators(self) -> list[C]:
        """Every stored calibrator, oldest first."""
        ...

    def add_calibrator(self, profile: C, *, activate: bool) -> None:
        """Store a fitted calibrator, optionally making it the active one."""
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

    def storage_problem(self) -> str | None:
        """Why nothing can be written now (None when all is well)."""
        ...

    def drop(self, name: str) -> None:
        """Delete a collection and everything stored for it."""
        ...

    def close(self) -> None:
        """Close every collection and the storage."""
        ...


if TYPE_CHECKING:
    from app.collections.registry import Collection, CollectionRegistry

    def _conforming(collection: Collection[C]) -> CollectionBackend[C]:
        """The type-checked proof that the SQLite + FAISS collection is a backend."""
        return collection

    def _registry(registry: CollectionRegistry[C]) -> Registry[C]:
        """The type-checked proof that the local registry is a ``Registry``."""
        return registry
