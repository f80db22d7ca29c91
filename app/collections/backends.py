"""Pick the storage backend from ``NORMCAL_STORAGE`` and build its registry.

``pymilvus`` is an optional extra (``pip install 'normcal[milvus]'``): it is
imported here only when the Milvus backend is configured, so the default local
install neither needs it nor pays for it.
"""

from __future__ import annotations

from typing import Any

from app.collections.base import C, CalibratorLoader, Registry
from app.collections.registry import CollectionRegistry
from app.settings import Settings

MILVUS_EXTRA = "milvus"


class BackendMissingError(RuntimeError):
    """The configured backend's packages are not installed: the service cannot start."""


def open_registry(
    settings: Settings,
    *,
    model_name: str,
    model_id: str | None,
    dim: int,
    load_calibrator: CalibratorLoader[C],
) -> Registry[C]:
    """The registry of ``settings.storage``, loaded (``BackendMissingError``)."""
    common: dict[str, Any] = {
        "model_name": model_name,
        "model_id": model_id,
        "dim": dim,
        "index_type": settings.index_type,
        "hnsw_m": settings.hnsw_m,
        "ef_search": settings.hnsw_ef_search,
    }
    registry: Registry[C]
    if settings.storage == "milvus":
        try:
            from app.collections.milvus_registry import MilvusRegistry
        except ImportError as error:
            raise BackendMissingError(
                f"NORMCAL_STORAGE=milvus needs the {MILVUS_EXTRA!r} extra "
                f"(pip install 'normcal[{MILVUS_EXTRA}]', or `make install "
                f"EXTRAS={MILVUS_EXTRA}`): {error}"
            ) from error
        token = settings.milvus_token
        registry = MilvusRegistry(
            settings.milvus_uri,
            token="" if token is None else token.get_secret_value(),
            layout=settings.milvus_layout,
            client_options=settings.milvus_options(),
            load_calibrator=load_calibrator,
            timeout=settings.milvus_timeout_s,
            consistency=settings.milvus_consistency,
            term_lookups=settings.milvus_term_lookups,
            **common,
        )
    else:
        registry = CollectionRegistry(
            settings.data_dir,
            load_calibrator=load_calibrator,
            synchronous=settings.sqlite_synchronous,
            max_open=settings.max_open_collections,
            filter_timeout_ms=settings.filter_timeout_ms,
            **common,
        )
    registry.load()
    return registry
