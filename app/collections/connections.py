"""A bound on the SQLite connections the local backend keeps open, across collections."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.collections.store import CollectionStore


class OpenConnections:
    """A bounded LRU of open SQLite connections across every collection.

    Each open store holds three file descriptors (database, ``-wal``, ``-shm``); the
    oldest idle one is closed when more than ``limit`` are open and reopens on its
    next use. Lock order: a store releases its own mutex before calling here, and
    this class only *tries* a victim's mutex, so it never waits on a busy store (a
    busy victim is skipped; the bound is exceeded only while every store is busy).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lru: OrderedDict[CollectionStore, None] = OrderedDict()
        self._lock = threading.Lock()

    def used(self, store: CollectionStore) -> None:
        """Mark ``store`` as most recently used, then close the oldest idle ones."""
        with self._lock:
            self._lru[store] = None
            self._lru.move_to_end(store)
            for victim in list(self._lru):
                if len(self._lru) <= self.limit:
                    return
                if victim is not store and victim.release_connection():
                    del self._lru[victim]

    def forget(self, store: CollectionStore) -> None:
        """Stop tracking a store whose connection is closed."""
        with self._lock:
            self._lru.pop(store, None)

    @property
    def open_count(self) -> int:
        """How many connections are tracked as open."""
        return len(self._lru)
