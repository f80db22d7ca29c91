"""``POST /v1/rerank``: calibrate another retriever's candidate list."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import ServiceDep
from app.api.errors import PROBLEM_RESPONSES
from app.schemas.rerank import RerankRequest, RerankResponse

router = APIRouter(tags=["rerank"], responses=PROBLEM_RESPONSES)


@router.post("/rerank")
async def rerank(*, body: RerankRequest, service: ServiceDep) -> RerankResponse:
    """The candidates ordered by calibrated P(relevant), with intervals (Cohere's shape)."""
    return await service.rerank.rerank(body)
