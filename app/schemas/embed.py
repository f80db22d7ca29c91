"""Schemas of ``POST /v1/embed``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.schemas.common import RequestModel, Text


class EmbedRequest(RequestModel):
    """Texts to embed."""

    texts: list[Text] = Field(min_length=1, description="texts to embed")
    input_type: Literal["query", "document"] = Field(
        "document", description="selects the model's prompt prefix for that side"
    )


class Embedding(BaseModel):
    """One text's embedding."""

    embedding: list[float] = Field(description="unit vector")
    norm: float = Field(description="raw norm before normalisation")
    n_tokens: int = Field(description="tokens the model saw")
    truncated: bool = Field(description="the text was cut at the model's length")


class EmbedResponse(BaseModel):
    """Embeddings in input order."""

    data: list[Embedding]
    model: str
    dim: int
