"""Collections: a SQLite store plus its derived FAISS index, and the registry of them.

A collection's writers (upsert, delete) hold its write lock across the SQLite commit
*and* the index update, readers (search) hold the read lock, so a search never sees a
half-applied upsert and SQLite and FAISS always agree when the lock is free. Dropping
takes the write lock too: in-flight work finishes first, later calls get 404.

A file that cannot be opened at start-up is *quarantined*: left untouched, reported
as unavailable (503 on every use), and removed only by an explicit drop.

Calibrators are stored as JSON; storage knows nothing of how they are fitted or
scored. The registry's owner passes ``load_calibrator`` (``Profile.from_json``), so a
collection's methods return the owner's calibrator type, typed, and keep the active
one decoded in memory for search.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
from numpy.typing import NDArray

from app.api.schemas.common import COLLECTION_NAME_PATTERN
from app.collections.base import (
    C,
    CalibratorLoader,
    Hit,
    MetadataValue,
    NewDocument,
    Pool,
    StoredDocument,
    Unavailable,
    active_profile,
    decodable,
)
from app.collections.checks import check_file
from app.collections.index import IndexType, VectorIndex
from app.collections.ownership import DIR_MODE, lock_data_dir
from app.collections.postings import LexicalBuilds
from app.collections.store import (
    CollectionStore,
    Derive,
    OpenConnections,
    UnusableStoreError,
    backup_database,
    build_store,
    storage_errors,
)
from app.concurrency import RWLock
from app.exceptions import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    StorageUnavailableError,
)
from calibration.features import LEXICAL_DEPTH, LexicalEvidence
from calibration.fusion import candidate_pool, lexical_ranks

logger = logging.getLogger(__name__)

_NAME_RE = re.compile(COLLECTION_NAME_PATTERN)
_SUFFIX = ".sqlite3"
_BUILDING = ".creating-"  # ".NAME.creating-RANDOM.sqlite3": never matches a name
_SIDE_FILES = ("", "-wal", "-shm", "-journal")
# Device names Windows refuses as file names, whatever the case or extension.
RESERVED_NAMES = frozenset(
    {"CON", "PRN", "AUX", "NUL"}
    | {f"{port}{i}" for port in ("COM", "LPT") for i in range(1, 10)}
)


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
        active = self.meta.get("active_calibrator")
        # Replaced by one assignment on activation: a search reads it once, so it
        # sees either the old calibrator or the new one, never a mix.
        self.profile: C | None = active_profile(name, active, self.calibrator)

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

    def page(self, after: int, limit: int) -> list[StoredDocument]:
        """Up to ``limit`` documents with a seq above ``after``, in seq order."""
        with self._reading() as store:
            return store.page(after, limit)

    def get_many(self, ids: Sequence[str]) -> dict[str, StoredDocument]:
        """The stored documents among ``ids``, by id."""
        with self._reading() as store:
            return store.get_many(ids)

    def delete_where(self, where: dict[str, MetadataValue]) -> int:
        """Delete every document matching ``where`` (all when empty); return how many."""
        return self._delete_many(lambda store, d: store.delete_where(where, d))

    def delete_ids(self, ids: Sequence[str]) -> int:
        """Delete the documents among ``ids`` (unknown ones are skipped); how many."""
        return self._delete_many(lambda store, d: store.delete_ids(ids, d))

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
        where: dict[str, MetadataValue] | None = None,
    ) -> list[Pool]:
        """The hybrid pool of depth ``n`` of each query, restricted by ``where``.

        One read lock covers FAISS and SQLite (documents and lexical index), so every
        pool sees one state of the collection.
        """
        with self._reading() as store:
            allowed = store.filter_seqs(where) if where else None
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
        seqs = candidate_pool(dense, lex_seqs, n)
        docs = store.get_by_seqs(seqs)
        extra = [s for s in seqs if s not in cosine]
        for seq, vec in store.vectors_of(extra).items():
            cosine[seq] = float(np.dot(vec, vector))
        seqs = [s for s in seqs if s in docs]  # a doc deleted since the search is gone
        in_dense = set(dense)
        at = {s: i for i, s in enumerate(seqs)}
        top = ranking.top.scores
        return Pool(
            hits=[Hit(docs[s], cosine[s]) for s in seqs],
            n_dense=sum(1 for s in seqs if s in in_dense),
            lexical_order=[at[s] for s in lex_seqs[:n] if s in at],
            lexical=LexicalEvidence(
                bm25=ranking.bm25_of(seqs),
                rank=lexical_ranks(seqs, lex_seqs),
                idf_mass=ranking.idf_mass,
                top=float(top[0]) if top.size else 0.0,
            ),
        )

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

    def judgments(self) -> list[tuple[str, str, int]]:
        """Stored feedback ``(query, document_id, relevance)``, oldest first."""
        with self._reading() as store:
            return store.judgments()

    def judgments_count(self) -> int:
        """How many feedback judgments are stored."""
        with self._reading() as store:
            return store.judgments_count()

    def add_judgments(self, rows: Sequence[tuple[str, str, int]]) -> int:
        """Store feedback for the next fit; return the new total."""
        with self._reading() as store:
            return store.add_judgments(rows)

    # The judging loop's queries. Like feedback, these writes take the read lock: they
    # touch no document, and the store serialises its own transactions.
    def log_queries(self, queries: Sequence[str], retention: int) -> None:
        """Count searched query texts in the opt-in query log."""
        with self._reading() as store:
            store.log_queries(queries, retention)

    def trim_query_log(self, retention: int) -> int:
        """Apply a new retention now; return how many log entries remain."""
        with self._reading() as store:
            return store.trim_query_log(retention)

    def query_log_size(self) -> int:
        """Distinct queries in the query log."""
        with self._reading() as store:
            return store.query_log_size()

    def add_judging_queries(self, queries: Sequence[str]) -> int:
        """Queue uploaded queries to judge; return how many were new."""
        with self._reading() as store:
            return store.add_judging_queries(queries)

    def judging_candidates(self, limit: int) -> tuple[str, list[str], int]:
        """``(source, up to limit queries, how many in all)`` still to judge."""
        with self._reading() as store:
            return store.judging_candidates(limit)

    def skip_judging(self, query: str) -> bool:
        """Never offer ``query`` again; False when it is neither queued nor logged."""
        with self._reading() as store:
            return store.skip_judging(query)

    def judging_counts(self) -> tuple[int, int, int]:
        """``(judged queries, with a relevant judgment, skipped)``."""
        with self._reading() as store:
            return store.judging_counts()

    def norm_sample(self) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
        """Raw norms and token counts of stored documents (for norm references)."""
        with self._reading() as store:
            return store.norm_sample()

    def calibrator(self, calibrator_id: str) -> C:
        """Load a stored calibrator (``NotFoundError`` if absent)."""
        with self._reading() as store:
            data = store.load_calibrator(calibrator_id)
        if data is None:
            raise NotFoundError("calibrator", calibrator_id)
        return self._load_calibrator(data)

    def calibrators(self) -> list[C]:
        """Every stored calibrator, oldest first."""
        with self._reading() as store:
            stored = store.list_calibrators()
        return decodable(self.name, stored, self._load_calibrator)

    def add_calibrator(self, profile: C, *, activate: bool) -> None:
        """Store a fitted calibrator; activating it is part of the same commit."""
        with self._reading() as store:
            store.save_calibrator(
                profile.id, profile.method, profile.to_json(), active=activate
            )
        if activate:
            self.meta["active_calibrator"] = profile.id
            self.profile = profile

    def activate(self, calibrator_id: str) -> C:
        """Make a stored calibrator the active one (``NotFoundError`` if absent)."""
        with self._reading() as store:
            data = store.activate_calibrator(calibrator_id)
        if data is None:
            raise NotFoundError("calibrator", calibrator_id)
        profile = self._load_calibrator(data)
        self.meta["active_calibrator"] = calibrator_id
        self.profile = profile
        return profile

    def deactivate(self) -> None:
        """Serve no fitted calibrator: the owner's default applies again."""
        with self._reading() as store:
            store.clear_active_calibrator()
        self.meta.pop("active_calibrator", None)
        self.profile = None

    def delete_calibrator(self, calibrator_id: str) -> None:
        """Delete a stored calibrator; the active one is refused (``ConflictError``)."""
        with self._reading() as store:
            outcome = store.delete_calibrator(calibrator_id)
        if outcome is None:
            raise NotFoundError("calibrator", calibrator_id)
        if outcome == "active":
            raise ConflictError(
                f"calibrator {calibrator_id!r} is the active one of collection "
                f"{self.name!r}; activate another calibrator, or the default, "
                "before deleting it"
            )

    def judgments_page(
        self, limit: int, after: int
    ) -> list[tuple[int, str, str, int, float]]:
        """A page of stored feedback after cursor ``after`` (see the store)."""
        with self._reading() as store:
            return store.judgments_page(limit, after)

    def delete_judgments(self, query: str | None) -> int:
        """Delete stored feedback (all, or one query's); return how many."""
        with self._reading() as store:
            return store.delete_judgments(query)

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


