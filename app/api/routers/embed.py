"""``POST /v1/embed``: unit vectors plus raw norms."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.auth import READ
from app.api.deps import ServiceDep
from app.api.errors import PROBLEM_RESPONSES
from app.schemas.embed import EmbedRequest, EmbedResponse

router = APIRouter(prefix="/embed", tags=["embed"], responses=PROBLEM_RESPONSES)


@router.post("", dependencies=[READ])
async def create_embeddings(
    *, body: EmbedRequest, service: ServiceDep
) -> EmbedResponse:
    """Embed texts; each gets its unit vector, raw norm and token count."""
    return await service.system.embed(body.texts, body.input_type)
