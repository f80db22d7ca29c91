"""Talking to Milvus: the guarded client, collection names, filters and seqs.

Shared by the documents (``app.collections.milvus``) and the state
(``app.collections.milvus_state``) of a normcal collection in Milvus:

* :class:`Guarded`: every call into pymilvus goes through it, bounded by a timeout,
  and its errors are classified by :data:`KNOWN_ERRORS` (refusals are 4xx; a failure
  of Milvus, unreachable, timed out or failing server-side, is
  :class:`~app.exceptions.StorageUnavailableError`, HTTP 503 with ``Retry-After``);
  a collection a restarted server left released is loaded in the background;
* :func:`milvus_name`: the two Milvus collections of a normcal collection;
* :func:`milvus_filter`: a filter tree as a Milvus pre-filter, built from typed
  values (never by pasting a user's string) and checked again in Python;
* :data:`SEQS`: increasing seqs for keyset paging and insertion order.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import grpc
from pymilvus import MilvusClient, MilvusException
from pymilvus.exceptions import MilvusUnavailableException, ParamError

from app.exceptions import (
    BackendUnsupportedError,
    InvalidRequestError,
    NormcalError,
    NotFoundError,
    StorageLoadingError,
    StorageUnavailableError,
)
from app.schemas import filters
from app.settings import MILVUS_TIMEOUT_S

logger = logging.getLogger(__name__)

BACKEND = "milvus"
DOCS, STATE = "ncd_", "ncs_"
QUERY_BATCH = 1000  # rows per query-iterator page and per get/delete by ids
_INT64 = (-(2**63), 2**63 - 1)
# A filter's pre-filter expression stays small: a longer $in, or a longer expression,
# selects everything instead, and the rows are matched in Python.
_MAX_IN_VALUES = 64
_MAX_EXPR_CHARS = 65_536
# pymilvus pings every channel every 10 s even with no call in flight; a gRPC server
# left at gRPC's defaults (Milvus Lite 2.5.1's) answers that with GOAWAY
# "too_many_pings" and the client's reconnect can fail. Ping during calls only: an
# idle connection that died is found, and re-made, by the next call.
GRPC_OPTIONS = {"grpc.keepalive_permit_without_calls": False}
_RETRY_AFTER = 5  # seconds a client is told to wait when Milvus does not answer
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


LINE_BREAKS = "\n\r"
"""What no string literal denotes on every supported engine: Milvus Lite 3.x reads a
raw line break as the end of the literal and knows only the escapes ``\\n \\r``,
which the engine (Milvus Lite 2.5) keeps as two characters, failing on the raw ones."""


_CODE = re.compile(r"(?:[A-Za-z0-9]|_u|_d|_x[0-9a-f]{6})*")
_ESCAPE = re.compile(r"_x([0-9a-f]{6})|_u|_d")


def normcal_name(milvus: str) -> str | None:
    """The normcal name :func:`milvus_name` encoded as ``milvus``; None if not one."""
    kind = next((k for k in (DOCS, STATE) if milvus.startswith(k)), None)
    code = milvus[len(kind) :] if kind else ""
    if kind is None or not _CODE.fullmatch(code):
        return None
    return _ESCAPE.sub(
        lambda m: chr(int(m[1], 16)) if m[1] else {"_u": "_", "_d": "-"}[m[0]], code
    )


def string_literal(value: str, *, field: str = "filter") -> str:
    r"""A Milvus expression string literal denoting exactly ``value``.

    The one function that puts a value (an id, a tenant, a metadata key or value, a
    state row's kind) into an expression: nothing else builds a literal, and no call
    passes ids to pymilvus's ``get``/``delete``, which paste them unescaped between
    single quotes. Neither engine serves parameterised expressions (``filter_params``):
    Milvus Lite 3.x's parser refuses ``{name}``, the engine (Lite 2.5) fails the call.

    The literal is double-quoted; ``\`` and ``"`` are escaped (as ``\\`` and
    ``\"``, read alike by both engines); every other character stands
    for itself (``'``, ``[``, ``]``, ``,``, ``or``, any Unicode: inside the quotes
    they are text). A line break (:data:`LINE_BREAKS`) is refused,
    :class:`~app.exceptions.InvalidRequestError` naming ``field``: no literal
    denotes it on both engines.
    """
    for ch in value:
        if ch in LINE_BREAKS:
            raise InvalidRequestError(
                f"{field}: the {BACKEND} backend cannot address a value containing "
                f"a line break (U+{ord(ch):04X})",
                field=field,
            )
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def in_filter(field: str, values: Sequence[str]) -> str:
    """``field in ["v1", "v2"]``: the rows whose ``field`` is one of ``values``."""
    return f"{field} in [{', '.join(string_literal(v, field='id') for v in values)}]"


def _filter_text(value: str) -> str:
    """:func:`string_literal` of a filter's key or value, control characters refused.

    On the engine a raw one in a JSON key matches nothing; the caller matches such
    a filter in Python instead.
    """
    for ch in value:
        if ord(ch) < 0x20 or ord(ch) == 0x7F:
            raise InvalidRequestError(
                f"filter values for the {BACKEND} backend cannot contain control "
                f"character U+{ord(ch):04X}",
                field="filter",
            )
    return string_literal(value)


def _literal(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _filter_text(value)
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
    if not node.key or "][" in node.key:
        # The engine refuses metadata[""], and cuts a key at "][" as if it were a
        # path (it matched nothing, or refused the call): both matched in Python.
        return None, False
    field = f"metadata[{_filter_text(node.key)}]"
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


Outcome = Literal["input", "unsupported", "not_found", "not_loaded"]


@dataclass(frozen=True)
class KnownError:
    """An error shape a supported Milvus sends, and what it means to normcal.

    ``code`` is the error's ``code``; ``legacy`` its ``compatible_code`` when the
    shape needs it to be told apart (``None``: any); ``message`` a substring its
    message must contain (``""``: any); ``seen_on`` the servers that send it.
    """

    code: int
    outcome: Outcome
    seen_on: str
    legacy: int | None = None
    message: str = ""

    def matches(self, error: MilvusException) -> bool:
        """Whether ``error`` has this shape."""
        return (
            error.code == self.code
            and (self.legacy is None or error.compatible_code == self.legacy)
            and self.message in (error.message or "")
        )


_SERVERS = "Milvus 2.5.x-2.6.x, milvus-lite 2.5.1"
KNOWN_ERRORS: tuple[KnownError, ...] = (
    # Milvus's own codes (merr), sent by its servers and the engine of Lite 2.5.1
    KnownError(100, "not_found", f"{_SERVERS}, milvus-lite 3.x"),
    KnownError(101, "not_loaded", f"{_SERVERS}, milvus-lite 3.x"),
    KnownError(10, "unsupported", f"{_SERVERS}: service unimplemented"),
    KnownError(701, "unsupported", f"{_SERVERS}: index not supported"),
    KnownError(2001, "unsupported", f"{_SERVERS}: segcore unsupported"),
    KnownError(1100, "input", f"{_SERVERS}: invalid parameter, invalid expression"),
    KnownError(1101, "input", f"{_SERVERS}: parameter missing"),
    KnownError(1102, "input", f"{_SERVERS}: parameter too large"),
    KnownError(1200, "input", f"{_SERVERS}: metric not found"),
    KnownError(1700, "input", f"{_SERVERS}: field not found"),
    # Lite 2.5.1's front end refuses what only a full server serves as "undefined"
    KnownError(65535, "unsupported", "milvus-lite 2.5.1", message="invalid index type"),
    # milvus-lite 3.x: the legacy IllegalArgument (6) as both codes (a bad filter,
    # schema or argument); a server's 6 is a routing failure with another legacy code
    KnownError(6, "input", "milvus-lite 3.x", legacy=6),
)
"""Every Milvus error normcal reports as other than an outage (first match wins).

What no entry matches is a 503 with ``Retry-After``: an unknown error is taken as
Milvus failing to serve, never as the request's fault. ``is_input_error`` is not
read: only recent servers set it.
"""


def classify(error: MilvusException) -> Outcome | None:
    """What ``error`` means to normcal; ``None``: an outage (unknown, or no answer).

    pymilvus's own ``ParamError`` (refused before any call) is an input error.
    """
    if isinstance(error, ParamError):
        return "input"
    return next((k.outcome for k in KNOWN_ERRORS if k.matches(error)), None)


class Reloads:
    """Background loads of released Milvus collections: one at a time per collection.

    A released collection (a restarted server releases them all) is never loaded
    inside a request: one load starts here, whatever number of requests find it
    released meanwhile, and each of them gets a
    :class:`~app.exceptions.StorageLoadingError` holding the load's ``loaded`` event
    (a search waits for it, bounded: ``NORMCAL_MILVUS_LOAD_WAIT_S``). A collection
    stays :meth:`pending` until a load succeeds (or finds it dropped): readiness
    reports it and :meth:`retry` starts a failed load again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, threading.Event] = {}
        self._pending: dict[str, Callable[[str], object]] = {}
        self._queue: deque[tuple[Callable[[str], object], str]] = deque()
        self._workers = 0

    def start(self, load: Callable[[str], object], milvus: str) -> threading.Event:
        """Load ``milvus`` with ``load`` in the background unless already loading.

        Returns the event set when that load ends. At most :data:`LOADS_AT_ONCE`
        loads run at once (a restarted Milvus with many collections is loaded a
        few at a time); the others wait their turn.
        """
        with self._lock:
            self._pending[milvus] = load
            if milvus in self._running:
                return self._running[milvus]
            ended = self._running[milvus] = threading.Event()
            self._queue.append((load, milvus))
            if self._workers < LOADS_AT_ONCE:
                self._workers += 1
                threading.Thread(
                    target=self._work, name="milvus-loads", daemon=True
                ).start()
        return ended

    def _work(self) -> None:
        """Run queued loads; a worker ends when none is left (start makes another)."""
        while True:
            with self._lock:
                if not self._queue:
                    self._workers -= 1
                    return
                load, milvus = self._queue.popleft()
            self._run(load, milvus)

    def _run(self, load: Callable[[str], object], milvus: str) -> None:
        loaded = False
        try:
            load(milvus)
            loaded = True
            logger.info("loaded released Milvus collection %s", milvus)
        except MilvusException as error:
            loaded = classify(error) == "not_found"  # dropped meanwhile: nothing to do
            if not loaded:
                logger.warning("cannot load Milvus collection %s: %s", milvus, error)
        except Exception as error:  # the next request or readiness probe retries
            logger.warning("cannot load Milvus collection %s: %s", milvus, error)
        finally:
            with self._lock:
                ended = self._running.pop(milvus)
                if loaded:
                    self._pending.pop(milvus, None)
            ended.set()

    def pending(self) -> list[str]:
        """Milvus collections found released and not loaded since, sorted."""
        with self._lock:
            return sorted(self._pending)

    def retry(self) -> None:
        """Start again the loads of pending collections that failed."""
        with self._lock:
            idle = {m: f for m, f in self._pending.items() if m not in self._running}
        for milvus, load in idle.items():
            self.start(load, milvus)

    def wait(self) -> None:
        """Wait for the loads under way (for tests)."""
        with self._lock:
            events = list(self._running.values())
        for ended in events:
            ended.wait()