class CollectionRegistry(Generic[C]):
    """All collections under ``data_dir``, loaded at start-up.

    Names are unique case-insensitively (``Kb`` and ``kb`` would be one file on a
    case-insensitive volume). At most ``max_open`` SQLite connections stay open;
    the others reopen on their next use. At most ``lexical_builds`` in-memory BM25
    indexes are built at once, in the background (``CollectionStore``).
    ``load_calibrator`` decodes a stored calibrator's JSON (see the module
    docstring). ``model_id`` is the serving model's identity
    (``app.embedding.identity``): new collections record it and one recorded by
    another model is refused; None records and checks nothing.
    """

    backend = "local"

    def __init__(
        self,
        data_dir: Path,
        *,
        model_name: str,
        dim: int,
        load_calibrator: CalibratorLoader[C],
        model_id: str | None = None,
        index_type: IndexType = "flat",
        hnsw_m: int = 32,
        ef_search: int = 128,
        synchronous: str = "FULL",
        max_open: int = 128,
        lexical_builds: int = 1,
    ) -> None:
        self.data_dir = data_dir
        self.model_name = model_name
        self.model_id = model_id
        self.dim = dim
        self._kind: IndexType = index_type
        self._index_args = {"hnsw_m": hnsw_m, "ef_search": ef_search}
        self._synchronous = synchronous
        self._connections = OpenConnections(max_open)
        self._builds = LexicalBuilds(lexical_builds)
        self._load_calibrator = load_calibrator
        self._collections: dict[str, Collection[C]] = {}
        self._unavailable: dict[str, Unavailable] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        """Open every collection file in ``data_dir``; quarantine the broken ones.

        Never raises for one bad file: the server must serve the healthy ones. An
        unwritable data dir is reported by :meth:`storage_problem`, not raised.
        """
        try:
            self.data_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        except OSError as error:
            logger.error("cannot create data dir %s: %s", self.data_dir, error)
            return
        self._remove_unfinished()
        for path in sorted(self.data_dir.glob(f"*{_SUFFIX}")):
            name = path.name.removesuffix(_SUFFIX)
            if not _NAME_RE.match(name):
                continue
            started = time.perf_counter()
            try:
                collection = self._open(name, path)
            except UnusableStoreError as error:
                self._unavailable[name] = Unavailable(name, path, str(error))
                logger.error(
                    "collection %s is unavailable, its file %s is left untouched: %s",
                    name,
                    path,
                    error,
                )
                continue
            self._collections[name] = collection
            logger.info(
                "loaded collection %s: %d documents in %.2fs",
                name,
                collection.index.size,
                time.perf_counter() - started,
            )

    def create(self, name: str, **extra_meta: Any) -> Collection[C]:
        """Create an empty collection (``ConflictError`` if the name is taken).

        The file is built complete under a temporary name, then renamed into place
        and the directory fsynced: a crash leaves a whole collection or none.
        """
        self.check_name(name)
        with self._lock:
            self._check_free(name)
            path = self._path(name)
            building = _building_path(self.data_dir, name)
            meta = {
                "name": name,
                "model": self.model_name,
                "dim": self.dim,
                "created_at": time.time(),
                **extra_meta,
            }
            if self.model_id is not None:
                meta["model_id"] = self.model_id
            with self._writing_files():
                try:
                    build_store(building, meta, synchronous=self._synchronous)
                    os.rename(building, path)
                    _fsync_dir(self.data_dir)
                finally:
                    _remove_files(building)
            collection = Collection.open(
                name,
                self._new_store(path),
                self._load_calibrator,
                kind=self._kind,
                **self._index_args,
            )
            self._collections[name] = collection
            return collection

    def get(self, name: str) -> Collection[C]:
        """Return a collection (404 if absent, 503 if quarantined)."""
        collection = self._collections.get(name)
        if collection is not None:
            return collection
        broken = self._unavailable.get(name)
        if broken is not None:
            raise broken.error()
        raise NotFoundError("collection", name)

    def get_compatible(self, name: str) -> Collection[C]:
        """Return a collection whose vectors come from the serving model.

        Vectors of another model are not comparable with this model's queries
        (theory.md §4.8): such a collection can be described and dropped, not used.
        The model is told by name and, when the collection recorded one, by the
        identity of its files: a different model under the same name is refused
        too. A collection from before identities were recorded is checked by name
        only, and is not given the serving model's identity behind the user's back.
        """
        collection = self.get(name)
        check_model(name, collection.meta, self.model_name, self.model_id)
        return collection

    def names(self) -> list[str]:
        """Names of the collections being served, sorted."""
        return sorted(self._collections.copy())  # copy: atomic while others mutate

    def unavailable(self) -> list[Unavailable]:
        """The quarantined collections, by name."""
        return sorted(self._unavailable.copy().values(), key=lambda u: u.name)

    def storage_problem(self) -> str | None:
        """Why new data cannot be written to ``data_dir`` (None when it can).

        Probes by creating and removing a file: permission bits alone say nothing
        about read-only mounts, or to root.
        """
        try:
            fd, probe = tempfile.mkstemp(prefix=".normcal-probe-", dir=self.data_dir)
            os.close(fd)
            os.unlink(probe)
        except OSError as error:
            return (
                f"data dir {self.data_dir} is not writable: {error.strerror or error}"
            )
        return None

    def drop(self, name: str) -> None:
        """Delete a collection and its files (a quarantined one too: operator's call)."""
        with self._lock:
            collection = self._collections.get(name)
            broken = self._unavailable.get(name)
            if collection is None and broken is None:
                raise NotFoundError("collection", name)
            if broken is not None and broken.path.is_dir():
                raise ConflictError(
                    f"{broken.path} is a directory, not a collection file; "
                    "remove it by hand"
                )
            if collection is not None:
                collection.close()
            self._collections.pop(name, None)
            self._unavailable.pop(name, None)
            with self._writing_files():
                for path in _side_files(self._path(name)):
                    path.unlink(missing_ok=True)

    def file_of(self, name: str) -> Path:
        """The file of a served collection (404 if absent, 503 if quarantined)."""
        self.get(name)
        return self._path(name)

    def restore(self, name: str, source: Path) -> Collection[C]:
        """Replace a collection (served or quarantined) by the snapshot file ``source``.

        The snapshot is never trusted: it is copied under a temporary name and that
        copy is opened with every check of a start-up load (the FAISS index is built
        from it then) before anything else is touched, so a refused snapshot changes
        nothing. Only then is the live collection closed (its write lock: in-flight
        work finishes, later calls on it get 404) and the copy renamed over its file;
        the copy's FTS5 lexical index and the freshly built FAISS index serve it.
        """
        with self._lock:
            old = self._collections.get(name)
            if old is None and name not in self._unavailable:
                raise NotFoundError("collection", name)
            path = self._path(name)
            if path.is_dir():
                raise ConflictError(f"{path} is a directory, not a collection file")
            with self._writing_files():
                staged, meta = _stage_snapshot(self.data_dir, name, source)
            try:
                trial = self._trial_open(name, staged, meta)
                if old is not None:
                    old.close()
                try:
                    with self._writing_files():
                        _replace_file(staged, path, self.data_dir)
                except BaseException:
                    if old is not None:  # its file is intact: serve it again
                        self._collections[name] = self._open(name, path)
                    raise
            finally:
                _remove_files(staged)
            self._unavailable.pop(name, None)
            collection = Collection(
                name, self._new_store(path), trial.index, self._load_calibrator
            )
            self._collections[name] = collection
            logger.info("restored collection %s from %s", name, source)
            return collection

    def _trial_open(
        self, name: str, staged: Path, meta: dict[str, Any]
    ) -> Collection[C]:
        """Open a staged, checked snapshot as a start-up load would, then close it.

        Every stored calibrator is decoded too (a start-up load decodes the active
        one only), so none of them fails a later listing.
        """
        try:
            trial = self._open(name, staged, meta)
        except UnusableStoreError as error:
            raise _refused(
                "the snapshot is not a usable collection", error
            ) from error.__cause__
        try:
            trial.calibrators()
        except Exception as error:
            raise InvalidRequestError(
                "the snapshot is not a usable collection: a stored calibrator "
                f"cannot be loaded ({type(error).__name__})"
            ) from error
        finally:
            trial.close()  # checkpoints the copy: it is one file again
        if trial.meta.get("model") != self.model_name:
            raise ConflictError(
                f"the snapshot was built with model {trial.meta.get('model')!r}, "
                f"not {self.model_name!r}"
            )
        stored_id = trial.meta.get("model_id")
        if None not in (stored_id, self.model_id) and stored_id != self.model_id:
            raise ConflictError(
                f"the snapshot was built with model files {stored_id!r}, not the "
                f"serving {self.model_id!r}"
            )
        return trial

    def close(self) -> None:
        """Close every collection."""
        with self._lock:
            for collection in self._collections.values():
                collection.close()
            self._collections.clear()
            self._unavailable.clear()
        self._builds.join()

    def _open(
        self, name: str, path: Path, meta: dict[str, Any] | None = None
    ) -> Collection[C]:
        """Check in full read-only, then open for writing (``UnusableStoreError``).

        ``meta``: what ``check_file`` returned for ``path`` when the caller ran it.
        """
        if meta is None:
            meta = check_file(path)
        dim = meta["dim"]
        if meta["model"] == self.model_name and dim != self.dim:
            raise UnusableStoreError(
                f"meta dim {dim} differs from model {self.model_name!r} (dim {self.dim})"
            )
        store = self._new_store(path)
        try:
            return Collection.open(
                name, store, self._load_calibrator, kind=self._kind, **self._index_args
            )
        except Exception as error:  # any damage inside the data: quarantine it
            store.close()
            raise UnusableStoreError(f"cannot load: {error}") from error

    def _new_store(self, path: Path) -> CollectionStore:
        return CollectionStore(
            path,
            synchronous=self._synchronous,
            connections=self._connections,
            builds=self._builds,
        )

    def _check_free(self, name: str) -> None:
        key = name.casefold()
        for taken in [*self._collections, *self._unavailable]:
            if taken.casefold() == key:
                state = "is unavailable" if taken in self._unavailable else "exists"
                raise ConflictError(f"collection {taken!r} already {state}")
        if os.path.lexists(self._path(name)):
            raise ConflictError(f"a file {self._path(name).name!r} is in the way")

    def _remove_unfinished(self) -> None:
        """Remove files of creates a crash interrupted (never a collection's file)."""
        for path in self.data_dir.glob(f".*{_BUILDING}*"):
            logger.warning("removing unfinished collection file %s", path)
            with suppress(OSError):
                path.unlink()

    @contextmanager
    def _writing_files(self) -> Iterator[None]:
        """A full disk is a 507, an unwritable data dir a 503: neither a 500."""
        try:
            with storage_errors():
                yield
        except OSError as error:
            if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise StorageUnavailableError(
                    f"data dir {self.data_dir} is not writable: {error.strerror}"
                ) from error
            raise

    def _path(self, name: str) -> Path:
        return self.data_dir / f"{name}{_SUFFIX}"

    @staticmethod
    def check_name(name: str) -> None:
        """Refuse (422) a name no backend may store (``MilvusRegistry`` uses it too)."""
        if not _NAME_RE.match(name):
            raise InvalidRequestError(
                "collection names are 1-64 letters, digits, '_' or '-', "
                "starting with a letter or digit",
                field="name",
            )
        if name.upper() in RESERVED_NAMES:
            raise InvalidRequestError(
                f"{name!r} is a reserved device name on Windows", field="name"
            )


