"""Talking to Milvus: the guarded client, collection names, filters and seqs.

Shared by the documents (``app.collections.milvus``) and the state
(``app.collections.milvus_state``) of a normcal collection in Milvus:

* :class:`Guarded`: every call into pymilvus goes through it, which turns a failure
  of Milvus (unreachable, timed out, or failing server-side) into
  :class:`~app.exceptions.StorageUnavailableError` (HTTP 503 with ``Retry-After``),
  and reloads a collection a restarted server left released;
* :func:`milvus_name`: the two Milvus collections of a normcal collection;
* :func:`milvus_filter`: a filter tree as a Milvus pre-filter, built from typed
  values (never by pasting a user's string) and checked again in Python;
* :data:`SEQS`: increasing seqs for keyset paging and insertion order.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pymilvus import MilvusException
from pymilvus.exceptions import MilvusUnavailableException, ParamError

from app.exceptions import (
    InvalidRequestError,
    NormcalError,
    NotFoundError,
    StorageUnavailableError,
)
from app.schemas import filters

BACKEND = "milvus"
DOCS, STATE = "ncd_", "ncs_"
QUERY_BATCH = 1000  # rows per query-iterator page and per get/delete by ids
_INT64 = (-(2**63), 2**63 - 1)
# A filter's pre-filter expression stays small: a longer $in, or a longer expression,
# selects everything instead, and the rows are matched in Python.
_MAX_IN_VALUES = 64
_MAX_EXPR_CHARS = 65_536
_RETRY_AFTER = 5  # seconds a client is told to wait when Milvus does not answer
_NOT_FOUND = 100  # Milvus's error code of a collection that does not exist
_NOT_LOADED = 101  # ... of one not loaded (a restarted server releases them all)
# Milvus's error codes below this are the service's state, not a request's.
_FIRST_REQUEST_CODE = 100


def milvus_name(name: str, kind: str = DOCS) -> str:
    """The Milvus collection name of normcal collection ``name`` (injective).

    Milvus allows letters, digits and ``_``; normcal names have ``-`` too. Letters
    and digits stay, ``_`` becomes ``_u``, ``-`` ``_d`` and any other character
    ``_x`` + 6 hex digits: a prefix-free code, so two names never collide, and the
    prefix (``ncd_`` documents, ``ncs_`` state) keeps the two kinds apart.
    """
    out = [kind]
    for ch in name:
        if ch.isascii() and ch.isalnum():
            out.append(ch)
        else:
            out.append({"_": "_u", "-": "_d"}.get(ch, f"_x{ord(ch):06x}"))
    return "".join(out)


def string_literal(value: str) -> str:
    r"""A Milvus expression string literal denoting exactly ``value``.

    The expression grammar knows the escapes ``\\ \"`` (and ``\n \r \t``, on
    which the engine, Milvus Lite 2.5, fails); a control character could not be
    written on both engines, so it is refused rather than passed through (a filter
    then matches it in Python).
    """
    for ch in value:
        if ord(ch) < 0x20 or ord(ch) == 0x7F:
            raise InvalidRequestError(
                f"filter values for the {BACKEND} backend cannot contain control "
                f"character U+{ord(ch):04X}",
                field="filter",
            )
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _literal(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return string_literal(value)
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise InvalidRequestError(
                f"filter value {value} is outside the 64-bit range of the "
                f"{BACKEND} backend",
                field="filter",
            )
        return str(value)
    if not math.isfinite(value):
        raise InvalidRequestError("filter values must be finite", field="filter")
    return repr(float(value))


@dataclass(frozen=True)
class MilvusFilter:
    """A Milvus expression selecting a superset of a filter's matches.

    ``expr`` is ``""`` when it selects everything; ``exact`` says the superset is
    the set itself. Milvus's JSON comparisons do not keep every JSON type apart
    (Milvus Lite finds ``true`` equal to ``1``), and its ``not`` is three-valued
    (``not (x == 1)`` is not true of a missing ``x``), so only conditions on
    strings are claimed exact; every row Milvus returns is checked again by
    :func:`app.schemas.filters.evaluate`. A value Milvus cannot write (a control
    character), a null (the engine fails on ``is null`` of a JSON key, which Lite
    3.x finds true of a missing key) and an overlong expression select everything,
    inexact: matched in Python too.
    """

    expr: str
    exact: bool


def milvus_filter(node: filters.Node) -> MilvusFilter:
    """The Milvus pre-filter of ``node`` (values escaped, never pasted).

    An expression past :data:`_MAX_EXPR_CHARS` is dropped for "everything", inexact.
    """
    expr, exact = _superset(node, positive=True)
    if expr is not None and len(expr) > _MAX_EXPR_CHARS:
        return MilvusFilter("", exact=False)
    return MilvusFilter(expr or "", exact)


def _superset(node: filters.Node, *, positive: bool) -> tuple[str | None, bool]:
    """``(expression, exact)`` of ``node`` (or of its negation): ``None`` is all rows.

    Negations are pushed to the leaves (De Morgan); a negated leaf is all rows.
    """
    if isinstance(node, filters.Not):
        return _superset(node.part, positive=not positive)
    if isinstance(node, filters.And | filters.Or):
        parts = [_superset(p, positive=positive) for p in node.parts]
        exact = all(e for _, e in parts)
        if isinstance(node, filters.And) == positive:  # a conjunction
            clauses = [c for c, _ in parts if c is not None]
            return (" and ".join(clauses) or None), exact
        if not parts or any(c is None for c, _ in parts):
            return None, exact and bool(parts)
        return "(" + " or ".join(c for c, _ in parts if c is not None) + ")", exact
    if not positive or isinstance(node, filters.Exists):
        return None, False
    try:
        return _leaf(node)
    except InvalidRequestError:  # a value Milvus cannot write: matched in Python
        return None, False


def _leaf(node: filters.In | filters.Compare) -> tuple[str | None, bool]:
    """``(expression, exact)`` of a positive comparison of one key."""
    field = f"metadata[{string_literal(node.key)}]"
    if isinstance(node, filters.Compare):
        expr = f"{field} {filters.SYMBOL[node.op]} {_literal(node.value)}"
        return expr, isinstance(node.value, str)
    if not 0 < len(node.values) <= _MAX_IN_VALUES:  # Milvus has no "false"
        return None, False
    values = [v for v in node.values if v is not None]
    if len(values) < len(node.values):  # the engine (2.5) fails on "is null" of JSON
        return None, False
    clauses = [f"{field} == {_literal(v)}" for v in values]
    exact = all(isinstance(v, str) for v in values)
    return "(" + " or ".join(clauses) + ")", exact


class _SeqClock:
    """Increasing int64 seqs: microseconds since the epoch, never repeated here.

    Shared by every collection of the process. Across replicas the order follows
    the clocks: paging misses nothing as long as they agree to within the time
    between a write and a page that should see it.
    """

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def take(self, count: int) -> int:
        """The first of ``count`` consecutive new seqs."""
        with self._lock:
            first = max(time.time_ns() // 1000, self._last + 1)
            self._last = first + count - 1
            return first


SEQS = _SeqClock()


class Guarded:
    """A ``MilvusClient`` whose every call reports Milvus's failures as normcal's.

    The one place pymilvus errors are translated (see the module docstring):

    * an error pymilvus or the server puts on the request itself (``ParamError``,
      ``is_input_error``) is normcal's to interpret and passes unchanged: normcal
      checks users' input before any call, so one reaching Milvus is a bug or a
      missing engine feature (``create`` turns that into a 422);
    * a collection not found is a 404 when the wrapped client serves one normcal
      collection (``collection``), e.g. after another replica dropped it;
    * a released collection is loaded and the call retried once;
    * anything else (no connection, timeout, server failure) is a 503 naming Milvus
      and its URI, never the token; nothing was written that a retry would not
      converge (upserts are idempotent by id).
    """

    def __init__(self, client: Any, uri: str, collection: str | None = None) -> None:
        self.raw = client
        self._uri = uri
        self._collection = collection

    def for_collection(self, name: str) -> Guarded:
        """The same client, reporting a missing Milvus collection as ``name``'s 404."""
        return Guarded(self.raw, self._uri, name)

    def __getattr__(self, method: str) -> Any:
        call = getattr(self.raw, method)

        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                result = self._call(call, args, kwargs)
            except MilvusException as error:
                ours = self._translate(error)
                if ours is None:
                    raise
                raise ours from error
            if method.endswith("_iterator"):  # its next() calls Milvus too
                return Guarded(result, self._uri, self._collection)
            return result

        return guarded

    def _call(self, call: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        try:
            return call(*args, **kwargs)
        except MilvusException as error:
            if error.code != _NOT_LOADED or not args:
                raise
            self.raw.load_collection(args[0])  # args[0]: the collection's name
            return call(*args, **kwargs)

    def translate(self, error: MilvusException) -> Exception:
        """The exception to raise for ``error`` (itself: the caller's to interpret)."""
        return self._translate(error) or error

    def _translate(self, error: MilvusException) -> NormcalError | None:
        """The error to report for ``error``; None: the caller's to interpret."""
        if isinstance(error, ParamError) or error.is_input_error:
            return None
        if error.code == _NOT_FOUND and self._collection is not None:
            return NotFoundError("collection", self._collection)
        return StorageUnavailableError(
            f"Milvus at {self._uri} is unavailable: {error.message or error}",
            retry_after=_RETRY_AFTER,
        )


def refused(error: MilvusException) -> bool:
    """Whether ``error`` is Milvus refusing a request, not failing to serve it.

    A refusal carries one of Milvus's integer error codes from 100 up (e.g. 1100
    invalid parameter, 65535 Milvus Lite 2.x's "unexpected") and is not marked
    retriable; codes under 100 are the service's own state (not ready,
    rate-limited, ...), and no answer at all (unreachable, timed out) a gRPC status
    code, not an integer.
    """
    return (
        isinstance(error.code, int)
        and error.code >= _FIRST_REQUEST_CODE
        and not error.retriable
        and not isinstance(error, MilvusUnavailableException)
    )


def query_all(
    client: Guarded, milvus: str, filter_: str, fields: list[str]
) -> list[dict[str, Any]]:
    """Every row matching ``filter_`` (a query iterator: no result-size cap)."""
    iterator = client.query_iterator(
        milvus, batch_size=QUERY_BATCH, filter=filter_, output_fields=fields
    )
    rows: list[dict[str, Any]] = []
    try:
        while batch := iterator.next():
            rows.extend(batch)
    finally:
        iterator.close()
    return rows


def chunks(items: Sequence[Any]) -> Iterator[list[Any]]:
    """``items`` in lists of :data:`QUERY_BATCH` (Milvus bounds one get or delete)."""
    for start in range(0, len(items), QUERY_BATCH):
        yield list(items[start : start + QUERY_BATCH])
