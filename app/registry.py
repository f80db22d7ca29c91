"""Collections: a SQLite store plus its derived FAISS index, and the registry of them.

A collection's writers (upsert, delete) hold its write lock across the SQLite commit
*and* the index update, readers (search) hold the read lock, so a search never sees a
half-applied upsert and SQLite and FAISS always agree when the lock is free.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.calibrators import Profile
from app.concurrency import RWLock
from app.exceptions import ConflictError, InvalidRequestError, NotFoundError
from app.index import IndexType, VectorIndex
from app.store import CollectionStore, MetadataValue, NewDocument, StoredDocument

logger = logging.getLogger(__name__)

# Names become file names: letters, digits, '_' and '-', starting with a letter or digit.
COLLECTION_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_NAME_RE = re.compile(COLLECTION_NAME_PATTERN)
_SUFFIX = ".sqlite3"


@dataclass(frozen=True)
class Hit:
    """One search result."""

    document: StoredDocument
    score: float


class Collection:
    """One collection: durable store, derived index, and the lock that binds them."""

    def __init__(self, name: str, store: CollectionStore, index: VectorIndex) -> None:
        self.name = name
        self.store = store
        self.index = index
        self.lock = RWLock()
        self.meta: dict[str, Any] = store.get_meta()
        active = self.meta.get("active_calibrator")
        # Replaced by one assignment on activation: a search reads it once, so it
        # sees either the old calibrator or the new one, never a mix.
        self.profile: Profile | None = self.calibrator(active) if active else None

    @classmethod
    def open(
        cls, name: str, store: CollectionStore, *, kind: IndexType, **index_args: int
    ) -> Collection:
        """Open a stored collection and rebuild its index from SQLite."""
        meta = store.get_meta()
        index = VectorIndex(int(meta["dim"]), kind=kind, **index_args)
        for seqs, vectors in store.iter_vectors():
            index.add(seqs, vectors)
        return cls(name, store, index)

    def upsert(self, docs: Sequence[NewDocument]) -> None:
        """Write documents durably, then update the index."""
        with self.lock.write():
            removed, new = self.store.upsert(docs)
            self.index.remove(removed)
            self.index.add(
                np.asarray(new, dtype=np.int64), np.stack([d.vector for d in docs])
            )

    def delete(self, doc_id: str) -> None:
        """Delete one document (``NotFoundError`` if absent)."""
        with self.lock.write():
            seq = self.store.delete(doc_id)
            if seq is None:
                raise NotFoundError("document", doc_id)
            self.index.remove([seq])

    def get(self, doc_id: str) -> StoredDocument:
        """Read one document (``NotFoundError`` if absent)."""
        doc = self.store.get(doc_id)
        if doc is None:
            raise NotFoundError("document", doc_id)
        return doc

    def search(
        self,
        vectors: NDArray[np.float32],
        k: int,
        where: dict[str, MetadataValue] | None = None,
    ) -> list[list[Hit]]:
        """Top-``k`` hits per query vector, best first, restricted by ``where``."""
        with self.lock.read():
            allowed = self.store.filter_seqs(where) if where else None
            scores, seqs = self.index.search(vectors, k, allowed)
            docs = self.store.get_by_seqs([int(s) for s in seqs.ravel() if s >= 0])
        return [
            [
                Hit(docs[int(s)], float(c))
                for c, s in zip(row_scores, row_seqs, strict=True)
                if s >= 0 and int(s) in docs
            ]
            for row_scores, row_seqs in zip(scores, seqs, strict=True)
        ]

    def counts(self) -> tuple[int, int]:
        """``(documents in SQLite, vectors in FAISS)``, read consistently."""
        with self.lock.read():
            return self.store.count(), self.index.size

    def calibrator(self, calibrator_id: str) -> Profile:
        """Load a stored calibrator (``NotFoundError`` if absent)."""
        data = self.store.load_calibrator(calibrator_id)
        if data is None:
            raise NotFoundError("calibrator", calibrator_id)
        return Profile.from_json(data)

    def calibrators(self) -> list[Profile]:
        """Every stored calibrator, oldest first."""
        return [Profile.from_json(d) for d in self.store.list_calibrators()]

    def add_calibrator(self, profile: Profile, *, activate: bool) -> None:
        """Store a fitted calibrator; activating it is part of the same commit."""
        self.store.save_calibrator(
            profile.id, profile.method, profile.to_json(), active=activate
        )
        if activate:
            self.meta["active_calibrator"] = profile.id
            self.profile = profile

    def activate(self, calibrator_id: str) -> Profile:
        """Make a stored calibrator the active one."""
        profile = self.calibrator(calibrator_id)
        self.set_meta(active_calibrator=calibrator_id)
        self.profile = profile
        return profile

    def set_meta(self, **values: Any) -> None:
        """Persist meta keys and refresh the cached copy."""
        self.store.set_meta(**values)
        self.meta.update(values)

    def close(self) -> None:
        """Close the store."""
        with self.lock.write():
            self.store.close()


class CollectionRegistry:
    """All collections under ``data_dir``, loaded at start-up."""

    def __init__(
        self,
        data_dir: Path,
        *,
        model_name: str,
        dim: int,
        index_type: IndexType = "flat",
        hnsw_m: int = 32,
        ef_search: int = 128,
        synchronous: str = "FULL",
    ) -> None:
        self.data_dir = data_dir
        self.model_name = model_name
        self.dim = dim
        self._kind: IndexType = index_type
        self._index_args = {"hnsw_m": hnsw_m, "ef_search": ef_search}
        self._synchronous = synchronous
        self._collections: dict[str, Collection] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        """Open every collection file in ``data_dir`` and rebuild its index."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.data_dir.glob(f"*{_SUFFIX}")):
            name = path.name.removesuffix(_SUFFIX)
            if not _NAME_RE.match(name):
                continue
            started = time.perf_counter()
            store = CollectionStore(path, synchronous=self._synchronous)
            collection = Collection.open(
                name, store, kind=self._kind, **self._index_args
            )
            self._collections[name] = collection
            logger.info(
                "loaded collection %s: %d documents in %.2fs",
                name,
                collection.index.size,
                time.perf_counter() - started,
            )

    def create(self, name: str, **extra_meta: Any) -> Collection:
        """Create an empty collection (``ConflictError`` if it exists)."""
        self._check_name(name)
        with self._lock:
            if name in self._collections:
                raise ConflictError(f"collection {name!r} already exists")
            store = CollectionStore(self._path(name), synchronous=self._synchronous)
            store.set_meta(
                name=name,
                model=self.model_name,
                dim=self.dim,
                created_at=time.time(),
                **extra_meta,
            )
            collection = Collection.open(
                name, store, kind=self._kind, **self._index_args
            )
            self._collections[name] = collection
            return collection

    def get(self, name: str) -> Collection:
        """Return a collection (``NotFoundError`` if absent)."""
        try:
            return self._collections[name]
        except KeyError:
            raise NotFoundError("collection", name) from None

    def get_compatible(self, name: str) -> Collection:
        """Return a collection whose vectors come from the serving model.

        Vectors of another model are not comparable with this model's queries
        (theory.md §4.8): such a collection can be described and dropped, not used.
        """
        collection = self.get(name)
        if collection.meta.get("model") != self.model_name:
            raise ConflictError(
                f"collection {name!r} was built with model "
                f"{collection.meta.get('model')!r}, not {self.model_name!r}"
            )
        return collection

    def names(self) -> list[str]:
        """Names of all collections, sorted."""
        return sorted(self._collections)

    def drop(self, name: str) -> None:
        """Delete a collection and its files."""
        with self._lock:
            collection = self._collections.pop(name, None)
            if collection is None:
                raise NotFoundError("collection", name)
            collection.close()
            for suffix in ("", "-wal", "-shm"):
                Path(str(self._path(name)) + suffix).unlink(missing_ok=True)

    def close(self) -> None:
        """Close every collection."""
        with self._lock:
            for collection in self._collections.values():
                collection.close()
            self._collections.clear()

    def _path(self, name: str) -> Path:
        return self.data_dir / f"{name}{_SUFFIX}"

    @staticmethod
    def _check_name(name: str) -> None:
        if not _NAME_RE.match(name):
            raise InvalidRequestError(
                "collection names are 1-64 letters, digits, '_' or '-', "
                "starting with a letter or digit",
                field="name",
            )
