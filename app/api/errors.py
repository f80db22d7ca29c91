"""RFC 9457 problem responses: the one table from exceptions to HTTP.

Routes raise domain exceptions and never build error responses themselves. A 500 never
echoes internals: it logs the traceback with the request id and says only that. A 4xx
says what the service wrote (the field and the rule), never a library's exception text
(:func:`public_detail`); a validation error says pydantic's rule without its prefix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import exceptions as exc
from app.schemas.jobs import FitJobError
from calibration import exceptions as cal

logger = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"


class ProblemDetail(BaseModel):
    """An RFC 9457 problem document."""

    type: str = Field(description="URI reference naming the problem type")
    title: str
    status: int
    detail: str
    instance: str | None = Field(None, description="urn:request:<id> of the request")
    errors: list[dict[str, Any]] | None = Field(
        None, description="field errors, for validation problems"
    )
    role: str | None = Field(
        None, description="for a 403: the role the request needs (read, judge, ...)"
    )


@dataclass(frozen=True)
class ProblemType:
    """How one exception class is reported."""

    status: int
    slug: str
    title: str


# Most specific classes first: the first isinstance match wins. calibration/ knows
# nothing of HTTP; its errors are mapped here too, so the table stays in one place.
PROBLEM_TABLE: dict[type[Exception], ProblemType] = {
    cal.InsufficientDataError: ProblemType(422, "insufficient-data", "Not enough data"),
    cal.InvalidInputError: ProblemType(422, "invalid-input", "Invalid input"),
    cal.UnsupportedFormatError: ProblemType(
        422, "unsupported-format", "Unsupported format"
    ),
    cal.NotFittedCalibratorError: ProblemType(
        409, "not-fitted", "Calibrator not fitted"
    ),
    cal.CalibrationError: ProblemType(422, "calibration-failed", "Calibration failed"),
    exc.NotFoundError: ProblemType(404, "not-found", "Not found"),
    exc.ConflictError: ProblemType(409, "conflict", "Conflict"),
    exc.LimitExceededError: ProblemType(422, "limit-exceeded", "Limit exceeded"),
    exc.InvalidRequestError: ProblemType(422, "invalid-request", "Invalid request"),
    exc.BackendUnsupportedError: ProblemType(
        422, "backend-unsupported", "Not supported by the storage backend"
    ),
    exc.PayloadTooLargeError: ProblemType(
        413, "payload-too-large", "Payload too large"
    ),
    exc.UnauthorizedError: ProblemType(401, "unauthorized", "Unauthorized"),
    exc.ForbiddenError: ProblemType(403, "forbidden", "Forbidden"),
    exc.OverloadedError: ProblemType(503, "overloaded", "Service overloaded"),
    exc.CollectionUnavailableError: ProblemType(
        503, "collection-unavailable", "Collection unavailable"
    ),
    exc.StorageUnavailableError: ProblemType(
        503, "storage-unavailable", "Storage unavailable"
    ),
    exc.InsufficientStorageError: ProblemType(
        507, "insufficient-storage", "Insufficient storage"
    ),
}

VALIDATION = ProblemType(422, "validation-error", "Request validation failed")
MALFORMED_JSON = ProblemType(400, "malformed-json", "Malformed JSON body")
INTERNAL = ProblemType(500, "internal-error", "Internal server error")


def problem_type_uri(slug: str) -> str:
    """Return the type URI of a problem slug (documented in docs/api.md)."""
    return f"/problems/{slug}"


def request_instance(request: Request) -> str | None:
    """Return the ``urn:request:<id>`` of the request, if the middleware set one."""
    request_id = getattr(request.state, "request_id", None)
    return f"urn:request:{request_id}" if request_id else None


def problem_response(
    request: Request,
    problem: ProblemType,
    detail: str,
    *,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
    role: str | None = None,
) -> JSONResponse:
    """Build a problem+json response."""
    body = ProblemDetail(
        type=problem_type_uri(problem.slug),
        title=problem.title,
        status=problem.status,
        detail=detail,
        instance=request_instance(request),
        errors=errors,
        role=role,
    )
    return JSONResponse(
        body.model_dump(exclude_none=True),
        status_code=problem.status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


# Said in place of a library exception's text that a domain error's message embeds.
WITHHELD = "unreadable (the server log says why)"
_MIN_ECHO = 4  # shorter texts ("0", "'a'") are a key or a value, not an explanation


def _foreign_causes(error: BaseException) -> list[BaseException]:
    """The exceptions ``error`` was raised from that are not normcal's own."""
    found: list[BaseException] = []
    seen: set[int] = set()
    cause = error.__cause__
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if not isinstance(cause, exc.NormcalError | cal.CalibrationError):
            found.append(cause)
        cause = cause.__cause__
    return found


def public_detail(error: BaseException) -> str:
    """The error's message, with any library exception's text in it withheld.

    Domain messages are written for the client. One raised from a library's exception
    (``raise InvalidRequestError(f"...: {e}") from e``) may embed that exception's
    text: numpy's, SQLite's or Python's wording, which names internals rather than a
    field and a rule. That part is replaced by :data:`WITHHELD`; the log keeps it.
    """
    detail = str(error)
    for cause in _foreign_causes(error):
        text = str(cause)
        if len(text) >= _MIN_ECHO and text in detail:
            detail = detail.replace(text, _instead_of(cause))
    return detail


