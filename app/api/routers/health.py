"""Liveness and readiness (outside ``/v1``).

``/readyz`` answers 503 when new data cannot be written (the data dir is read-only
or not writable); quarantined collections leave it at 200 (``status: "degraded"``)
because every healthy collection is served. When an API key is set, a caller
without it learns only the status and reasons that name no user data: no
collection count, no collection names.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status
from pydantic import BaseModel, Field

from app.api.auth import token_matches
from app.api.deps import ServiceDep

router = APIRouter(tags=["health"])


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


@router.get("/healthz")
def read_health() -> Health:
    """Liveness: the process serves HTTP."""
    return Health(status="ok")


@router.get(
    "/readyz",
    responses={503: {"model": Readiness, "description": "not ready"}},
)
def read_readiness(
    request: Request, response: Response, service: ServiceDep
) -> Readiness:
    """Readiness: the model is loaded and the data dir is writable."""
    registry = service.registry
    storage = registry.storage_problem()
    broken = registry.unavailable()
    key = service.settings.api_key
    full = key is None or token_matches(
        request.headers.get("authorization", "").encode() or None,
        key.get_secret_value().encode(),
    )
    reasons: list[str] = []
    if storage is not None:
        reasons.append(storage if full else "the data dir is not writable")
    if broken:
        reasons.append(f"{len(broken)} collection(s) unavailable")
    state = "not ready" if storage else "degraded" if broken else "ready"
    if storage is not None:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    answer = Readiness(
        status=state,
        model=service.embedder.model_name,
        dim=service.embedder.dim,
        reasons=reasons,
    )
    if full:
        answer.collections = len(registry.names())
        answer.unavailable = [
            UnavailableCollection(name=u.name, reason=u.reason) for u in broken
        ]
    return answer
