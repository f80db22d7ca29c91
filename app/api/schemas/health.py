"""Schemas of liveness and readiness (``/healthz``, ``/readyz``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Health(BaseModel):
    """Liveness answer."""

    status: str


class UnavailableCollection(BaseModel):
    """A quarantined collection in the readiness detail."""

    name: str
    reason: str


class Readiness(BaseModel):
    """Readiness answer: the model is loaded, the data dir is writable."""

    status: str = Field(
        description="ready, degraded (some collections unavailable) or not ready (503)"
    )
    model: str
    dim: int
    reasons: list[str] = Field(default_factory=list, description="why not ready")
    collections: int | None = Field(
        None,
        description="collections served (omitted for anonymous callers "
        "when an API key is set)",
    )
    unavailable: list[UnavailableCollection] | None = None
