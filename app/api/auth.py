"""Bearer keys with roles: who a request is (middleware), what a route needs (its role).

**Who.** A pure ASGI middleware reads ``Authorization: Bearer <key>`` *before*
routing, body parsing or any lookup (:class:`~app.api.keys.Keyring`). Without a
valid key a protected request gets a 401 problem, the same whether a collection
exists or not, and whether its JSON is valid or not. The identity goes into
``scope["state"]["key"]`` (and its name into the access log). With no key set
(neither ``NORMCAL_API_KEY`` nor ``NORMCAL_API_KEYS_FILE``) every request is admin.

**What.** Every route declares the role it needs where it is defined, with one of
:data:`READ`, :data:`JUDGE`, :data:`WRITE`, :data:`ADMIN` (or
:data:`READ_EVERY_COLLECTION`) in its ``dependencies``::

    @router.post("/search", dependencies=[READ])

:func:`check_route_roles` (run by ``create_app``) refuses to build an app with a
route that declares none or two, and ``tests/api/test_roles.py`` sends every role's
key to every route. A key whose role is too low gets a 403 problem naming the role
needed; a key scoped to collections gets for any other collection the 404 an
unknown collection gets (so it learns no names), and sees only its own in lists.
A route that takes a collection's name in its body rather than its path checks it
itself, with its :data:`KeyDep`: ``key.sees(name)`` (``POST /v1/collections`` does).

**Public paths.** Without a key: ``/healthz`` and ``/readyz`` when ``public_health``
is true; ``/docs`` (with its scripts under ``/docs/static/``), ``/redoc`` and
``/openapi.json`` when ``public_docs`` is true (the schema describes the API and
holds no data). ``/metrics`` names every collection and calibrator in its labels, so
it needs a key for every collection unless ``public_metrics`` opts in. The pages when
``public_ui`` is true: the home page ``/`` and everything under ``/ui/`` (HTML, JS and
CSS: no data, a page asks for the key and sends it on its ``/v1`` calls); a public
entry ending in ``/`` is a prefix (but ``/`` itself: :func:`is_prefix`). Public paths are
read-only: an anonymous request passes only a :data:`READ` route.
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.params import Depends as DependsParam
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.security import HTTPBearer
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.errors import render_problem
from app.api.keys import ANONYMOUS, OPEN, Identity, Keyring
from app.exceptions import ForbiddenError, NotFoundError, UnauthorizedError
from app.schemas.common import COLLECTION_NAME_PATTERN
from app.schemas.keys import Role

HEALTH_PATHS = frozenset({"/healthz", "/readyz"})
METRICS_PATHS = frozenset({"/metrics"})
DOCS_PATHS = frozenset(
    {"/docs", "/docs/oauth2-redirect", "/docs/static/", "/redoc", "/openapi.json"}
)
UI_PATHS = frozenset({"/", "/ui/"})  # "/ui/" a prefix, "/" the home page only
_COLLECTION_NAME = re.compile(COLLECTION_NAME_PATTERN)

# Declared on the /v1 routers so OpenAPI shows the scheme (and Swagger UI offers
# "Authorize"); auto_error=False because the middleware does the enforcing.
bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="apiKey",
    description="an API key as a bearer token (only when the server sets keys)",
)


def is_prefix(public: str) -> bool:
    """Whether a public entry is a prefix: it ends in ``/`` (``/`` itself is a page)."""
    return public.endswith("/") and public != "/"


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


class ApiKeyMiddleware:
    """Who the request is: a 401 problem without a valid key, but on public paths.

    With a keyring that holds no keys (none set) it marks every request admin.
    """

    def __init__(
        self, app: ASGIApp, *, keyring: Keyring, public: frozenset[str]
    ) -> None:
        self.app = app
        self.keyring = keyring
        self._public = public
        self._prefixes = tuple(p for p in public if is_prefix(p))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one ASGI connection."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        if not self.keyring.enabled:
            state["key"] = OPEN
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization")
        key = self.keyring.authenticate(header)
        if key is None and not (
            scope["path"] in self._public or scope["path"].startswith(self._prefixes)
        ):
            error = UnauthorizedError("a valid bearer token is required")
            response = await render_problem(Request(scope), error)
            await response(scope, receive, send)
            return
        state["key"] = key or ANONYMOUS
        state["key_name"] = None if key is None else key.name
        await self.app(scope, receive, send)


def request_key(request: Request) -> Identity:
    """The identity the middleware gave the request (none: refused, fail closed)."""
    key = request.scope.get("state", {}).get("key")
    if not isinstance(key, Identity):
        raise UnauthorizedError("a valid bearer token is required")
    return key


async def _key_dependency(request: Request) -> Identity:
    # async: FastAPI would run :func:`request_key` itself in a worker thread.
    return request_key(request)


KeyDep = Annotated[Identity, Depends(_key_dependency)]


class RoleCheck:
    """A route's declared role, enforced as its dependency (see the module's doc).

    ``every_collection``: the route shows every collection's name (``/metrics``),
    so a key scoped to collections may not use it.
    """

    def __init__(self, role: Role, *, every_collection: bool = False) -> None:
        self.role = role
        self.every_collection = every_collection

    def __repr__(self) -> str:
        return f"RoleCheck({self.role.value!r})"

    async def __call__(self, request: Request) -> None:
        """Refuse the request if its key may not use this route."""
        key = request_key(request)
        if key.role is None:  # anonymous on a path the operator made public
            if self.role is not Role.READ:
                raise UnauthorizedError("a valid bearer token is required")
            return
        what = f"{request.method} {request.url.path}"
        if not key.role.allows(self.role):
            higher = "" if self.role is Role.ADMIN else " or a higher one"
            raise ForbiddenError(
                f"key {key.name!r} has the {key.role} role; {what} needs the "
                f"{self.role} role{higher}",
                role=self.role.value,
            )
        if key.collections is None:
            return
        if self.every_collection:
            raise ForbiddenError(
                f"key {key.name!r} is scoped to some collections; {what} shows "
                "every collection's name and needs a key for all of them"
            )
        name = request.path_params.get("name")
        # A malformed name is the path check's 422; one out of scope is the 404 an
        # unknown collection gets, so the key learns nothing of other collections.
        if (
            isinstance(name, str)
            and _COLLECTION_NAME.fullmatch(name)
            and not key.sees(name)
        ):
            raise NotFoundError("collection", name)


def _requires(role: Role, *, every_collection: bool = False) -> DependsParam:
    return DependsParam(RoleCheck(role, every_collection=every_collection))


READ = _requires(Role.READ)
JUDGE = _requires(Role.JUDGE)
WRITE = _requires(Role.WRITE)
ADMIN = _requires(Role.ADMIN)
READ_EVERY_COLLECTION = _requires(Role.READ, every_collection=True)

# Routes the framework adds, outside any router: served to any valid key (read).
FRAMEWORK_ROUTES = {"/openapi.json": RoleCheck(Role.READ)}


def route_roles(app: FastAPI) -> tuple[dict[str, RoleCheck], list[str]]:
    """Every route's declared role by ``"METHOD path"``, and the routes without one.

    A route must declare exactly one (among its own and its router's
    dependencies); the framework's own routes are :data:`FRAMEWORK_ROUTES`.
    """
    roles: dict[str, RoleCheck] = {}
    missing: list[str] = []
    for route in iter_route_contexts(app.routes):
        path, methods = str(route.path), sorted(route.methods or set())
        if isinstance(route.original_route, APIRoute):
            checks = [
                dep.dependency
                for dep in route.dependencies
                if isinstance(dep.dependency, RoleCheck)
            ]
        else:
            checks = [FRAMEWORK_ROUTES[path]] if path in FRAMEWORK_ROUTES else []
        if len(checks) != 1:
            missing.append(f"{','.join(methods)} {path} ({len(checks)} roles)")
            continue
        for method in methods:
            if method != "HEAD":
                roles[f"{method} {path}"] = checks[0]
    return roles, missing


def check_route_roles(app: FastAPI) -> dict[str, RoleCheck]:
    """Every route's role by ``"METHOD path"``; a route without exactly one fails."""
    roles, missing = route_roles(app)
    if missing:
        raise RuntimeError(
            "every route declares the one role it needs where it is defined, e.g. "
            "@router.get(..., dependencies=[READ]) (app/api/auth.py); these do not: "
            + "; ".join(missing)
        )
    return roles
