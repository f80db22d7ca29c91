"""Snapshots of collections: online backups under ``<data_dir>/snapshots/<collection>``.

A snapshot is a plain SQLite file, ``<id>.sqlite3``, copied with SQLite's online
backup API (:func:`app.collections.store_files.backup_database`): one committed state of
the collection, taken while writers go on. It is written under a temporary name,
fsynced and renamed, so a crash leaves a whole snapshot or a partial file that
start-up removes (:meth:`Snapshots.remove_unfinished`). Ids are made here,
never taken from a request unchecked (:data:`SNAPSHOT_ID_PATTERN`), so a path built
from one stays inside the collection's snapshot folder.

Snapshots outlive a drop of their collection: a collection created again under the
same name sees them and can be restored from them.
"""

from __future__ import annotations

import logging
import re
import secrets
import sqlite3
import threading
import time
from calendar import timegm
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.collections.ownership import DIR_MODE
from app.collections.store_files import (
    backup_database,
    count_documents,
    fsync_dir,
    storage_errors,
)
from app.exceptions import NotFoundError

if TYPE_CHECKING:
    from app.collections.local_collection import Collection
    from app.collections.registry import CollectionRegistry

logger = logging.getLogger(__name__)

SNAPSHOT_ID_PATTERN = r"^[0-9]{8}T[0-9]{9}Z-[0-9a-f]{8}$"
SNAPSHOTS_DIR = "snapshots"
_ID_RE = re.compile(SNAPSHOT_ID_PATTERN)
_SUFFIX = ".sqlite3"
_PARTIAL = ".partial-"  # ".ID.partial-RANDOM.sqlite3": never matches an id


@dataclass(frozen=True)
class Snapshot:
    """One stored snapshot."""

    id: str
    collection: str
    created_at: float
    documents: int | None  # None: the file is not readable (restoring it is refused)
    bytes: int


class Snapshots:
    """Create, list, find, delete and restore the snapshots of a registry's collections.

    A backup and a restore of one collection never overlap (one lock per
    collection): a restore renames a new file over the one being copied.
    """

    def __init__(self, registry: CollectionRegistry[Any]) -> None:
        self._registry = registry
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def create(self, name: str) -> Snapshot:
        """Snapshot a served collection (404 if absent, 503 if quarantined)."""
        with self._exclusive(name):
            source = self._registry.file_of(name)
            folder = self._folder(name)
            snapshot_id = _new_id()
            path = folder / f"{snapshot_id}{_SUFFIX}"
            partial = (
                folder / f".{snapshot_id}{_PARTIAL}{secrets.token_hex(4)}{_SUFFIX}"
            )
            with storage_errors():
                for level in (folder.parent, folder):  # parents=True would be 0755
                    level.mkdir(mode=DIR_MODE, exist_ok=True)
                try:
                    backup_database(source, partial)
                    partial.rename(path)
                    fsync_dir(folder)
                finally:
                    partial.unlink(missing_ok=True)
        return _describe(name, path)

    def remove_unfinished(self) -> None:
        """Remove what backups a crash interrupted left: partial files, journals.

        Called at start-up, before any backup runs; never touches a snapshot.
        """
        for partial in self._registry.data_dir.glob(f"{SNAPSHOTS_DIR}/*/.*{_PARTIAL}*"):
            logger.warning("removing an interrupted snapshot's file %s", partial)
            with suppress(OSError):
                partial.unlink()

    def list(self, name: str) -> list[Snapshot]:
        """The snapshots of a collection (served or quarantined), oldest first."""
        self._check_exists(name)
        found = []
        for path in sorted(self._folder(name).glob(f"*{_SUFFIX}")):
            if _ID_RE.match(path.name.removesuffix(_SUFFIX)):
                with suppress(FileNotFoundError):  # deleted meanwhile
                    found.append(_describe(name, path))
        return found

    def get(self, name: str, snapshot_id: str) -> Snapshot:
        """Describe one snapshot (``NotFoundError`` if absent)."""
        return _describe(name, self.path(name, snapshot_id))

    def path(self, name: str, snapshot_id: str) -> Path:
        """The file of one snapshot (``NotFoundError`` if absent)."""
        self._check_exists(name)
        path = self._folder(name) / f"{snapshot_id}{_SUFFIX}"
        if not _ID_RE.match(snapshot_id) or not path.is_file():
            raise NotFoundError("snapshot", snapshot_id)
        return path

    def delete(self, name: str, snapshot_id: str) -> None:
        """Delete one snapshot (``NotFoundError`` if absent)."""
        path = self.path(name, snapshot_id)
        with storage_errors():
            try:
                path.unlink()
            except FileNotFoundError:
                raise NotFoundError("snapshot", snapshot_id) from None

    def restore(self, name: str, snapshot_id: str) -> Collection[Any]:
        """Replace the collection by one of its snapshots (see the registry)."""
        with self._exclusive(name):
            return self._registry.restore(name, self.path(name, snapshot_id))

    def restore_into(self, name: str, snapshot_id: str, into: str) -> Collection[Any]:
        """A new collection ``into`` made from one of ``name``'s snapshots (409 if taken).

        ``name`` keeps serving, untouched.
        """
        with self._exclusive(name):
            return self._registry.install(into, self.path(name, snapshot_id))

    def incoming(self, name: str) -> Path:
        """Where an upload of a snapshot for ``name`` is received (a temporary file)."""
        return self._registry.incoming(name)

    def install(self, name: str, file: Path, *, replace: bool) -> Collection[Any]:
        """Collection ``name`` made from a received snapshot ``file``, of any name.

        A new collection; with ``replace``, one that exists (or is quarantined) is
        replaced by it as a restore would.
        """
        label = "the uploaded file"
        with self._exclusive(name):
            if replace and self.exists(name):
                return self._registry.restore(name, file, label=label, rename=True)
            return self._registry.install(name, file, label=label)

    def _folder(self, name: str) -> Path:
        return self._registry.data_dir / SNAPSHOTS_DIR / name

    def exists(self, name: str) -> bool:
        """Whether collection ``name`` is served or quarantined."""
        quarantined = {u.name for u in self._registry.unavailable()}
        return name in self._registry.names() or name in quarantined

    def _check_exists(self, name: str) -> None:
        if not self.exists(name):
            raise NotFoundError("collection", name)

    @contextmanager
    def _exclusive(self, name: str) -> Iterator[None]:
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            yield


def _new_id() -> str:
    """Creation time (UTC, milliseconds) then randomness: ids sort by age."""
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    return f"{stamp}{int(now * 1000) % 1000:03d}Z-{secrets.token_hex(4)}"


def _created_at(snapshot_id: str) -> float:
    seconds = timegm(time.strptime(snapshot_id[:15], "%Y%m%dT%H%M%S"))
    return seconds + int(snapshot_id[15:18]) / 1000


def _describe(name: str, path: Path) -> Snapshot:
    snapshot_id = path.name.removesuffix(_SUFFIX)
    size = path.stat().st_size
    try:
        documents: int | None = count_documents(path)
    except sqlite3.Error:
        documents = None
    return Snapshot(
        id=snapshot_id,
        collection=name,
        created_at=_created_at(snapshot_id),
        documents=documents,
        bytes=size,
    )
