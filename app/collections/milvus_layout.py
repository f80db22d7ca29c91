"""Where normcal collections live in Milvus: ``NORMCAL_MILVUS_LAYOUT``.

* :class:`PerCollection` (``per-collection``, the default): each normcal collection
  is two Milvus collections of its own (``ncd_…`` documents, ``ncs_…`` state, names
  from :func:`~app.collections.milvus_client.milvus_name`); listing reads one row of
  every state collection.
* :class:`Shared` (``shared``): Milvus's pattern for many tenants. Every normcal
  collection's documents share one Milvus collection per vector index kind and
  dimension (``nct_docs_flat_384``: the index is fixed per Milvus collection), and
  every state row shares ``nct_state``. Rows carry the normcal collection's name in
  :data:`TENANT`, Milvus's partition key, and a primary key :data:`KEY` of tenant
  and row key (``kb/doc-1``: names never contain ``/``, so it is unique across
  tenants) while the row's own key field (``id``, state ``pk``) stays as the API
  knows it. Listing and start-up are one query of ``nct_state``.

Every call of a shared collection goes through :class:`TenantClient`, which adds
the tenant to what is written and ``tenant == "<name>" and (…)`` to every filter,
so no read, search, count or delete can reach another tenant's rows; ids are
mapped to :data:`KEY`. Milvus's BM25 statistics (IDF, average length) are per
Milvus collection, so shared across tenants: see docs/scale.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

from pymilvus import CollectionSchema, DataType, MilvusClient, MilvusException

from app.collections.index import IndexType
from app.collections.milvus_client import (
    BACKEND,
    DOCS,
    STATE,
    Guarded,
    in_filter,
    milvus_name,
    normcal_name,
    query_all,
    string_literal,
)
from app.collections.milvus_state import read_meta
from app.exceptions import (
    BackendUnsupportedError,
    NormcalError,
    StorageLoadingError,
)

LayoutName = Literal["per-collection", "shared"]
TENANT = "tenant"  # the partition-key field of shared collections
KEY = "tpk"  # their primary key: tenant + "/" + the row's own key
MAX_TENANT_BYTES = 64  # normcal names: at most 64 ASCII characters
PARTITIONS = 64  # partitions a shared collection hashes its tenants to (Milvus: ≤ 1024)
SHARED_DOCS = "nct_docs_"  # + index kind + "_" + dimension
SHARED_STATE = "nct_state"
_NAME_ROWS = 'kind == "meta" and key == "name"'
_INVALID_EXPR = 1100  # Milvus's code of an expression it refuses


class Layout(Protocol):
    """Names, schemas and scoping of normcal collections in Milvus."""

    def documents(self, name: str, dim: int, index_type: IndexType) -> str:
        """The Milvus collection holding ``name``'s documents."""
        ...

    def state(self, name: str) -> str:
        """The Milvus collection holding ``name``'s state rows."""
        ...

    def schema(self, key: str, max_length: int) -> CollectionSchema:
        """A new collection's schema, its key fields added (``key``: the row's own)."""
        ...

    def options(self) -> dict[str, Any]:
        """Extra ``create_collection`` arguments."""
        ...

    def verify(self, client: Guarded, milvus: str) -> None:
        """Refuse (and drop) a just-created collection the engine cannot serve."""
        ...

    def scoped(self, raw: Any, name: str) -> Any:
        """The raw client ``name``'s calls go through."""
        ...

    def exists(self, client: Guarded, name: str) -> bool:
        """Whether anything of ``name`` is stored."""
        ...

    def clear(self, client: Guarded, name: str) -> None:
        """Remove what an interrupted drop of ``name`` may have left (before a create)."""
        ...

    def names(self, client: Guarded) -> list[str]:
        """Names of the normcal collections stored, sorted."""
        ...

    def metas(self, client: Guarded) -> dict[str, dict[str, Any]]:
        """The meta of every stored collection, by name."""
        ...

    def meta(self, client: Guarded, name: str) -> dict[str, Any] | None:
        """``name``'s meta, or None if it is not stored."""
        ...

    def drop(self, client: Guarded, name: str) -> bool:
        """Delete everything of ``name``; False if nothing was stored."""
        ...

    def owner(self, milvus: str) -> str:
        """Which normcal collections Milvus collection ``milvus`` holds (for messages)."""
        ...


