"""Typed errors: one class per problem family of the server's RFC 9457 answers.

::

    NormcalError                  status, type, title, detail, instance, errors
    ├── ConnectionFailed          no HTTP answer at all
    ├── InvalidRequest            400 / 422: malformed, invalid or over a limit
    ├── Unauthorized              401
    ├── Forbidden                 403
    ├── NotFound                  404
    ├── Conflict                  409: exists already, or calibrator not fitted
    ├── PayloadTooLarge           413
    ├── ServiceUnavailable        503 (and 429), retried automatically
    │   ├── Overloaded            503 overloaded / 429 rate limited
    │   └── CollectionUnavailable 503 collection-unavailable
    ├── InsufficientStorage       507: the server's disk is full
    └── ServerError               any other 5xx
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

import httpx

from normcal_client._models import ProblemDetail


class NormcalError(Exception):
    """Base of every error the client raises.

    ``problem`` is the server's RFC 9457 document, or one made up from the status
    line when the answer was not a problem (a proxy's HTML page, say).
    """

    def __init__(
        self,
        problem: ProblemDetail,
        *,
        retry_after: float | None = None,
        response: httpx.Response | None = None,
    ) -> None:
        message = f"{problem.status} {problem.title}: {problem.detail}"
        if problem.instance:
            message += f" [{problem.instance}]"
        super().__init__(message)
        self.problem = problem
        self.retry_after = retry_after
        self.response = response

    @property
    def status(self) -> int:
        """HTTP status of the answer (0 when no answer arrived)."""
        return self.problem.status

    @property
    def type(self) -> str:
        """The problem ``type`` URI, e.g. ``/problems/not-found``."""
        return self.problem.type

    @property
    def title(self) -> str:
        """The problem's short, fixed summary."""
        return self.problem.title

    @property
    def detail(self) -> str:
        """What went wrong with this request."""
        return self.problem.detail

    @property
    def instance(self) -> str | None:
        """``urn:request:<id>`` of the failed request: quote it in bug reports."""
        return self.problem.instance

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Field errors of a validation problem (empty otherwise)."""
        return list(self.problem.errors or [])


class ConnectionFailed(NormcalError):
    """No HTTP answer: connection refused, DNS failure, timeout, broken stream."""


class InvalidRequest(NormcalError):
    """400 or 422: malformed JSON, a failed validation, or a limit passed."""


class Unauthorized(NormcalError):
    """401: missing or wrong API key."""


class Forbidden(NormcalError):
    """403: the key is valid but not allowed to do this.

    Its role is too low (:attr:`required_role` names the one needed), or it is
    scoped to other collections.
    """

    @property
    def required_role(self) -> str | None:
        """The role the request needs: read, judge, write or admin.

        ``None`` when the key's role sufficed but its collections did not.
        """
        return self.problem.role


class NotFound(NormcalError):
    """404: unknown collection, document or calibrator."""


class Conflict(NormcalError):
    """409: the resource already exists, or the calibrator is not fitted."""


class PayloadTooLarge(NormcalError):
    """413: the request body is over the server's byte cap; send smaller batches."""


class ServiceUnavailable(NormcalError):
    """503: the server cannot serve this now."""


class Overloaded(ServiceUnavailable):
    """503 overloaded or 429 rate limited: retried, honouring ``Retry-After``."""


class CollectionUnavailable(ServiceUnavailable):
    """503 collection-unavailable: the collection could not be opened.

    Retried only when the server sent ``Retry-After``: without it the cause (a
    damaged file, say) needs an operator, not another try.
    """


class InsufficientStorage(NormcalError):
    """507: the server's disk is full; nothing was written."""


class ServerError(NormcalError):
    """A 5xx without a family of its own: a bug or crash; see the server's logs."""


_BY_STATUS: dict[int, type[NormcalError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: InvalidRequest,
    429: Overloaded,
    503: ServiceUnavailable,
    507: InsufficientStorage,
}
# Within a status, a problem type names a narrower family.
_BY_TYPE: dict[str, type[NormcalError]] = {
    "/problems/overloaded": Overloaded,
    "/problems/collection-unavailable": CollectionUnavailable,
}


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date)."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def _problem_of(response: httpx.Response) -> ProblemDetail:
    try:
        return ProblemDetail.model_validate(response.json())
    except ValueError:  # not JSON, or JSON that is not a problem document
        text = response.text.strip()
        return ProblemDetail(
            type="about:blank",
            title=response.reason_phrase or f"HTTP {response.status_code}",
            status=response.status_code,
            detail=text[:500] or f"HTTP {response.status_code}",
        )


def error_from_response(response: httpx.Response) -> NormcalError:
    """The :class:`NormcalError` subclass of a non-2xx answer."""
    status = response.status_code
    problem = _problem_of(response)
    cls = _BY_TYPE.get(problem.type) or _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else NormcalError
    return cls(
        problem,
        retry_after=parse_retry_after(response.headers.get("retry-after")),
        response=response,
    )


def connection_failed(
    method: str, path: str, error: httpx.TransportError
) -> NormcalError:
    """The error of a request that got no answer."""
    problem = ProblemDetail(
        type="about:blank",
        title="Connection failed",
        status=0,
        detail=f"{method} {path}: {type(error).__name__}: {error}",
    )
    return ConnectionFailed(problem)


def documents_not_found(collection: str, ids: list[str]) -> NotFound:
    """The error of a delete that names documents the collection does not have."""
    shown = ", ".join(repr(i) for i in ids[:5])
    more = f" and {len(ids) - 5} more" if len(ids) > 5 else ""
    problem = ProblemDetail(
        type="/problems/not-found",
        title="Not found",
        status=404,
        detail=f"documents not in collection {collection!r}: {shown}{more}",
    )
    return NotFound(problem)
