"""The application factory: ``uvicorn --factory app.main:create_app``."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import APIRoute

from app import __version__
from app.embedding import Embedder
from app.errors import install_error_handlers
from app.lifespan import make_lifespan
from app.middleware import RequestIdMiddleware
from app.routers import collections, documents, embed, health, search
from app.settings import Settings


def _operation_id(route: APIRoute) -> str:
    return f"{route.tags[0]}-{route.name}" if route.tags else route.name


def create_app(
    settings: Settings | None = None, *, embedder: Embedder | None = None
) -> FastAPI:
    """Build the app; nothing heavy loads until the lifespan starts."""
    settings = settings or Settings()
    app = FastAPI(
        title="normcal",
        version=__version__,
        summary="Cosine retrieval that answers with calibrated P(relevant).",
        lifespan=make_lifespan(settings, embedder),
        generate_unique_id_function=_operation_id,
    )
    install_error_handlers(app)
    app.add_middleware(RequestIdMiddleware)
    app.include_router(health.router)
    for module in (embed, collections, documents, search):
        app.include_router(module.router, prefix="/v1")
    return app
