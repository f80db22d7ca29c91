"""ASGI middleware: request ids, a body cap, the browser security headers.

A request id on every request (``X-Request-ID``); a cap on the body's bytes; the
headers that keep a browser from running, framing or sniffing what the service
serves (:class:`SecurityHeadersMiddleware`).
"""

from __future__ import annotations

import base64
import hashlib
import re
import uuid

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import render_problem
from app.exceptions import PayloadTooLargeError

_VALID_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class RequestIdMiddleware:
    """Take a safe client ``X-Request-ID`` or make one; store it in ``scope['state']``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one ASGI connection."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _VALID_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [
                    *message["headers"],
                    (b"x-request-id", request_id.encode()),
                ]
            await send(message)

        await self.app(scope, receive, send_with_id)


# The service's own pages (the judging page, the report viewer, the report) load
# scripts, styles and images from the service only, and run no inline script: a value
# that slipped into a page as markup still could not run. None of them may be framed.
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# Swagger UI and ReDoc (routers.docs): their vendored scripts need inline styles,
# data: images and a blob: worker; Swagger UI's one inline script is allowed by hash.
DOCS_CSP = (
    "default-src 'none'; script-src 'self'{scripts}; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self'; connect-src 'self'; "
    "worker-src 'self' blob:; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": PAGE_CSP,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}
_ENCODED_HEADERS = [(n.encode(), v.encode()) for n, v in SECURITY_HEADERS.items()]
_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.DOTALL)


def docs_csp(page: bytes) -> str:
    """:data:`DOCS_CSP` allowing exactly the inline scripts of ``page`` (by hash)."""
    hashes = "".join(
        f" 'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
        for script in _INLINE_SCRIPT.findall(page)
    )
    return DOCS_CSP.format(scripts=hashes)


class SecurityHeadersMiddleware:
    """Add :data:`SECURITY_HEADERS` to every response that does not set its own.

    A response may set its own ``Content-Security-Policy`` (``/docs``); the others
    are the same everywhere. On JSON and PNG answers the policy is inert but harmless.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one ASGI connection."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(n, v) for n, v in _ENCODED_HEADERS if n not in present]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


class BodyLimitMiddleware:
    """Answer 413 (problem+json) to bodies over ``max_bytes``.

    A declared ``Content-Length`` over the cap is refused before any byte is read;
    otherwise the body is read and counted chunk by chunk (chunked transfer has no
    length), refused as soon as the count passes the cap, and replayed to the app.
    The app would buffer the whole body anyway to parse JSON, so this costs nothing.

    ``streamed``: ``(method, path pattern, cap)`` of routes that stream a large body
    to disk themselves (a snapshot upload): a declared length over their own cap is
    refused here, and their body passes through unbuffered (the route counts it).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int,
        streamed: tuple[tuple[str, re.Pattern[str], int], ...] = (),
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.streamed = streamed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one ASGI connection."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        streamed = next(
            (
                cap
                for method, path, cap in self.streamed
                if scope["method"] == method and path.fullmatch(scope["path"])
            ),
            None,
        )
        limit = self.max_bytes if streamed is None else streamed
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(scope, receive, send, limit)
            return
        if streamed is not None:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send, self.max_bytes)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], receive), send)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, limit: int
    ) -> None:
        error = PayloadTooLargeError(
            f"the request body exceeds the limit of {limit} bytes"
        )
        response = await render_problem(Request(scope), error)
        response.headers["Connection"] = "close"
        await response(scope, receive, send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that yields ``messages`` first, then defers to ``receive``."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
