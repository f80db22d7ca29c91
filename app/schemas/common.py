"""Reusable constrained types and base models.

Numeric limits that operators may change (batch sizes, text length, ``k``) live in
``Settings.limits`` and are enforced by ``app.limits``; the types here only state what
is true of every request.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

# A text must contain something other than white space.
Text = Annotated[str, StringConstraints(min_length=1, pattern=r"\S")]
DocumentId = Annotated[
    str, StringConstraints(min_length=1, pattern=r"^[^\x00]*\S[^\x00]*$")
]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
MetadataScalar = str | int | float | bool | None
Metadata = dict[str, Any]


class RequestModel(BaseModel):
    """Base of request bodies: unknown fields are errors, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


class ListEnvelope(BaseModel):
    """Base of list responses: ``{"data": [...], "count": n}``."""

    count: int
