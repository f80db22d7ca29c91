"""The local registry: every collection file under the data dir (``NORMCAL_STORAGE=local``).

Each collection is a :class:`~app.collections.local_collection.Collection` (a SQLite
store plus its derived FAISS index). Dropping closes it under its write lock:
in-flight work finishes first, later calls get 404.

A file that cannot be opened at start-up is *quarantined*: left untouched, reported
as unavailable (503 on every use), and removed only by an explicit drop.

Calibrators are stored as JSON; storage knows nothing of how they are fitted or
scored. The registry's owner passes ``load_calibrator`` (``Profile.from_json``), so a
collection's state returns the owner's calibrator type, typed, and keeps the active
one decoded in memory for search (:mod:`app.collections.local_state`).
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
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic

from app.collections.base import (
    C,
    CalibratorLoader,
    Unavailable,
    own_vectors,
)
from app.collections.checks import check_file
from app.collections.connections import OpenConnections
from app.collections.index import IndexType
from app.collections.local_collection import Collection
from app.collections.ownership import DIR_MODE, lock_data_dir
from app.collections.postings import LexicalBuilds
from app.collections.snapshots import Snapshots
from app.collections.store import CollectionStore
from app.collections.store_files import (
    Transaction,
    UnusableStoreError,
    backup_database,
    build_store,
    fsync_dir,
    storage_errors,
    write_meta,
)
from app.exceptions import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    StorageUnavailableError,
)
from app.schemas.common import COLLECTION_NAME_PATTERN

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
        filter_timeout_ms: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.model_name = model_name
        self.model_id = model_id
        self.dim = dim
        self._kind: IndexType = index_type
        self._index_args = {"hnsw_m": hnsw_m, "ef_search": ef_search}
        self._synchronous = synchronous
        self._filter_timeout_ms = filter_timeout_ms
        self._connections = OpenConnections(max_open)
        self._builds = LexicalBuilds(lexical_builds)
        self._load_calibrator = load_calibrator
        self._collections: dict[str, Collection[C]] = {}
        self._unavailable: dict[str, Unavailable] = {}
        self._lock = threading.Lock()
        self.snapshots = Snapshots(self)

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
        self.snapshots.remove_unfinished()
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

    def settle(self, timeout: float) -> list[str]:
        """Wait up to ``timeout`` s for the lexical builds :meth:`load` began.

        Until a collection's in-memory BM25 postings are built, its searches score
        BM25 through FTS5, several times slower (``benchmarks/first_request.py``).
        Returns the names of the collections whose build is still under way.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            collections = sorted(self._collections.items())
        return [
            name
            for name, collection in collections
            if not collection.wait_build(max(0.0, deadline - time.monotonic()))
        ]

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
            if self.model_id is not None and not own_vectors(meta):
                meta["model_id"] = self.model_id
            with self._writing_files():
                try:
                    build_store(building, meta, synchronous=self._synchronous)
                    os.rename(building, path)
                    fsync_dir(self.data_dir)
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

    def loading(self) -> list[str]:
        """None: SQLite files open at once."""
        return []

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
                    f"{broken.path.name} in the data dir is a directory, not a "
                    "collection file; remove it by hand"
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

    def restore(
        self, name: str, source: Path, *, label: str = "", rename: bool = False
    ) -> Collection[C]:
        """Replace a collection (served or quarantined) by the snapshot file ``source``.

        The snapshot is never trusted: it is copied under a temporary name and that
        copy is opened with every check of a start-up load (the FAISS index is built
        from it then) before anything else is touched, so a refused snapshot changes
        nothing. Only then is the live collection closed (its write lock: in-flight
        work finishes, later calls on it get 404) and the copy renamed over its file;
        the copy's FTS5 lexical index and the freshly built FAISS index serve it.
        ``label`` names ``source`` in a refusal (its file name by default); a
        snapshot of another collection is refused unless ``rename`` (an upload).
        """
        with self._lock:
            old = self._collections.get(name)
            if old is None and name not in self._unavailable:
                raise NotFoundError("collection", name)
            path = self._path(name)
            if path.is_dir():
                raise ConflictError(
                    f"{path.name} in the data dir is a directory, not a collection file"
                )
            with self._writing_files():
                staged, meta = _stage_snapshot(
                    self.data_dir, name, source, label=label, rename=rename
                )
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

    def install(self, name: str, source: Path, *, label: str = "") -> Collection[C]:
        """Create collection ``name`` from the snapshot file ``source``; 409 if taken.

        The checks of :meth:`restore` (the copy is opened as a start-up load would,
        every calibrator decoded, the model compared) run on a copy before anything
        is touched; the copy then records ``name`` (a snapshot of another
        collection, or of another server's) and is renamed into place. ``label``
        names ``source`` in a refusal (an upload has no file name of its own).
        """
        self.check_name(name)
        with self._lock:
            self._check_free(name)
            with self._writing_files():
                staged, meta = _stage_snapshot(
                    self.data_dir, name, source, rename=True, label=label
                )
            try:
                trial = self._trial_open(name, staged, meta)
                with self._writing_files():
                    _replace_file(staged, self._path(name), self.data_dir)
            finally:
                _remove_files(staged)
            collection = Collection(
                name,
                self._new_store(self._path(name)),
                trial.index,
                self._load_calibrator,
            )
            self._collections[name] = collection
            logger.info("created collection %s from a snapshot", name)
            return collection

    def incoming(self, name: str) -> Path:
        """A new temporary file name for an upload of ``name``'s snapshot.

        Never a collection's name; one a crash leaves behind is removed at start-up.
        """
        self.check_name(name)
        return _building_path(self.data_dir, name)

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
            trial.state.calibrators(strict=True)
        except Exception as error:
            raise InvalidRequestError(
                "the snapshot is not a usable collection: a stored calibrator "
                f"cannot be loaded ({type(error).__name__})"
            ) from error
        finally:
            trial.close()  # checkpoints the copy: it is one file again
        if own_vectors(trial.meta):  # no model of the server's made its vectors
            return trial
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
        if (
            meta["model"] == self.model_name
            and dim != self.dim
            and not own_vectors(meta)
        ):
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
            filter_timeout_ms=self._filter_timeout_ms,
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
                logger.error("data dir %s is not writable: %s", self.data_dir, error)
                raise StorageUnavailableError(
                    f"the data dir is not writable: {error.strerror}"
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


def check_model(
    name: str, meta: dict[str, Any], model_name: str, model_id: str | None
) -> None:
    """Refuse (409) a collection whose vectors another model made (see ``get_compatible``).

    Shared by every registry, so both backends apply the same rule. A collection
    of the client's own vectors (:func:`own_vectors`) has no server model to match.
    """
    if own_vectors(meta):
        return
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
    data_dir: Path,
    name: str,
    source: Path,
    *,
    rename: bool = False,
    label: str = "",
) -> tuple[Path, dict[str, Any]]:
    """A checked copy of snapshot ``source`` and its meta, named for removal at start-up.

    The copy is what gets checked (``check_file``) and installed, so a source that
    changes after the check cannot slip through. A snapshot of another collection
    is refused, or with ``rename`` (a new collection made from it) its copy records
    ``name`` instead: once checked, so only normcal's own schema is written to.
    ``label`` names ``source`` in a refusal (its file name by default).
    """
    label = label or source.name
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
        if meta["name"] != name and rename:
            conn = sqlite3.connect(staged)
            try:
                with Transaction(conn):
                    write_meta(conn, {"name": name})
            finally:
                conn.close()
            meta = {**meta, "name": name}
        elif meta["name"] != name:
            raise InvalidRequestError(
                f"{label} is a snapshot of collection {meta['name']!r}, not {name!r}"
            )
    except UnusableStoreError as error:
        _remove_files(staged)
        raise _refused(f"{label} is not a usable snapshot", error) from error.__cause__
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
    fsync_dir(data_dir)


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


if TYPE_CHECKING:
    from app.collections.base import Registry

    def _registry(registry: CollectionRegistry[C]) -> Registry[C]:
        """The type-checked proof that the local registry is a ``Registry``."""
        return registry
