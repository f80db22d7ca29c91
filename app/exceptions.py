"""Domain errors of the service. ``app/api/errors.py`` maps each to an HTTP problem.

::

    NormcalError
    ├── NotFoundError            (an unknown collection, document or calibrator)
    ├── ConflictError            (a collection that already exists)
    ├── InvalidRequestError      (well-formed but unacceptable input)
    ├── BackendUnsupportedError  (the storage backend cannot do what was asked)
    │   └── LimitExceededError   (a declared limit was passed)
    ├── PayloadTooLargeError     (request body over the byte cap)
    ├── UnauthorizedError        (missing or wrong API key)
    ├── ForbiddenError           (a valid key without the role or the collection)
    ├── OverloadedError          (CPU pool saturated; retry later)
    ├── CollectionUnavailableError (its file could not be opened; quarantined)
    ├── StorageUnavailableError  (the data dir cannot be written; Milvus does not answer)
    └── InsufficientStorageError (the disk is full; nothing was written)
"""

from __future__ import annotations


class NormcalError(Exception):
    """Base class of every error the service reports as a problem response."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class NotFoundError(NormcalError):
    """A named resource does not exist."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"{kind} {name!r} does not exist")
        self.kind = kind
        self.name = name


class ConflictError(NormcalError):
    """The resource already exists."""


class InvalidRequestError(NormcalError):
    """The request is well-formed JSON but cannot be served as asked."""

    def __init__(self, detail: str, *, field: str | None = None) -> None:
        super().__init__(detail)
        self.field = field


class LimitExceededError(InvalidRequestError):
    """A declared limit was exceeded."""

    def __init__(
        self, field: str, limit: int, actual: int, *, rule: str | None = None
    ) -> None:
        detail = f"{field}: {actual} exceeds the limit of {limit}"
        super().__init__(detail if rule is None else f"{detail} ({rule})", field=field)
        self.limit = limit
        self.actual = actual


class BackendUnsupportedError(NormcalError):
    """The configured storage backend (e.g. a Milvus without BM25) cannot serve this."""

    def __init__(self, backend: str, detail: str) -> None:
        super().__init__(f"the {backend} storage backend {detail}")
        self.backend = backend


class PayloadTooLargeError(NormcalError):
    """The request body is larger than the configured cap."""


class UnauthorizedError(NormcalError):
    """The request lacks a valid bearer token."""


class ForbiddenError(NormcalError):
    """A valid key that may not do this: its role is too low, or its scope.

    ``role`` names the role needed (``None`` when the key's collections refused).
    """

    def __init__(self, detail: str, *, role: str | None = None) -> None:
        super().__init__(detail)
        self.role = role


class OverloadedError(NormcalError):
    """More CPU work is queued than the pool accepts; the client should retry."""

    def __init__(self, detail: str, *, retry_after: int = 1) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class CollectionUnavailableError(NormcalError):
    """A collection whose file failed validation at start-up (it is quarantined).

    The file is left untouched for the operator: fix or restore it and restart, or
    ``DELETE`` the collection to remove it.
    """

    def __init__(self, name: str, path: str, reason: str) -> None:
        super().__init__(
            f"collection {name!r} is unavailable: its file {path} could not be "
            f"opened ({reason}). Restore or repair the file and restart the server, "
            "or DELETE the collection to remove the file."
        )
        self.name = name
        self.reason = reason


class StorageUnavailableError(NormcalError):
    """The data directory cannot be written, or the Milvus backend does not answer.

    ``retry_after`` (seconds) is set when the cause is expected to pass without an
    operator (Milvus restarting); a read-only data dir does not pass by itself.
    """

    def __init__(self, detail: str, *, retry_after: int | None = None) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class InsufficientStorageError(NormcalError):
    """The disk is full; the write was rolled back and nothing was stored."""