def _meta_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {r["key"]: r["data"]["value"] for r in rows}


class PerCollection:
    """Two Milvus collections per normcal collection (see the module docstring)."""

    def documents(self, name: str, dim: int, index_type: IndexType) -> str:  # noqa: ARG002
        """``ncd_`` + the encoded name."""
        return milvus_name(name, DOCS)

    def state(self, name: str) -> str:
        """``ncs_`` + the encoded name."""
        return milvus_name(name, STATE)

    def schema(self, key: str, max_length: int) -> CollectionSchema:
        """``key`` is the primary key."""
        schema = MilvusClient.create_schema(auto_id=False)
        schema.add_field(key, DataType.VARCHAR, is_primary=True, max_length=max_length)
        return schema

    def options(self) -> dict[str, Any]:
        """None."""
        return {}

    def verify(self, client: Guarded, milvus: str) -> None:
        """Nothing to check."""

    def scoped(self, raw: Any, name: str) -> Any:  # noqa: ARG002
        """The client, keyed: the collections are ``name``'s alone."""
        return Keyed(raw)

    def exists(self, client: Guarded, name: str) -> bool:
        """Either Milvus collection exists."""
        return any(client.has_collection(milvus_name(name, k)) for k in (DOCS, STATE))

    def clear(self, client: Guarded, name: str) -> None:
        """Nothing: a drop removes whole collections."""

    def names(self, client: Guarded) -> list[str]:
        """The name row of every state collection: one query each.

        A state collection being loaded (released by a restarted Milvus) cannot be
        queried: its name is the one its Milvus name encodes
        (:func:`~app.collections.milvus_client.normcal_name`), and its load starts.
        """
        found: list[str] = []
        for milvus in client.list_collections():
            if not milvus.startswith(STATE):
                continue
            try:
                rows = client.query(milvus, filter=_NAME_ROWS, output_fields=["data"])
            except StorageLoadingError:
                found.extend(n for n in [normcal_name(milvus)] if n is not None)
                continue
            found.extend(str(r["data"]["value"]) for r in rows)
        return sorted(found)

    def metas(self, client: Guarded) -> dict[str, dict[str, Any]]:
        """One query per collection; those being loaded are left out."""
        metas: dict[str, dict[str, Any]] = {}
        for name in self.names(client):
            try:
                metas[name] = read_meta(client, self.state(name))
            except StorageLoadingError:
                continue
        return metas

    def owner(self, milvus: str) -> str:
        """The normcal collection ``milvus`` belongs to."""
        return normcal_name(milvus) or milvus

    def meta(self, client: Guarded, name: str) -> dict[str, Any] | None:
        """The state collection's meta rows."""
        state = self.state(name)
        return read_meta(client, state) if client.has_collection(state) else None

    def drop(self, client: Guarded, name: str) -> bool:
        """Drop both Milvus collections."""
        present = [
            m
            for m in (milvus_name(name, k) for k in (DOCS, STATE))
            if client.has_collection(m)
        ]
        for milvus in present:
            client.drop_collection(milvus)
        return bool(present)


def tenant_filter(name: str) -> str:
    """The expression selecting tenant ``name``'s rows (a typed literal, escaped)."""
    return f"{TENANT} == {string_literal(name)}"


