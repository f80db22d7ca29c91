"""What a collection file must be before it is served or restored, checked read-only.

A snapshot is a file from outside: a trigger added to it runs inside every later
upsert, a meta value the server reads untyped fails every request. So a file is
served (at start-up) or installed (restore, online or offline) only when

- ``PRAGMA integrity_check`` finds nothing;
- its schema is exactly the one this code creates: every table (its columns, by
  ``PRAGMA table_xinfo``, and its definition), index, trigger and view of a
  collection built just now by :func:`app.collections.store_files.build_store`, compared
  by their normalised SQL, nothing missing and nothing extra; or exactly the schema
  of an older file: without the rerank log, also without the query log's
  ``truncated`` flag, and also without the judging tables, the lexical index or both
  (added by separate changes), which
  the first writable open brings up to date
  (``store._upgrade``, which goes by the tables present, not by the
  ``schema_version`` recorded);
- every meta key is one the server knows and its value decodes through the typed
  model the server reads it with (:class:`StoredMeta`, the query log's settings
  through :class:`app.schemas.judging.QueryLogSettings`);
- every document's metadata is a JSON object and its vector ``dim`` float32s.

Anything else is an :class:`app.collections.store_files.UnusableStoreError` naming what is
wrong: a 422 on restore, a quarantined collection at start-up.
"""

from __future__ import annotations

import json
import re
import sqlite3
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.collections import lexical
from app.collections.index import IndexType
from app.collections.store_files import (
    ADDED_SCHEMA,
    DEFAULT_STEMMER,
    QUERY_LOG_FLAG,
    SCHEMA,
    SCHEMA_VERSION,
    UnusableStoreError,
    build_store,
    file_uri,
)
from app.schemas.judging import QueryLogSettings

REQUIRED_META = ("name", "model", "dim", "created_at")


@dataclass(frozen=True)
class SchemaObject:
    """One entry of ``sqlite_master``: its kind, table, normalised SQL and columns."""

    type: str
    table: str
    sql: str
    columns: tuple[tuple[Any, ...], ...] = ()  # table_xinfo minus cid, for tables


Schema = dict[str, SchemaObject]


class StoredMeta(BaseModel):
    """Every meta key a collection file may hold, typed as the server reads it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    model: str
    dim: int = Field(ge=1)
    created_at: float = Field(allow_inf_nan=False)
    model_id: str | None = None
    description: str = ""
    index_type: IndexType = "flat"
    stemmer: lexical.Stemmer = DEFAULT_STEMMER
    schema_version: int = Field(1, ge=1)
    active_calibrator: str | None = None
    query_log: QueryLogSettings | None = None
    embedding: Literal["server", "client"] = "server"

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, version: int) -> int:
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"written by a newer normcal (schema version {version}; "
                f"this one reads up to {SCHEMA_VERSION})"
            )
        return version


def check_file(path: Path) -> dict[str, Any]:
    """The meta of the collection file ``path`` once every check passes.

    Strictly read-only (``mode=ro``: a plain open would turn a 0-byte file into a
    database). Raises :class:`UnusableStoreError` naming the first problem.
    """
    if not path.is_file():
        raise UnusableStoreError("not a regular file")
    if path.stat().st_size == 0:
        raise UnusableStoreError("empty file (0 bytes)")
    try:
        conn = sqlite3.connect(f"{file_uri(path)}?mode=ro", uri=True)
    except sqlite3.Error as error:
        raise UnusableStoreError(f"cannot open: {error}") from error
    try:
        check = conn.execute("PRAGMA integrity_check(1)").fetchall()
        if check != [("ok",)]:
            raise UnusableStoreError(f"damaged: {check[0][0]}")
        schema = read_schema(conn)
        if "meta" not in schema:
            raise UnusableStoreError("not a normcal database: no table 'meta'")
        meta = _read_meta(conn)
        typed = check_meta(meta)
        problems = min(
            (
                schema_differences(schema, expected_schema(shape, typed.stemmer))
                for shape in SHAPES
            ),
            key=len,
        )
        if problems:
            raise UnusableStoreError(f"schema differs: {'; '.join(problems)}")
        _check_documents(conn, typed.dim)
        return meta
    except sqlite3.Error as error:
        raise UnusableStoreError(f"not a normcal database: {error}") from error
    finally:
        conn.close()


def check_meta(meta: dict[str, Any]) -> StoredMeta:
    """``meta`` decoded by :class:`StoredMeta` (``UnusableStoreError`` naming the key)."""
    missing = [key for key in REQUIRED_META if key not in meta]
    if missing:
        raise UnusableStoreError(
            f"meta lacks {', '.join(missing)} (an interrupted create?)"
        )
    try:
        return StoredMeta.model_validate(meta)
    except ValidationError as error:
        item = error.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(p) for p in item["loc"])
        rule = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            rule = "not a key normcal writes"
        elif item["type"] == "missing":
            rule = "missing"
        raise UnusableStoreError(f"meta {where!r}: {rule}") from None


def _read_meta(conn: sqlite3.Connection) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key, value in conn.execute("SELECT key, value FROM meta"):
        try:
            meta[str(key)] = json.loads(value)
        except (TypeError, ValueError):
            raise UnusableStoreError(f"meta {key!r} is not JSON") from None
    return meta


def _check_documents(conn: sqlite3.Connection, dim: int) -> None:
    """Every document's metadata a JSON object, its vector ``dim`` float32s."""
    row = conn.execute(
        "SELECT id FROM documents WHERE NOT json_valid(metadata)"
        " OR json_type(metadata) != 'object' OR typeof(vector) != 'blob'"
        " OR length(vector) != ? LIMIT 1",
        (4 * dim,),
    ).fetchone()
    if row is not None:
        raise UnusableStoreError(
            f"document {str(row[0])[:100]!r} has metadata that is not a JSON object "
            f"or a vector that is not {dim} float32s"
        )


