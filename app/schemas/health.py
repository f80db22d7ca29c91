"""Schemas of liveness and readiness (``/healthz``, ``/readyz``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Health(BaseModel):
    """Liveness answer."""

    status: str


class UnavailableCollection(BaseModel):
    """A quarantined collection in the readiness detail."""

    name: str
    reason: str


class EmbeddingInfo(BaseModel):
    """How the model runs: backend, precision (and why), threads per forward pass."""

    backend: str = Field(description="NORMCAL_EMBEDDING_BACKEND: torch or onnx")
    precision: Literal["fp32", "mixed", "bf16"] = Field(
        description="the precision in use (NORMCAL_EMBED_PRECISION chose it)"
    )
    reason: str = Field(
        description="why: the setting, the CPU flag and the self-check's figures, or "
        "why bf16 was refused"
    )
    threads: int = Field(
        description="NORMCAL_EMBED_THREADS: intra-op threads per pass; 0 one per core"
    )


class Readiness(BaseModel):
    """Readiness answer: the model is loaded, the data dir is writable."""

    status: str = Field(
        description="ready, degraded (some collections unavailable, or fit jobs "
        "cannot be recorded) or not ready (503)"
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
    loading: list[str] | None = Field(
        None,
        description="collections the storage is still loading (Milvus after a "
        "restart): not ready until none is (omitted for anonymous callers)",
    )
    embedding: EmbeddingInfo | None = Field(
        None, description="how the model runs (omitted for anonymous callers)"
    )


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
    embedding: EmbeddingInfo
    profiles: list[ShippedProfileInfo]
