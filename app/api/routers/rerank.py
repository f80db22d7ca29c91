"""``POST /v1/rerank``: calibrate another retriever's candidate list."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.auth import READ, KeyDep
from app.api.deps import ServiceDep
from app.api.errors import PROBLEM_RESPONSES
from app.exceptions import NotFoundError
from app.schemas.rerank import RerankRequest, RerankResponse

router = APIRouter(tags=["rerank"], responses=PROBLEM_RESPONSES)


@router.post("/rerank", dependencies=[READ])
async def rerank(
    *, body: RerankRequest, service: ServiceDep, key: KeyDep
) -> RerankResponse:
    """The candidates ordered by calibrated P(relevant), with intervals (Cohere's shape)."""
    # The collection is named in the body: a key scoped to others gets the 404 an
    # unknown collection gets (as a path's name does, app/api/auth.py).
    if body.collection is not None and not key.sees(body.collection):
        raise NotFoundError("collection", body.collection)
    return await service.rerank.rerank(body)
