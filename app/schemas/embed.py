"""Schemas of ``POST /v1/embed``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

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


# ``POST /v1/embeddings``: the OpenAI shape, so an OpenAI client (or a pipeline built
# on one) takes its embeddings from normcal unchanged.


def _as_texts(value: object) -> object:
    """One text becomes a list of one; anything but texts gets one clear refusal.

    OpenAI also takes token ids, which mean nothing to this model's tokenizer.
    """
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise PydanticCustomError(
            "string_type",
            "a text or a list of texts (token ids are not accepted: normcal's "
            "model has its own tokenizer)",
        )
    return texts


_TEXT_SCHEMA = {"type": "string", "minLength": 1, "pattern": r"\S"}
# A text or a list of texts on the wire (the schema says so); a list to the service.
EmbeddingsInput = Annotated[
    list[Text],
    BeforeValidator(_as_texts),
    Field(min_length=1),
    WithJsonSchema(
        {
            "anyOf": [
                _TEXT_SCHEMA,
                {"type": "array", "items": _TEXT_SCHEMA, "minItems": 1},
            ]
        }
    ),
]


class EmbeddingsRequest(RequestModel):
    """Texts to embed, in OpenAI's shape; ``input_type`` is normcal's own."""

    input: EmbeddingsInput = Field(
        description="a text or a non-empty list of texts (token-id arrays are not "
        "accepted: this model has its own tokenizer)"
    )
    model: str | None = Field(
        None,
        description="the serving model's name (e.g. sentence-transformers/"
        "all-MiniLM-L6-v2, or the part after its last '/') or its identity "
        "(GET /version); another model's name is refused, never answered with "
        "this model's vectors",
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float",
        description="float: a list of numbers; base64: the little-endian float32 "
        "bytes, base64-encoded (what OpenAI's client asks for by default)",
    )
    dimensions: int | None = Field(
        None, description="accepted only when it equals the model's dimension"
    )
    user: str | None = Field(
        None, max_length=256, description="accepted for compatibility and ignored"
    )
    input_type: Literal["query", "document"] = Field(
        "document", description="selects the model's prompt prefix for that side"
    )


class EmbeddingsItem(BaseModel):
    """One text's embedding, OpenAI's fields plus the raw norm."""

    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str = Field(
        description="the unit vector (base64 of its float32 bytes when asked)"
    )
    index: int = Field(description="position of the text in the input")
    norm: float = Field(description="raw norm before normalisation")
    truncated: bool = Field(description="the text was cut at the model's length")


class EmbeddingsUsage(BaseModel):
    """Tokens the model read (after truncation, special tokens included)."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    """Embeddings in input order, in OpenAI's shape."""

    object: Literal["list"] = "list"
    data: list[EmbeddingsItem]
    model: str
    usage: EmbeddingsUsage