def _pastes_ids(raw: Any, method: str, kwargs: dict[str, Any]) -> bool:
    """Whether this is pymilvus's ``get``, or ``delete`` by ids: never called."""
    return isinstance(raw, MilvusClient) and (
        method == "get" or (method == "delete" and kwargs.get("ids") is not None)
    )


# Methods that do not call the server (no timeout= or consistency_level=).
_LOCAL_METHODS = frozenset({"close", "prepare_index_params", "create_schema"})
_READS = frozenset({"search", "query", "get", "query_iterator", "hybrid_search"})
RELOAD_TIMEOUT_S = 600.0  # seconds a background load of a released collection may take
LOADS_AT_ONCE = 4  # background loads running at the same time


@dataclass(frozen=True)
class CallOptions:
    """What every call through :class:`Guarded` is given.

    ``timeout`` (seconds, ``NORMCAL_MILVUS_TIMEOUT_S``) bounds each call;
    ``consistency`` (``NORMCAL_MILVUS_CONSISTENCY``) is the level of every read.
    """

    timeout: float = MILVUS_TIMEOUT_S
    consistency: str = "Strong"

    def of(self, method: str) -> dict[str, Any]:
        """The keyword arguments ``method`` is called with."""
        if method in _LOCAL_METHODS:
            return {}
        if method in _READS:
            return {"timeout": self.timeout, "consistency_level": self.consistency}
        return {"timeout": self.timeout}


