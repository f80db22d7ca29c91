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


class ModelIdentity(BaseModel):
    """The serving model: its configured name and the identity of its files."""

    name: str = Field(description="the configured name (NORMCAL_MODEL_NAME)")
    id: str = Field(
        description="sha256 over the model's configs, tokenizer and weights: "
        "collections and shipped profiles are bound to it"
    )
    path: str = Field(description="the model directory (NORMCAL_MODEL_PATH)")


class ShippedProfileInfo(BaseModel):
    """A calibration profile that ships with the service."""

    name: str
    format: int = Field(description="version of the profile's JSON format")
    model_id: str | None = Field(
        description="identity of the model files it was fitted for; it applies to "
        "no other"
    )


class VersionInfo(BaseModel):
    """``GET /version``: what is serving."""

    normcal: str
    model: ModelIdentity
    profiles: list[ShippedProfileInfo]
