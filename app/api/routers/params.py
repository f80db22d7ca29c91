"""Path parameters shared by the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

from app.schemas.common import COLLECTION_NAME_PATTERN, DOCUMENT_ID_PATTERN

CollectionName = Annotated[
    str, Path(pattern=COLLECTION_NAME_PATTERN, description="collection name")
]
DocumentIdParam = Annotated[
    str, Path(pattern=DOCUMENT_ID_PATTERN, description="document id")
]