def _index_of(store: CollectionStore, index: VectorIndex) -> VectorIndex:
    """``index`` (empty) filled with every vector of the store's file."""
    for seqs, vectors in store.iter_vectors():
        index.add(seqs, vectors)
    return index


def check_model(
    name: str, meta: dict[str, Any], model_name: str, model_id: str | None
) -> None:
    """Refuse (409) a collection whose vectors another model made (see ``get_compatible``).

    Shared by every registry, so both backends apply the same rule.
    """
    if meta.get("model") != model_name:
        raise ConflictError(
            f"collection {name!r} was built with model "
            f"{meta.get('model')!r}, not {model_name!r}"
        )
    stored_id = meta.get("model_id")
    if stored_id is not None and model_id is not None:
        if stored_id != model_id:
            raise ConflictError(
                f"collection {name!r} was built with model {model_name!r} "
                f"of identity {stored_id!r}, but the model now served under "
                f"that name (NORMCAL_MODEL_PATH) has identity "
                f"{model_id!r}: its vectors are not comparable; serve "
                "the original model files, or re-embed into a new collection"
            )


def restore_offline(data_dir: Path, name: str, source: Path) -> None:
    """Install the snapshot file ``source`` as collection ``name`` with the server stopped.

    Creates the collection if it is absent (a disaster recovery into an empty data
    dir). Holds the data dir's lock throughout (``DataDirBusyError`` while a server
    owns it: a file swapped under a running server would lose its later writes).
    The file gets the checks that need no model (``check_file``: integrity, the exact
    schema, typed meta; and its name); the server's next start-up load does the rest and quarantines it if the
    model differs.
    """
    CollectionRegistry.check_name(name)
    path = data_dir / f"{name}{_SUFFIX}"
    if path.is_dir():
        raise ConflictError(f"{path} is a directory, not a collection file")
    with storage_errors(), lock_data_dir(data_dir, "restore"):
        staged, _ = _stage_snapshot(data_dir, name, source)
        try:
            _replace_file(staged, path, data_dir)
        finally:
            _remove_files(staged)


