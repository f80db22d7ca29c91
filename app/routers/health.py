"""Liveness and readiness (outside ``/v1``)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from app.deps import ServiceDep

router = APIRouter(tags=["health"])


class Health(BaseModel):
    """Liveness answer."""

    status: str


class Readiness(BaseModel):
    """Readiness answer: the model is loaded and collections are open."""

    status: str
    model: str
    dim: int
    collections: int


@router.get("/healthz")
def read_health() -> Health:
    """Liveness: the process serves HTTP."""
    return Health(status="ok")


@router.get("/readyz")
def read_readiness(service: ServiceDep) -> Readiness:
    """Readiness: the model and every collection are loaded."""
    return Readiness(
        status="ready",
        model=service.embedder.model_name,
        dim=service.embedder.dim,
        collections=len(service.registry.names()),
    )