class Shared:
    """Many normcal collections per Milvus collection (see the module docstring)."""

    def documents(self, name: str, dim: int, index_type: IndexType) -> str:  # noqa: ARG002
        """One per index kind and dimension, e.g. ``nct_docs_flat_384``."""
        return f"{SHARED_DOCS}{index_type}_{dim}"

    def state(self, name: str) -> str:  # noqa: ARG002
        """``nct_state`` for all."""
        return SHARED_STATE

    def schema(self, key: str, max_length: int) -> CollectionSchema:
        """:data:`KEY` primary, ``key`` a plain field, :data:`TENANT` partition key."""
        schema = MilvusClient.create_schema(auto_id=False)
        schema.add_field(
            KEY,
            DataType.VARCHAR,
            is_primary=True,
            max_length=MAX_TENANT_BYTES + 1 + max_length,
        )
        schema.add_field(key, DataType.VARCHAR, max_length=max_length)
        schema.add_field(
            TENANT,
            DataType.VARCHAR,
            max_length=MAX_TENANT_BYTES,
            is_partition_key=True,
        )
        return schema

    def options(self) -> dict[str, Any]:
        """The partition count (fixed when the shared collection is created)."""
        return {"num_partitions": PARTITIONS}

    def verify(self, client: Guarded, milvus: str) -> None:
        """A tenant-filtered query must work.

        Milvus Lite 2.x creates a collection with a partition key but refuses every
        filter on it (``Invalid expr``).
        """
        try:
            client.query(milvus, filter=tenant_filter(""), limit=1)
        except NormcalError as error:  # Guarded's report of Milvus's error
            cause = error.__cause__
            if not isinstance(cause, MilvusException) or cause.code != _INVALID_EXPR:
                raise
            raise BackendUnsupportedError(
                BACKEND,
                "cannot keep collections in the shared layout: this Milvus does not "
                "filter collections with a partition key (Milvus Lite 2.x); use "
                f"NORMCAL_MILVUS_LAYOUT=per-collection ({cause.message})",
            ) from error

    def scoped(self, raw: Any, name: str) -> Any:
        """A :class:`TenantClient` of ``name``."""
        return TenantClient(raw, name)

    def exists(self, client: Guarded, name: str) -> bool:
        """``name`` has a name row (written last by a create)."""
        return self.meta(client, name) is not None

    def clear(self, client: Guarded, name: str) -> None:
        """Delete ``name``'s rows from every shared collection, the state last."""
        present = client.list_collections()
        targets = [m for m in present if m.startswith(SHARED_DOCS)]
        targets += [m for m in present if m == SHARED_STATE]
        for milvus in targets:
            client.delete(milvus, filter=tenant_filter(name))

    def names(self, client: Guarded) -> list[str]:
        """One query of the state collection's name rows."""
        if not client.has_collection(SHARED_STATE):
            return []
        rows = query_all(client, SHARED_STATE, _NAME_ROWS, ["data"])
        return sorted(str(r["data"]["value"]) for r in rows)

    def metas(self, client: Guarded) -> dict[str, dict[str, Any]]:
        """One query of every meta row, grouped by tenant (those with a name)."""
        if not client.has_collection(SHARED_STATE):
            return {}
        grouped: dict[str, list[dict[str, Any]]] = {}
        fields = [TENANT, "key", "data"]
        for row in query_all(client, SHARED_STATE, 'kind == "meta"', fields):
            grouped.setdefault(str(row[TENANT]), []).append(row)
        metas = {tenant: _meta_of(rows) for tenant, rows in grouped.items()}
        return {t: m for t, m in metas.items() if "name" in m}

    def meta(self, client: Guarded, name: str) -> dict[str, Any] | None:
        """One query of ``name``'s meta rows."""
        if not client.has_collection(SHARED_STATE):
            return None
        expr = f'{tenant_filter(name)} and kind == "meta"'
        meta = _meta_of(query_all(client, SHARED_STATE, expr, ["key", "data"]))
        return meta if "name" in meta else None

    def owner(self, milvus: str) -> str:
        """Every normcal collection: they all have rows in ``milvus``."""
        return f"every collection (Milvus collection {milvus})"

    def drop(self, client: Guarded, name: str) -> bool:
        """Delete ``name``'s documents, then its state rows (the name row last)."""
        if not self.exists(client, name):
            return False
        self.clear(client, name)
        return True


def layout_of(name: LayoutName) -> Layout:
    """The layout called ``name``."""
    return Shared() if name == "shared" else PerCollection()


