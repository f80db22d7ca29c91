"""``POST /v1/embeddings``: OpenAI's embeddings shape, with the raw norm."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.auth import READ
from app.api.deps import ServiceDep
from app.api.errors import PROBLEM_RESPONSES
from app.schemas.embed import EmbeddingsRequest, EmbeddingsResponse

router = APIRouter(prefix="/embeddings", tags=["embed"], responses=PROBLEM_RESPONSES)


@router.post("", dependencies=[READ])
async def create_openai_embeddings(
    *, body: EmbeddingsRequest, service: ServiceDep
) -> EmbeddingsResponse:
    """Embed texts in OpenAI's request and response shape (`norm` added).

    A pipeline written for OpenAI's embeddings API (or a client pointed at a base
    URL) takes its embeddings from normcal unchanged; the vectors are the unit
    vectors `/v1/embed` returns, `norm` their raw norm.
    """
    return await service.system.embeddings(body)
