"""The application factory: ``uvicorn --factory app.api.app:create_app``."""

from __future__ import annotations

import functools
import re

from fastapi import APIRouter, Depends, FastAPI
from fastapi.routing import APIRoute
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import BaseRoute

from app import __version__
from app.api.auth import (
    ApiKeyMiddleware,
    bearer_scheme,
    check_route_roles,
    public_paths,
)
from app.api.errors import install_error_handlers
from app.api.keys import Keyring
from app.api.lifespan import make_lifespan
from app.api.middleware import (
    BodyLimitMiddleware,
    RequestIdMiddleware,
    SecurityHeadersMiddleware,
)
from app.api.routers import (
    calibrators,
    collections,
    docs,
    documents,
    embed,
    embeddings,
    fit_jobs,
    health,
    judging,
    key,
    metrics,
    rerank,
    search,
    snapshots,
    ui,
)
from app.api.strict import refuse_unknown_query
from app.embedding import Embedder
from app.observability import AccessLogMiddleware, Metrics, RouteTemplates
from app.settings import Settings

# The one route whose body is streamed to disk, with a cap of its own.
SNAPSHOT_UPLOAD = re.compile(r"/v1/collections/[^/]+/snapshots/upload")


def _operation_id(route: APIRoute) -> str:
    return f"{route.tags[0]}-{route.name}" if route.tags else route.name


@functools.cache
def _routes() -> list[BaseRoute]:
    """Every route of the app, built once a process and shared by the apps built here.

    FastAPI builds an included route's dependencies and fields (~640 pydantic
    adapters, ~0.15 s of CPU) for the router that includes it, when it first
    matches a request. Included once here, not once an app, they are built once: a
    test suite builds ~500 apps. Being outside any app, the routes see no
    ``app.dependency_overrides`` (nothing here uses them).
    """
    api = APIRouter(
        generate_unique_id_function=_operation_id,
        # Every route: a query parameter it does not declare is a 422 naming it.
        dependencies=[Depends(refuse_unknown_query)],
    )
    for module in (health, metrics, ui, docs):
        api.include_router(module.router)
    for module in (
        key,
        embed,
        embeddings,
        collections,
        documents,
        search,
        rerank,
        calibrators,
        fit_jobs,
        judging,
        snapshots,
    ):
        api.include_router(
            module.router, prefix="/v1", dependencies=[Depends(bearer_scheme)]
        )
    return api.routes


def create_app(
    settings: Settings | None = None, *, embedder: Embedder | None = None
) -> FastAPI:
    """Build the app; nothing heavy loads until the lifespan starts.

    A keys file that cannot be used raises :class:`~app.api.keys.KeysFileError`.
    """
    settings = settings or Settings()
    keyring = Keyring(api_key=settings.api_key, path=settings.api_keys_file)
    app_metrics = Metrics()
    app = FastAPI(
        title="normcal",
        version=__version__,
        summary="Cosine retrieval that answers with calibrated P(relevant).",
        lifespan=make_lifespan(settings, embedder, app_metrics),
        generate_unique_id_function=_operation_id,
        docs_url=None,  # served by routers.docs from local assets, not a CDN
        redoc_url=None,
        routes=_routes(),
    )
    install_error_handlers(app)
    # Added innermost first. Outermost: request id, the security headers (on every
    # answer, 401/413 included), then access log + metrics (so
    # they see every answer, 401/413 included), then CORS (a preflight carries no
    # key, and a 401 needs the headers for the page to read it), then auth, then
    # the body cap.
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.limits.max_body_bytes,
        streamed=(("POST", SNAPSHOT_UPLOAD, settings.limits.max_snapshot_bytes),),
    )
    app.add_middleware(
        ApiKeyMiddleware,
        keyring=keyring,
        public=public_paths(
            public_health=settings.public_health,
            public_docs=settings.public_docs,
            public_metrics=settings.public_metrics,
            public_ui=settings.public_ui,
        ),
    )
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["x-request-id", "retry-after"],
            max_age=600,
        )
    # Every app built here has the same routes (:func:`_routes`),
    # so they share one set of route templates.
    templates = RouteTemplates(app, shared_as="create_app")
    app.add_middleware(AccessLogMiddleware, metrics=app_metrics, templates=templates)
    app.add_middleware(SecurityHeadersMiddleware)
    app.add_middleware(RequestIdMiddleware)
    check_route_roles(app)
    app.state.keyring = keyring  # `normcal serve` reloads it on SIGHUP
    return app