def _stage_snapshot(
    data_dir: Path, name: str, source: Path
) -> tuple[Path, dict[str, Any]]:
    """A checked copy of snapshot ``source`` and its meta, named for removal at start-up.

    The copy is what gets checked (``check_file``) and installed, so a source that
    changes after the check cannot slip through.
    """
    staged = _building_path(data_dir, name)
    try:
        try:
            backup_database(source, staged)
        except sqlite3.DatabaseError as error:
            code = getattr(error, "sqlite_errorcode", 0) & 0xFF
            if code not in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
                raise
            raise UnusableStoreError(f"cannot be read: {error}") from error
        meta = check_file(staged)
        if meta["name"] != name:
            raise InvalidRequestError(
                f"{source.name} is a snapshot of collection {meta['name']!r}, "
                f"not {name!r}"
            )
    except UnusableStoreError as error:
        _remove_files(staged)
        raise _refused(
            f"{source.name} is not a usable snapshot", error
        ) from error.__cause__
    except BaseException:
        _remove_files(staged)
        raise
    return staged, meta


def _refused(what: str, error: UnusableStoreError) -> InvalidRequestError:
    """The 422 of a file that fails a check: ``what``, then why.

    ``error``'s reason is normcal's (a schema difference, a meta key and its rule):
    raise this ``from error.__cause__``, what ``error`` came from if anything (say
    SQLite's exception), so a problem detail withholds that text and only that.
    """
    return InvalidRequestError(f"{what}: {error}")


