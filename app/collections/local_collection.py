"""One collection of the local backend: a SQLite store plus its derived FAISS index.

A collection's writers (upsert, delete) hold its write lock across the SQLite commit
*and* the index update, readers (search) hold the read lock, so a search never sees a
half-applied upsert and SQLite and FAISS always agree when the lock is free. Closing
(a drop) takes the write lock too: in-flight work finishes first, later calls get 404.

Its calibrators, feedback, query log and judging queue are ``state``
(:class:`~app.collections.local_state.LocalState`), on the same file and lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
from numpy.typing import NDArray

from app.collections.base import (
    C,
    CalibratorLoader,
    NewDocument,
    Pool,
    ReviseMetadata,
    StoredDocument,
)
from app.collections.index import IndexType, VectorIndex
from app.collections.local_state import LocalState
from app.collections.pool import pool_of
from app.collections.store import CollectionStore, Derive
from app.concurrency import RWLock
from app.exceptions import NotFoundError
from app.schemas import filters
from calibration.features import LEXICAL_DEPTH
from calibration.fusion import hybrid_pool

if TYPE_CHECKING:
    from app.collections.base import CollectionBackend

T = TypeVar("T")


class Collection(Generic[C]):
    """One collection: durable store, derived index, and the lock that binds them.

    Every method holds the lock and checks ``closed`` under it, so a call racing a
    drop either completes before the store closes or raises ``NotFoundError``.
    """

    def __init__(
        self,
        name: str,
        store: CollectionStore,
        index: VectorIndex,
        load_calibrator: CalibratorLoader[C],
    ) -> None:
        self.name = name
        self._store = store
        self.index = index
        self._load_calibrator = load_calibrator
        self.lock = RWLock()
        self.closed = False
        self.meta: dict[str, Any] = store.get_meta()
        store.start_lexical()  # in the background; FTS5 answers searches meanwhile
        self.state = LocalState(name, self._reading, load_calibrator, self.meta)

    @classmethod
    def open(
        cls,
        name: str,
        store: CollectionStore,
        load_calibrator: CalibratorLoader[C],
        *,
        kind: IndexType,
        **index_args: int,
    ) -> Collection[C]:
        """Open a stored collection and rebuild its index from SQLite."""
        meta = store.get_meta()
        index = VectorIndex(int(meta["dim"]), kind=kind, **index_args)
        return cls(name, store, _index_of(store, index), load_calibrator)

    @property
    def index_type(self) -> IndexType:
        """The kind of FAISS index serving the collection (``flat`` or ``hnsw``)."""
        return self.index.kind

    @contextmanager
    def _reading(self) -> Iterator[CollectionStore]:
        with self.lock.read():
            self._check_open()
            yield self._store

    @contextmanager
    def _writing(self) -> Iterator[CollectionStore]:
        with self.lock.write():
            self._check_open()
            yield self._store

    def _check_open(self) -> None:
        if self.closed:
            raise NotFoundError("collection", self.name)

    def upsert(self, docs: Sequence[NewDocument]) -> None:
        """Write documents and update the index as one unit (see :meth:`_unit`)."""
        vectors = np.stack([d.vector for d in docs])

        def index_write(removed: list[int], new: list[int]) -> None:
            self.index.remove(removed)
            self.index.add(np.asarray(new, dtype=np.int64), vectors)

        with self._writing() as store:
            self._unit(store, lambda derive: store.upsert(docs, derive), index_write)

    def delete(self, doc_id: str) -> None:
        """Delete one document (``NotFoundError`` if absent)."""
        with self._writing() as store:
            seq = self._unit(
                store, lambda derive: store.delete(doc_id, derive), self._index_remove
            )
        if seq is None:
            raise NotFoundError("document", doc_id)

    def _index_remove(self, removed: list[int], _: list[int]) -> None:
        self.index.remove(removed)

    def _unit(
        self,
        store: CollectionStore,
        write: Callable[[Derive], T],
        index_write: Derive,
    ) -> T:
        """Run a store write with ``index_write`` inside its transaction, as one unit.

        The store calls ``index_write`` before COMMIT (and keeps its postings in
        step: ``CollectionStore._write_documents``). When anything fails after the
        index was changed (the rest of the index write, COMMIT), the transaction is
        rolled back and the index rebuilt from the file, which holds the state from
        before: a write that fails leaves SQLite, FTS5, the postings and FAISS as
        they were. The rebuild reads every vector (a failure path only). Under the
        write lock, so no search sees the index in between.
        """
        touched = False

        def derive(removed: list[int], new: list[int]) -> None:
            nonlocal touched
            touched = True
            index_write(removed, new)

        try:
            return write(derive)
        except BaseException:
            if touched:
                self.index = _index_of(store, self.index.emptied())
            raise

    def get(self, doc_id: str) -> StoredDocument:
        """Read one document (``NotFoundError`` if absent)."""
        with self._reading() as store:
            doc = store.get(doc_id)
        if doc is None:
            raise NotFoundError("document", doc_id)
        return doc

    def page(
        self, after: int, limit: int, where: filters.Node = filters.MATCH_ALL
    ) -> list[StoredDocument]:
        """Up to ``limit`` documents matching ``where`` past seq ``after``, in seq order."""
        with self._reading() as store:
            return store.page(after, limit, where)

    def count(self, where: filters.Node) -> int:
        """How many documents match ``where``."""
        with self._reading() as store:
            return store.count(where)

    def get_many(self, ids: Sequence[str]) -> dict[str, StoredDocument]:
        """The stored documents among ``ids``, by id."""
        with self._reading() as store:
            return store.get_many(ids)

    def delete_where(self, where: filters.Node) -> int:
        """Delete every document matching ``where``; return how many."""
        return self._delete_many(lambda store, d: store.delete_where(where, d))

    def delete_ids(self, ids: Sequence[str]) -> int:
        """Delete the documents among ``ids`` (unknown ones are skipped); how many."""
        return self._delete_many(lambda store, d: store.delete_ids(ids, d))

    def update_metadata(
        self, ids: Sequence[str], revise: ReviseMetadata
    ) -> list[StoredDocument]:
        """New metadata for ``ids``, one transaction; FAISS and BM25 are untouched."""
        with self._writing() as store:
            return store.update_metadata(ids, revise)

    def _delete_many(
        self, delete: Callable[[CollectionStore, Derive], list[int]]
    ) -> int:
        """Run ``delete`` (returning the deleted seqs) and drop them from the index.

        One unit (:meth:`_unit`) under the write lock: a search sees all of them or
        none gone.
        """
        with self._writing() as store:
            seqs = self._unit(
                store, lambda derive: delete(store, derive), self._index_remove
            )
        return len(seqs)

    def search(
        self,
        vectors: NDArray[np.float32],
        texts: Sequence[str],
        n: int,
        where: filters.Node = filters.MATCH_ALL,
    ) -> list[Pool]:
        """The hybrid pool of depth ``n`` of each query, restricted by ``where``.

        One read lock covers FAISS and SQLite (documents and lexical index), so every
        pool sees one state of the collection.
        """
        with self._reading() as store:
            allowed = None if where == filters.MATCH_ALL else store.filter_seqs(where)
            scores, seqs = self.index.search(vectors, n, allowed)
            return [
                self._pool(store, vectors[i], texts[i], n, allowed, row_s, row_c)
                for i, (row_c, row_s) in enumerate(zip(scores, seqs, strict=True))
            ]

    def _pool(
        self,
        store: CollectionStore,
        vector: NDArray[np.float32],
        text: str,
        n: int,
        allowed: NDArray[np.int64] | None,
        dense_seqs: NDArray[np.int64],
        dense_scores: NDArray[np.float32],
    ) -> Pool:
        dense = [int(s) for s in dense_seqs if s >= 0]
        cosine = {
            int(s): float(c) for s, c in zip(dense_seqs, dense_scores, strict=True)
        }
        # The BM25 top the pool and the ranks use, and the BM25 of the dense hits
        # by lookup (from the store's in-memory postings once they are built).
        ranking = store.lexical_search(text, allowed, depth=max(n, LEXICAL_DEPTH))
        lex_seqs = [int(s) for s in ranking.top.seqs]
        docs = store.get_by_seqs(hybrid_pool(dense, lex_seqs, n).members)
        # A document deleted since the vector search is left out.
        shape = hybrid_pool(dense, lex_seqs, n, kept=docs)
        extra = [s for s in shape.members if s not in cosine]
        for seq, vec in store.vectors_of(extra).items():
            cosine[seq] = float(np.dot(vec, vector))
        top = ranking.top.scores
        return pool_of(
            shape,
            docs,
            cosine,
            ranking.bm25_of(shape.members),
            idf_mass=ranking.idf_mass,
            top=float(top[0]) if top.size else 0.0,
        )

    def wait_build(self, timeout: float) -> bool:
        """Whether no lexical build is under way, after up to ``timeout`` s for it."""
        return self._store.wait_build(timeout)

    def counts(self) -> tuple[int, int, int]:
        """Documents in SQLite, in the lexical index and vectors in FAISS.

        Read under one lock, so they agree whenever no write is in flight.
        """
        with self._reading() as store:
            return store.count(), store.lexical_count(), self.index.size

    def missing(self, ids: Sequence[str]) -> list[str]:
        """The ids among ``ids`` that are not stored, sorted and deduplicated."""
        wanted = sorted(set(ids))
        with self._reading() as store:
            known = store.seqs_of(wanted)
        return [i for i in wanted if i not in known]

    def norm_sample(self) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
        """Raw norms and token counts of stored documents (for norm references)."""
        with self._reading() as store:
            return store.norm_sample()

    def set_meta(self, **values: Any) -> None:
        """Persist meta keys and refresh the cached copy."""
        with self._reading() as store:
            store.set_meta(**values)
        self.meta.update(values)

    def close(self) -> None:
        """Wait for in-flight work, then close the store; later calls get 404."""
        with self.lock.write():
            self.closed = True
            self._store.close()


def _index_of(store: CollectionStore, index: VectorIndex) -> VectorIndex:
    """``index`` (empty) filled with every vector of the store's file."""
    for seqs, vectors in store.iter_vectors():
        index.add(seqs, vectors)
    return index


if TYPE_CHECKING:

    def _conforming(collection: Collection[C]) -> CollectionBackend[C]:
        """The type-checked proof that the SQLite + FAISS collection is a backend."""
        return collection