def read_schema(conn: sqlite3.Connection) -> Schema:
    """Every object of ``sqlite_master``, by name (tables with their columns)."""
    schema: Schema = {}
    rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master")
    for kind, name, table, sql in rows.fetchall():
        columns: tuple[tuple[Any, ...], ...] = ()
        if kind == "table":
            info = conn.execute(
                'SELECT name, type, "notnull", dflt_value, pk, hidden'
                " FROM pragma_table_xinfo(?)",
                (name,),
            )
            columns = tuple(tuple(r) for r in info.fetchall())
        schema[name] = SchemaObject(kind, table, normalise_sql(sql or ""), columns)
    return schema


SHAPES = (
    "current",
    "no rerank log",  # version 4
    "no log flag",  # version 3
    "no judging tables",
    "no lexical index",
    "neither",
)


@cache
def expected_schema(shape: str, stemmer: lexical.Stemmer) -> Schema:
    """The schema this code gives a collection of ``shape``, built once per process.

    The current one is a collection made by :func:`build_store` in a temporary
    directory; the older ones (which ``_upgrade`` brings up to date) leave out the
    rerank log (version 4), also the query log's ``truncated`` flag (version 3), and
    also the judging tables, the lexical index or both.
    """
    if shape == "current":
        with tempfile.TemporaryDirectory(prefix="normcal-schema-") as tmp:
            path = Path(tmp) / "expected.sqlite3"
            meta = {"name": "expected", "model": "-", "dim": 1, "created_at": 0.0}
            build_store(path, {**meta, "stemmer": stemmer}, synchronous="OFF")
            conn = sqlite3.connect(f"{file_uri(path)}?mode=ro", uri=True)
            try:
                return read_schema(conn)
            finally:
                conn.close()
    statements = list(SCHEMA)
    if shape in ("no lexical index", "no log flag", "no rerank log"):
        statements += ADDED_SCHEMA
    if shape == "no rerank log":
        statements.append(QUERY_LOG_FLAG)
    if shape in ("no judging tables", "no log flag", "no rerank log"):
        statements += lexical.schema(stemmer)
    conn = sqlite3.connect(":memory:")
    try:
        for statement in statements:
            conn.execute(statement)
        return read_schema(conn)
    finally:
        conn.close()


def schema_differences(actual: Schema, expected: Schema) -> list[str]:
    """What makes ``actual`` differ from ``expected``, one phrase per object."""
    problems = []
    for name in sorted(expected.keys() - actual.keys()):
        problems.append(f"missing {expected[name].type} {name!r}")
    for name in sorted(actual.keys() - expected.keys()):
        problems.append(f"extra {actual[name].type} {name!r}")
    for name in sorted(actual.keys() & expected.keys()):
        have, want = actual[name], expected[name]
        if have.type != want.type:
            problems.append(f"{name!r} is a {have.type}, not a {want.type}")
        elif have.columns != want.columns:
            problems.append(_column_difference(name, have.columns, want.columns))
        elif have != want:
            problems.append(f"{want.type} {name!r} is defined differently")
    return problems


def _column_difference(
    table: str, have: tuple[tuple[Any, ...], ...], want: tuple[tuple[Any, ...], ...]
) -> str:
    have_names = [c[0] for c in have]
    want_names = [c[0] for c in want]
    missing = [c for c in want_names if c not in have_names]
    if missing:
        return f"table {table!r} lacks column {missing[0]!r}"
    extra = [c for c in have_names if c not in want_names]
    if extra:
        return f"table {table!r} has an extra column {extra[0]!r}"
    return f"the columns of table {table!r} are defined differently"


# A quoted string or identifier (kept verbatim), a comment, white space, or other text.
_SQL_TOKEN = re.compile(
    r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|`(?:[^`]|``)*`|\[[^\]]*\]"""
    r"""|--[^\n]*|/\*.*?(?:\*/|$)|\s+|[^'"`\[\s/-]+|.""",
    re.DOTALL,
)


def normalise_sql(sql: str) -> str:
    """``sql`` without comments, runs of white space outside quotes made one space.

    Quoted strings and identifiers are kept verbatim, so text that only looks like a
    comment inside a string still counts.
    """
    out: list[str] = []
    gap = False
    for token in _SQL_TOKEN.findall(sql):
        if token.isspace() or token.startswith(("--", "/*")):
            gap = True
            continue
        if gap and out:
            out.append(" ")
        gap = False
        out.append(token)
    return "".join(out)
