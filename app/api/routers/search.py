"""``POST /v1/collections/{name}/search``."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.auth import READ
from app.api.deps import ServiceDep
from app.api.errors import PROBLEM_RESPONSES
from app.api.routers.params import CollectionName
from app.schemas.search import BatchSearchResponse, SearchRequest, SearchResult

router = APIRouter(
    prefix="/collections/{name}", tags=["search"], responses=PROBLEM_RESPONSES
)


@router.post("/search", dependencies=[READ])
async def search_collection(
    *, name: CollectionName, body: SearchRequest, service: ServiceDep
) -> SearchResult | BatchSearchResponse:
    """Top-k documents by cosine, with norms (and probabilities once calibrated)."""
    results = await service.search.search(name, body)
    if body.queries is None and body.vectors is None:  # one query (or vector)
        return results[0]
    return BatchSearchResponse(results=results)