class Keyed:
    """A ``MilvusClient`` whose ``get`` and ``delete`` by ids filter by escaped literals.

    pymilvus's own ``get(ids=…)`` and ``delete(ids=…)`` paste each id between single
    quotes, unescaped (``id in ['<id>']``): an id holding ``'`` rewrote the expression
    (one crafted id deleted every row). Here they are a query, or a delete, whose
    filter is :func:`~app.collections.milvus_client.in_filter` of the row keys (the
    primary key field: ``id`` of documents, ``pk`` of state rows). Other calls pass
    through.
    """

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def __getattr__(self, method: str) -> Any:
        return getattr(self._raw, method)

    def _key_filter(self, collection: str, ids: list[Any]) -> str:
        return in_filter("pk" if collection.startswith(STATE) else "id", ids)

    def get(self, collection: str, ids: list[Any], **kwargs: Any) -> Any:
        """The rows of these ids (a query: no row of another id can match)."""
        if not ids:
            return []
        return self.query(
            collection, filter=self._key_filter(collection, ids), **kwargs
        )

    def delete(
        self, collection: str, ids: list[Any] | None = None, **kwargs: Any
    ) -> Any:
        """Delete the rows of these ids (or, ``ids`` unset, matching ``filter``)."""
        if ids is None:
            return self._raw.delete(collection, **kwargs)
        if not ids:
            return {"delete_count": 0}
        return self.delete(
            collection, filter=self._key_filter(collection, ids), **kwargs
        )


class TenantClient(Keyed):
    """A ``MilvusClient`` confined to one tenant's rows of shared collections.

    Writes get :data:`TENANT` and :data:`KEY`; ids become keys (``<tenant>/<id>``,
    matched by escaped literals as in :class:`Keyed`); every filter is
    ``tenant == "<name>" and (filter)``, the filter itself built from typed values
    (:func:`~app.collections.milvus_client.milvus_filter`) and parenthesised, so it
    can only narrow the tenant's rows. Other calls pass through.
    """

    def __init__(self, raw: Any, tenant: str) -> None:
        super().__init__(raw)
        self._tenant = tenant
        self._scope = tenant_filter(tenant)

    def _key(self, own: Any) -> str:
        return f"{self._tenant}/{own}"

    def _key_filter(self, collection: str, ids: list[Any]) -> str:  # noqa: ARG002
        return in_filter(KEY, [self._key(i) for i in ids])

    def _filter(self, expr: str | None) -> str:
        return f"{self._scope} and ({expr})" if expr else self._scope

    def _scoping(self, method: str) -> Callable[..., Any]:
        call: Callable[..., Any] = getattr(self._raw, method)

        def scoped(collection: str, *args: Any, **kwargs: Any) -> Any:
            kwargs["filter"] = self._filter(kwargs.get("filter"))
            return call(collection, *args, **kwargs)

        return scoped

    def query(self, collection: str, *args: Any, **kwargs: Any) -> Any:
        """A query of the tenant's rows."""
        return self._scoping("query")(collection, *args, **kwargs)

    def search(self, collection: str, *args: Any, **kwargs: Any) -> Any:
        """A search of the tenant's rows."""
        return self._scoping("search")(collection, *args, **kwargs)

    def query_iterator(self, collection: str, *args: Any, **kwargs: Any) -> Any:
        """An iterator over the tenant's rows."""
        return self._scoping("query_iterator")(collection, *args, **kwargs)

    def delete(
        self, collection: str, ids: list[Any] | None = None, **kwargs: Any
    ) -> Any:
        """Delete the tenant's rows of these ids (or matching ``filter``)."""
        if ids is None:
            return self._scoping("delete")(collection, **kwargs)
        return super().delete(collection, ids, **kwargs)

    def upsert(self, collection: str, rows: list[dict[str, Any]], **kwargs: Any) -> Any:
        """Upsert rows as the tenant's."""
        own = "pk" if collection == SHARED_STATE else "id"
        tagged = [{**r, KEY: self._key(r[own]), TENANT: self._tenant} for r in rows]
        return self._raw.upsert(collection, tagged, **kwargs)
