"""Collections and their snapshots: create, describe, list, drop; back up and restore."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

from app.collections.base import CLIENT_EMBEDDING, CollectionBackend, own_vectors
from app.collections.snapshots import Snapshot, Snapshots
from app.collections.store_files import DEFAULT_STEMMER, storage_errors
from app.exceptions import (
    BackendUnsupportedError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    StorageLoadingError,
)
from app.schemas.collections import CollectionInfo, OwnEmbedding
from app.schemas.snapshots import SnapshotInfo
from app.services import limits
from app.services.context import Part
from calibration.profile import Profile


class CollectionsService(Part):
    """Collections and, on the local backend, their snapshots."""

    # -- collections ------------------------------------------------------------------
    def create_collection(
        self,
        name: str,
        description: str,
        stemmer: str = DEFAULT_STEMMER,
        *,
        embedding: OwnEmbedding | None = None,
    ) -> CollectionInfo:
        """Create an empty collection and describe it (no second lookup to race).

        With ``embedding``, one of the client's own vectors: it records their model
        and dimension instead of the server's (``app.services.own_vectors``).
        """
        own: dict[str, Any] = {}
        if embedding is not None:
            limits.check_value(
                "embedding.dimension",
                embedding.dimension,
                self.settings.limits.max_dimension,
            )
            own = {
                "embedding": CLIENT_EMBEDDING,
                "model": embedding.model,
                "dim": embedding.dimension,
            }
        collection = self.registry.create(
            name,
            description=description,
            index_type=self.settings.index_type,
            stemmer=stemmer,
            **own,
        )
        return self._describe(collection)

    def describe(self, name: str) -> CollectionInfo:
        """Describe a collection (503 if it is quarantined)."""
        return self._describe(self.registry.get(name))

    def _describe(self, collection: CollectionBackend[Profile]) -> CollectionInfo:
        documents, lexical_indexed, indexed = collection.counts()
        meta = collection.meta
        return CollectionInfo(
            name=collection.name,
            description=str(meta.get("description", "")),
            model=str(meta["model"]),
            model_id=meta.get("model_id"),
            dim=int(meta["dim"]),
            index_type=collection.index_type,
            documents=documents,
            indexed=indexed,
            lexical_indexed=lexical_indexed,
            stemmer=str(meta.get("stemmer", DEFAULT_STEMMER)),
            created_at=float(meta["created_at"]),
            calibrator=self._calibrator_ref(
                collection.name,
                self._profile_for(collection),
                reason=self._own_vectors_note(collection),
            ),
            embedding="client" if own_vectors(meta) else "server",
        )

    def list_collections(self) -> list[CollectionInfo]:
        """Describe every collection, the quarantined ones with their reason.

        A collection dropped while the list is built is left out, never an error;
        one the storage is still loading is listed as ``loading``, with the reason.
        """
        out = [
            CollectionInfo(name=u.name, status="unavailable", reason=u.reason)
            for u in self.registry.unavailable()
        ]
        for name in self.registry.names():
            try:
                out.append(self.describe(name))
            except NotFoundError:
                continue
            except StorageLoadingError as error:  # Milvus restarted: being loaded
                out.append(
                    CollectionInfo(name=name, status="loading", reason=error.detail)
                )
        return sorted(out, key=lambda info: info.name)

    def drop_collection(self, name: str) -> None:
        """Delete a collection and its files."""
        self.registry.drop(name)
        self.drift.forget(name)

    # -- snapshots --------------------------------------------------------------------
    def create_snapshot(self, name: str) -> SnapshotInfo:
        """Back a served collection up while writes go on."""
        return _snapshot_info(self._snapshots(name).create(name))

    def list_snapshots(self, name: str) -> list[SnapshotInfo]:
        """A collection's snapshots, oldest first."""
        return [_snapshot_info(s) for s in self._snapshots(name).list(name)]

    def snapshot_file(self, name: str, snapshot_id: str) -> Path:
        """The file of one snapshot, for download."""
        return self._snapshots(name).path(name, snapshot_id)

    def delete_snapshot(self, name: str, snapshot_id: str) -> None:
        """Delete one snapshot."""
        self._snapshots(name).delete(name, snapshot_id)

    def restore_snapshot(
        self, name: str, snapshot_id: str, into: str | None = None
    ) -> CollectionInfo:
        """Replace a collection (served or quarantined) by one of its snapshots.

        With ``into``, make a new collection of that name from it instead.
        """
        snapshots = self._snapshots(name)
        if into is None or into == name:
            restored = snapshots.restore(name, snapshot_id)
        else:
            restored = snapshots.restore_into(name, snapshot_id, into)
        self.drift.forget(restored.name)
        return self._describe(restored)

    async def upload_snapshot(
        self, name: str, chunks: AsyncIterator[bytes], *, replace: bool
    ) -> CollectionInfo:
        """Collection ``name`` from a snapshot file sent as the request body.

        Refused before a byte is read when snapshots are not served here or ``name``
        is taken (and not ``replace``). The body goes to a temporary file in the data
        dir, at most ``limits.max_snapshot_bytes`` (413 past it); the file then gets
        every check of a restore, and nothing changes unless it passes them all.
        """
        snapshots = self._snapshots_here()
        if snapshots.exists(name) and not replace:
            raise ConflictError(
                f"collection {name!r} already exists: upload under another name, or "
                "add ?replace=true to replace it by the file (as a restore would)"
            )
        file = snapshots.incoming(name)
        limit = self.settings.limits.max_snapshot_bytes
        try:
            with storage_errors():
                await _receive(chunks, file, limit)
            restored = await self.pool.run(
                snapshots.install, name, file, replace=replace
            )
        finally:
            file.unlink(missing_ok=True)
        self.drift.forget(name)
        return self._describe(restored)

    def _snapshots(self, name: str) -> Snapshots:
        """The snapshots; off the local backend, a 404 for an unknown collection, else 422."""
        if self.snapshots is None:
            self.registry.get(name)
        return self._snapshots_here()

    def _snapshots_here(self) -> Snapshots:
        """The snapshots of this backend (422 on one that has none)."""
        if self.snapshots is None:
            raise BackendUnsupportedError(
                self.registry.backend,
                "has no snapshots: back its data up with the engine's own tools "
                "(for Milvus: milvus-backup)",
            )
        return self.snapshots


async def _receive(chunks: AsyncIterator[bytes], file: Path, limit: int) -> None:
    """Write ``chunks`` to the new ``file``, at most ``limit`` bytes (413 past it)."""
    size = 0
    with file.open("xb") as out:
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise PayloadTooLargeError(
                    f"the snapshot file exceeds the limit of {limit} bytes "
                    "(limits.max_snapshot_bytes)"
                )
            await anyio.to_thread.run_sync(out.write, chunk)
        await anyio.to_thread.run_sync(os.fsync, out.fileno())


def _snapshot_info(snapshot: Snapshot) -> SnapshotInfo:
    return SnapshotInfo(
        id=snapshot.id,
        collection=snapshot.collection,
        created_at=snapshot.created_at,
        documents=snapshot.documents,
        bytes=snapshot.bytes,
    )
