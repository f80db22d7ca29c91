"""Optional bearer-token authentication (``NORMCAL_API_KEY``).

Enforced by a pure ASGI middleware *before* routing, body parsing or any lookup, so
an unauthenticated client learns nothing (not even whether a collection exists, or
whether its JSON is valid): every protected request without the right key gets the
same 401 problem. The key is compared in constant time and never logged.

Public without a key: ``/healthz`` and ``/readyz`` when ``public_health`` is true;
``/docs`` (with its scripts under ``/docs/static/``), ``/redoc`` and
``/openapi.json`` when ``public_docs`` is true (the schema
describes the API and holds no data). ``/metrics`` names every collection and
calibrator in its labels, so it needs the key unless ``public_metrics`` opts in.
The pages when ``public_ui`` is true: the home page ``/`` and everything under
``/ui/`` (HTML, JS and CSS: no data, a page asks for the key and sends it on its
``/v1`` calls). A public entry ending in ``/`` is a prefix, except ``/`` itself.
"""

from __future__ import annotations

import hmac

from fastapi.security import HTTPBearer
from pydantic import SecretStr
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.errors import render_problem
from app.exceptions import UnauthorizedError

HEALTH_PATHS = frozenset({"/healthz", "/readyz"})
METRICS_PATHS = frozenset({"/metrics"})
DOCS_PATHS = frozenset(
    {"/docs", "/docs/oauth2-redirect", "/docs/static/", "/redoc", "/openapi.json"}
)
UI_PATHS = frozenset({"/", "/ui/"})  # "/ui/" a prefix, "/" the home page only

# Declared on the /v1 routers so OpenAPI shows the scheme (and Swagger UI offers
# "Authorize"); auto_error=False because the middleware does the enforcing.
bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="apiKey",
    description="NORMCAL_API_KEY as a bearer token (only when the server sets one)",
)


def public_paths(
    *,
    public_health: bool,
    public_docs: bool,
    public_metrics: bool,
    public_ui: bool = False,
) -> frozenset[str]:
    """Paths served without a key (one ending in ``/`` is a prefix)."""
    paths: set[str] = set()
    if public_ui:
        paths |= UI_PATHS
    if public_health:
        paths |= HEALTH_PATHS
    if public_docs:
        paths |= DOCS_PATHS
    if public_metrics:
        paths |= METRICS_PATHS
    return frozenset(paths)


def token_matches(header: bytes | None, key: bytes) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <key>`` (constant time)."""
    if header is None:
        return False
    scheme, _, token = header.partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(token.strip(), key)


class ApiKeyMiddleware:
    """Reject requests without ``Authorization: Bearer <api key>`` (401 problem).

    With ``api_key=None`` it is a pass-through.
    """

    def __init__(
        self, app: ASGIApp, *, api_key: SecretStr | None, public: frozenset[str]
    ) -> None:
        self.app = app
        self._key = api_key.get_secret_value().encode() if api_key else None
        self._public = public
        self._prefixes = tuple(p for p in public if p.endswith("/") and p != "/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one ASGI connection."""
        if (
            self._key is None
            or scope["type"] != "http"
            or scope["path"] in self._public
            or scope["path"].startswith(self._prefixes)
            or token_matches(dict(scope["headers"]).get(b"authorization"), self._key)
        ):
            await self.app(scope, receive, send)
            return
        error = UnauthorizedError("a valid bearer token is required")
        response = await render_problem(Request(scope), error)
        await response(scope, receive, send)