class Guarded:
    """A ``MilvusClient`` whose every call is bounded and reports failures as normcal's.

    The one place pymilvus errors are translated, by :data:`KNOWN_ERRORS`:

    * an input error (Milvus refusing the request: a bad expression or parameter)
      is a 422 ``invalid-request``, an unsupported feature a 422
      ``backend-unsupported``: normcal checks users' input before any call, so
      either is a missing engine feature or a bug, and a retry would fail the same;
    * a collection not found is a 404 when the wrapped client serves one normcal
      collection (``collection``), e.g. after another replica dropped it;
    * a released collection is a 503 with ``Retry-After``
      (:class:`~app.exceptions.StorageLoadingError`) while one background load
      starts (:class:`Reloads`);
    * anything else (no connection, a call past its timeout, a server failure) is a
      503 with ``Retry-After`` naming Milvus and its URI, never the token; nothing
      was written that a retry would not converge (upserts are idempotent by id).

    Every call gets :class:`CallOptions` (a timeout; reads a consistency level)
    unless the caller passes its own.
    """

    def __init__(
        self,
        client: Any,
        uri: str,
        collection: str | None = None,
        *,
        options: CallOptions | None = None,
        reloads: Reloads | None = None,
    ) -> None:
        self.raw = client
        self._uri = uri
        self._collection = collection
        self.options = options  # None: an iterator's next() and close(), as they are
        self.reloads = reloads or Reloads()

    def for_collection(self, name: str, raw: Any = None) -> Guarded:
        """The same client (or ``raw``: scoped to ``name``'s rows), for ``name``.

        A missing Milvus collection is then reported as ``name``'s 404.
        """
        return Guarded(
            self.raw if raw is None else raw,
            self._uri,
            name,
            options=self.options,
            reloads=self.reloads,
        )

    def __getattr__(self, method: str) -> Any:
        call = getattr(self.raw, method)
        given = {} if self.options is None else self.options.of(method)

        def guarded(*args: Any, **kwargs: Any) -> Any:
            if _pastes_ids(self.raw, method, kwargs):
                raise TypeError(
                    f"pymilvus's {method} by ids pastes them into an expression "
                    "unescaped: call it on the layout's scoped client (Keyed)"
                )
            try:
                result = call(*args, **{**given, **kwargs})
            except MilvusException as error:
                raise self._translate(error, args[0] if args else None) from error
            except grpc.RpcError as error:  # pymilvus passes a deadline on as it is
                raise self._no_answer(error) from error
            if method.endswith("_iterator"):  # its next() calls Milvus too
                return Guarded(
                    result, self._uri, self._collection, reloads=self.reloads
                )
            return result

        return guarded

    def translate(self, error: MilvusException) -> Exception:
        """The exception to raise for ``error`` (a call made on :attr:`raw`)."""
        return self._translate(error)

    def _translate(self, error: MilvusException, milvus: Any = None) -> NormcalError:
        """The error to report for ``error`` (``milvus``: the collection called).

        Its detail names neither the URI (a path for Milvus Lite) nor Milvus's own
        collection names, and leaves out Milvus's message (a refusal's quotes the
        expression normcal built, an outage's the address): the log has them.
        """
        outcome = classify(error)
        logger.warning(
            "Milvus at %s (%s): %s", self._uri, milvus, error.message or error
        )
        said = f"{error.message or error} (Milvus error {error.code})"
        if outcome == "input":
            return InvalidRequestError(
                f"Milvus refused the request (Milvus error {error.code}; the "
                "server log has its message)"
            )
        if outcome == "unsupported":
            return BackendUnsupportedError(BACKEND, f"cannot serve this: {said}")
        if outcome == "not_found" and self._collection is not None:
            return NotFoundError("collection", self._collection)
        if outcome == "not_loaded" and isinstance(milvus, str):
            return StorageLoadingError(
                "Milvus has the collection released: it is being loaded, retry",
                loaded=self.load_in_background(milvus),
                retry_after=_RETRY_AFTER,
            )
        return StorageUnavailableError(
            f"Milvus is unavailable (Milvus error {error.code}; the server log has "
            "its message)",
            retry_after=_RETRY_AFTER,
        )

    def _no_answer(self, error: grpc.RpcError) -> StorageUnavailableError:
        code = error.code() if isinstance(error, grpc.Call) else None
        said = (
            f"no answer within {self.options.timeout} s (NORMCAL_MILVUS_TIMEOUT_S)"
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and self.options is not None
            else f"gRPC {code.name if code is not None else 'error'}"
        )
        logger.warning("Milvus at %s: %s (%s)", self._uri, said, error)
        return StorageUnavailableError(
            f"Milvus is unavailable: {said}", retry_after=_RETRY_AFTER
        )

    def load_in_background(self, milvus: str) -> threading.Event:
        """Start loading ``milvus`` (:class:`Reloads`); the event is set when it ends."""
        return self.reloads.start(self._load, milvus)

    def _load(self, milvus: str) -> None:
        self.raw.load_collection(milvus, timeout=RELOAD_TIMEOUT_S)


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
    """Every row matching ``filter_`` (a query iterator: no result-size cap).

    Only for collections whose primary keys normcal makes from safe characters (state
    rows: a kind and a SHA-256, after a tenant name): pymilvus's iterator pastes the
    last key of each page into the next page's filter unescaped. Documents, keyed by
    users' ids, are listed in seq windows instead (``MilvusCollection._all_rows``).
    """
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
