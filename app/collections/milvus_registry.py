"""The registry of collections stored in one Milvus (``NORMCAL_STORAGE=milvus``).

The same rules as the local registry (``app.collections.registry``): names are
checked alike and unique case-insensitively, new collections record the serving
model and its identity, and one built by another model is refused on use
(:func:`~app.collections.registry.check_model`).

Milvus is the truth, not this process: several replicas may serve one Milvus. A
lookup of a collection this process has not opened opens it (another replica
created it), and every lookup re-reads the active calibrator with one point query
(:meth:`MilvusCollection.refresh`), so an activation or a drop by another replica
is seen on the next request. When Milvus stops answering, requests get a 503 and
``/readyz`` says why; pymilvus reconnects by itself, so they are served again once it
is back (see :class:`~app.collections.milvus.Guarded`). The name check and the create that follows it are not
atomic across replicas: two replicas creating ``Kb`` and ``kb`` at the same moment
may both succeed.

This module imports ``pymilvus``: only :func:`app.collections.backends.open_registry`
imports it, when the Milvus backend is configured.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Generic

from app.collections.base import C, CalibratorLoader, Unavailable, own_vectors
from app.collections.index import IndexType
from app.collections.milvus import MilvusCollection, MilvusStorage
from app.collections.milvus_client import BACKEND, CallOptions
from app.collections.milvus_layout import LayoutName, layout_of
from app.collections.registry import CollectionRegistry, check_model
from app.exceptions import ConflictError, NotFoundError, StorageUnavailableError
from app.settings import MILVUS_TERM_LOOKUPS, MILVUS_TIMEOUT_S

logger = logging.getLogger(__name__)


class MilvusRegistry(Generic[C]):
    """All normcal collections of one Milvus (see the module docstring)."""

    backend = BACKEND
    snapshots = None
    """Milvus has its own backups: no snapshots of SQLite files here."""

    def __init__(
        self,
        uri: str,
        *,
        token: str,
        model_name: str,
        dim: int,
        load_calibrator: CalibratorLoader[C],
        model_id: str | None = None,
        index_type: IndexType = "flat",
        hnsw_m: int = 32,
        ef_search: int = 128,
        timeout: float = MILVUS_TIMEOUT_S,
        consistency: str = "Strong",
        layout: LayoutName = "per-collection",
        client_options: dict[str, Any] | None = None,
        term_lookups: int = MILVUS_TERM_LOOKUPS,
    ) -> None:
        """``client_options``: more ``MilvusClient`` arguments (database, TLS)."""
        self.uri = uri
        self.model_name = model_name
        self.model_id = model_id
        self.dim = dim
        self._token = token
        self._load_calibrator = load_calibrator
        self._storage_args: dict[str, Any] = {
            "index_type": index_type,
            "hnsw_m": hnsw_m,
            "ef_search": ef_search,
            "options": CallOptions(timeout, consistency),
            "layout": layout_of(layout),
            "client_options": client_options,
            "term_lookups": term_lookups,
        }
        self._storage: MilvusStorage[C] | None = None
        self._problem: str | None = None
        self._collections: dict[str, MilvusCollection[C]] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        """Connect, start loading what Milvus released, open every loaded collection.

        Never raises, never waits for a load: the service starts, and ``/readyz``
        answers 503 naming what is still loading (or why Milvus cannot be used) until
        every collection can answer. A collection not opened here opens on first use.
        """
        with self._lock:
            storage = self._connect()
            if storage is None:
                return
            try:
                storage.load_released()
                opened = storage.open_all()
            except StorageUnavailableError as error:  # e.g. shared: being loaded
                logger.warning("collections open on first use: %s", error.detail)
                return
            self._collections.update(opened)
            logger.info("opened %d collections in %s", len(opened), BACKEND)

    def _connect(self) -> MilvusStorage[C] | None:
        if self._storage is not None:
            return self._storage
        try:
            self._storage = MilvusStorage(
                self.uri,
                self._load_calibrator,
                token=self._token,
                **self._storage_args,
            )
        except Exception as error:  # pymilvus raises several kinds; all mean "not now"
            self._problem = f"cannot connect to Milvus at {self.uri}: {error}"
            logger.error("%s", self._problem)
            return None
        self._problem = None
        return self._storage

    def _connected(self) -> MilvusStorage[C]:
        storage = self._connect()
        if storage is None:
            # The problem names the URI: readiness (with the key) and the log say it.
            raise StorageUnavailableError("Milvus is not connected (see /readyz)")
        return storage

    def create(self, name: str, **extra_meta: Any) -> MilvusCollection[C]:
        """Create an empty collection (``ConflictError`` if the name is taken).

        Its BM25 is Milvus's, whose standard analyzer does not stem: the collection
        records ``stemmer: none`` whatever was asked, so ``describe`` tells the truth.
        """
        CollectionRegistry.check_name(name)
        with self._lock:
            storage = self._connected()
            key = name.casefold()
            for taken in storage.names():
                if taken.casefold() == key:
                    raise ConflictError(f"collection {taken!r} already exists")
            meta = {
                "model": self.model_name,
                "dim": self.dim,
                "created_at": time.time(),
                **extra_meta,
                "stemmer": "none",
            }
            if self.model_id is not None and not own_vectors(meta):
                meta["model_id"] = self.model_id
            collection = storage.create(name, meta)
            self._collections[name] = collection
            return collection

    def get(self, name: str) -> MilvusCollection[C]:
        """A collection, its active calibrator re-read (404 if absent, 503 if offline)."""
        collection = self._collections.get(name)
        if collection is None:
            with self._lock:
                storage = self._connected()
                collection = self._collections.get(name)
                if collection is None:
                    collection = storage.open(name)  # created by another replica
                    self._collections[name] = collection
        try:
            collection.refresh()
        except NotFoundError:  # dropped by another replica
            with self._lock:
                if self._collections.get(name) is collection:
                    del self._collections[name]
            raise
        return collection

    def get_compatible(self, name: str) -> MilvusCollection[C]:
        """A collection whose vectors come from the serving model (409 if not)."""
        collection = self.get(name)
        check_model(name, collection.meta, self.model_name, self.model_id)
        return collection

    def names(self) -> list[str]:
        """Names of the collections stored in Milvus (any replica's), sorted."""
        storage = self._connect()
        return [] if storage is None else storage.names()

    def unavailable(self) -> list[Unavailable]:
        """None: Milvus has no per-collection file to quarantine."""
        return []

    def loading(self) -> list[str]:
        """Collections Milvus is loading (released by its restart); failed loads retry."""
        storage = self._storage
        return [] if storage is None else storage.loading()

    def storage_problem(self) -> str | None:
        """Why Milvus cannot be used now (a cheap call checks the connection)."""
        storage = self._connect()
        if storage is None:
            return self._problem
        try:
            storage.client.list_collections()
        except StorageUnavailableError as error:  # the guarded client's outage
            # Readiness (detailed for key holders only) may say where and why.
            return f"Milvus at {self.uri} does not answer: {error.__cause__ or error}"
        except Exception as error:  # any other failure of the round trip
            return f"Milvus at {self.uri} does not answer: {error}"
        return None

    def drop(self, name: str) -> None:
        """Drop a collection's Milvus collections (404 if absent)."""
        with self._lock:
            storage = self._connected()
            collection = self._collections.pop(name, None)
            if collection is not None:
                collection.close()
            storage.drop(name)

    def close(self) -> None:
        """Close every collection, then the Milvus client."""
        with self._lock:
            for collection in self._collections.values():
                collection.close()
            self._collections.clear()
            if self._storage is not None:
                self._storage.close()
                self._storage = None
