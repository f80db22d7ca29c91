"""Liveness, readiness and version (outside ``/v1``).

``/readyz`` answers 503 when new data cannot be written (the data dir is read-only
or not writable); quarantined collections leave it at 200 (``status: "degraded"``)
because every healthy collection is served. When API keys are set, a caller
without one (or with a key scoped to some collections) learns only the status and
reasons that name no user data: no collection count, no collection names.
"""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.api.auth import READ, KeyDep
from app.api.deps import ServiceDep
from app.schemas.health import Health, Readiness, VersionInfo

router = APIRouter(tags=["health"])


@router.get("/healthz", dependencies=[READ])
def read_health() -> Health:
    """Liveness: the process serves HTTP."""
    return Health(status="ok")


@router.get(
    "/readyz",
    dependencies=[READ],
    responses={503: {"model": Readiness, "description": "not ready"}},
)
def read_readiness(key: KeyDep, response: Response, service: ServiceDep) -> Readiness:
    """Readiness: the model is loaded and the data dir is writable."""
    # The detail names collections: for a key that sees every one of them.
    full = key.role is not None and key.collections is None
    answer = service.system.readiness(detailed=full)
    if answer.status == "not ready":
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return answer


@router.get("/version", dependencies=[READ])
def read_version(service: ServiceDep) -> VersionInfo:
    """The normcal version, the serving model's identity and the shipped profiles.

    Not a health path: with an API key set it needs the key, as the model's path
    is the operator's business.
    """
    return service.system.version()
