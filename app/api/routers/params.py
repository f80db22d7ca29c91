"""Path and query parameters shared by the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

from app.schemas.common import COLLECTION_NAME_PATTERN, DOCUMENT_ID_PATTERN

CollectionName = Annotated[
    str, Path(pattern=COLLECTION_NAME_PATTERN, description="collection name")
]
DocumentIdParam = Annotated[
    str, Path(pattern=DOCUMENT_ID_PATTERN, description="document id")
]
PageLimit = Annotated[
    int | None,
    Query(ge=1, description="at most limits.max_page_size; default 100 or that"),
]
PageCursor = Annotated[
    str | None, Query(description="next_cursor of the previous page")
]
