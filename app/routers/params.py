"""Path parameters shared by the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

from app.registry import COLLECTION_NAME_PATTERN

CollectionName = Annotated[
    str, Path(pattern=COLLECTION_NAME_PATTERN, description="collection name")
]
DocumentIdParam = Annotated[str, Path(min_length=1, description="document id")]