def _replace_file(staged: Path, path: Path, data_dir: Path) -> None:
    """Rename a closed, complete database over ``path`` durably.

    The old file's journal files go first: SQLite would otherwise apply the old
    ``-wal`` to the new file. Its connection is closed, so they hold nothing.
    """
    for side in _side_files(path)[1:]:
        side.unlink(missing_ok=True)
    os.rename(staged, path)
    _fsync_dir(data_dir)


def _building_path(data_dir: Path, name: str) -> Path:
    """A temporary name for a new collection file that never matches a name."""
    return data_dir / f".{name}{_BUILDING}{secrets.token_hex(4)}{_SUFFIX}"


def _side_files(path: Path) -> list[Path]:
    """A database file and its journal files."""
    return [Path(f"{path}{suffix}") for suffix in _SIDE_FILES]


def _remove_files(path: Path) -> None:
    for side in _side_files(path):
        with suppress(OSError):
            side.unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


if TYPE_CHECKING:
    from app.collections.base import CollectionBackend, Registry

    def _conforming(collection: Collection[C]) -> CollectionBackend[C]:
        """The type-checked proof that the SQLite + FAISS collection is a backend."""
        return collection

    def _registry(registry: CollectionRegistry[C]) -> Registry[C]:
        """The type-checked proof that the local registry is a ``Registry``."""
        return registry