def _instead_of(cause: BaseException) -> str:
    """What to say in place of a library exception's text."""
    if isinstance(cause, KeyError) and cause.args and isinstance(cause.args[0], str):
        return f"the field {cause.args[0][:64]!r} is missing"
    return WITHHELD


def lookup(error: Exception) -> ProblemType | None:
    """Find the problem type of a domain exception (None if it is not one)."""
    for cls, problem in PROBLEM_TABLE.items():
        if isinstance(error, cls):
            return problem
    return None


def job_error(error: BaseException) -> FitJobError:
    """The problem a failed fit job records: the one this table gives its error.

    The same title, status and detail the synchronous fit would have answered. An
    unexpected error is logged and recorded without its internals, as a 500 is.
    """
    problem = lookup(error) if isinstance(error, Exception) else None
    if problem is None:
        logger.error("a fit job failed", exc_info=error)
        return FitJobError(
            title=INTERNAL.title,
            detail="the fit failed; see the server logs",
            status=INTERNAL.status,
        )
    return FitJobError(
        title=problem.title, detail=public_detail(error), status=problem.status
    )


async def _domain_handler(request: Request, error: Exception) -> JSONResponse:
    problem = lookup(error)
    if problem is None:  # pragma: no cover - registered only for mapped classes
        return await _internal_handler(request, error)
    headers = None
    retry_after = getattr(error, "retry_after", None)  # overload, Milvus outage
    if retry_after is not None:
        headers = {"Retry-After": str(retry_after)}
    if isinstance(error, exc.UnauthorizedError):
        headers = {"WWW-Authenticate": "Bearer"}
    detail = public_detail(error)
    if detail != str(error):
        logger.warning(
            "answered %s to %s %s (request %s): %s",
            problem.status,
            request.method,
            request.url.path,
            getattr(request.state, "request_id", "-"),
            error,
        )
    errors = None
    field = getattr(error, "field", None)
    if field is not None:
        errors = [{"loc": field.split("."), "msg": detail}]
    role = error.role if isinstance(error, exc.ForbiddenError) else None
    return problem_response(
        request, problem, detail, errors=errors, headers=headers, role=role
    )


async def render_problem(request: Request, error: exc.NormcalError) -> JSONResponse:
    """Render a domain error via the table, for pure ASGI middleware (auth, body cap).

    Middleware runs outside the app's exception handlers, so it renders here rather
    than raising; the response is the one the handler would have produced.
    """
    return await _domain_handler(request, error)


# What pydantic puts before the message of a ValueError or an assert in a validator.
_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def _rule(message: str) -> str:
    """A pydantic error message without its Python prefix."""
    for prefix in _PYDANTIC_PREFIXES:
        message = message.removeprefix(prefix)
    return message


def _jsonable_errors(raw: list[Any]) -> list[dict[str, Any]]:
    # pydantic error dicts may hold exception objects in ``ctx`` (and the input in
    # ``input``): keep where and which rule, written by pydantic or by the schemas.
    return [
        {
            "loc": [str(p) for p in e.get("loc", ())],
            "msg": _rule(str(e.get("msg", "invalid"))),
            "type": e.get("type"),
        }
        for e in raw
    ]


async def _validation_handler(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    errors = _jsonable_errors(list(error.errors()))
    if any(e["type"] == "json_invalid" for e in errors):
        return problem_response(
            request,
            MALFORMED_JSON,
            "The request body is not valid JSON.",
            errors=errors,
        )
    first = errors[0] if errors else {"loc": [], "msg": "invalid"}
    where = ".".join(p for p in first["loc"] if p != "body") or "body"
    detail = f"{where}: {first['msg']}"
    if len(errors) > 1:
        detail += f" (and {len(errors) - 1} more)"
    return problem_response(request, VALIDATION, detail, errors=errors)


async def _http_handler(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StarletteHTTPException)
    problem = ProblemType(
        error.status_code, f"http-{error.status_code}", _reason(error.status_code)
    )
    return problem_response(
        request, problem, str(error.detail), headers=dict(error.headers or {})
    )


async def _internal_handler(request: Request, error: Exception) -> JSONResponse:
    logger.error(
        "unhandled error in %s %s (request %s)",
        request.method,
        request.url.path,
        getattr(request.state, "request_id", "-"),
        exc_info=error,
    )
    return problem_response(
        request, INTERNAL, "The server failed to handle this request; see its logs."
    )


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:  # pragma: no cover - non-standard status
        return "Error"


def install_error_handlers(app: FastAPI) -> None:
    """Register the problem handlers on ``app``."""
    for cls in (exc.NormcalError, cal.CalibrationError):
        app.add_exception_handler(cls, _domain_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)
    app.add_exception_handler(Exception, _internal_handler)


PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ProblemDetail, "content": {PROBLEM_MEDIA_TYPE: {}}}
    for status in (400, 401, 403, 404, 409, 413, 422, 503, 507)
}
