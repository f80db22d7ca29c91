"""Collections and their snapshots: create, describe, list, drop; back up and restore."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.collections.base import CLIENT_EMBEDDING, CollectionBackend, own_vectors
from app.collections.snapshots import Snapshot, Snapshots
from app.collections.store_files import DEFAULT_STEMMER
from app.exceptions import (
    BackendUnsupportedError,
    NotFoundError,
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

    def restore_snapshot(self, name: str, snapshot_id: str) -> CollectionInfo:
        """Replace a collection (served or quarantined) by one of its snapshots."""
        restored = self._snapshots(name).restore(name, snapshot_id)
        self.drift.forget(name)
        return self._describe(restored)

    def _snapshots(self, name: str) -> Snapshots:
        """The snapshots; off the local backend, a 404 for an unknown collection, else 422."""
        if self.snapshots is None:
            self.registry.get(name)
            raise BackendUnsupportedError(
                self.registry.backend,
                "has no snapshots: back its data up with the engine's own tools "
                "(for Milvus: milvus-backup)",
            )
        return self.snapshots


def _snapshot_info(snapshot: Snapshot) -> SnapshotInfo:
    return SnapshotInfo(
        id=snapshot.id,
        collection=snapshot.collection,
        created_at=snapshot.created_at,
        documents=snapshot.documents,
        bytes=snapshot.bytes,
    )
