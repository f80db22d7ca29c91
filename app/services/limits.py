"""Enforcement of the limits declared in ``Settings.limits``.

Each check raises :class:`LimitExceededError` (HTTP 422) naming the field, the limit
and the value; nothing has been written when it does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from app.exceptions import LimitExceededError
from app.schemas.common import json_depth
from app.settings import Limits


def check_count(field: str, items: Sequence[Any], limit: int) -> None:
    """Reject more than ``limit`` items."""
    if len(items) > limit:
        raise LimitExceededError(field, limit, len(items))


def check_filter(field: str, where: dict[str, Any] | None, limits: Limits) -> None:
    """Reject a metadata filter with more than ``limits.max_filter_keys`` keys.

    Each key is one condition of the query that applies the filter (SQL, Milvus).
    """
    check_count(field, list(where or ()), limits.max_filter_keys)


def check_texts(field: str, texts: Sequence[str], limits: Limits) -> None:
    """Reject any text longer than ``limits.max_text_chars`` characters."""
    for i, text in enumerate(texts):
        if len(text) > limits.max_text_chars:
            raise LimitExceededError(f"{field}.{i}", limits.max_text_chars, len(text))


def check_value(field: str, value: int, limit: int, *, rule: str | None = None) -> None:
    """Reject a number above ``limit`` (``rule`` says what was counted, and the limit)."""
    if value > limit:
        raise LimitExceededError(field, limit, value, rule=rule)


def check_metadata(field: str, metadata: dict[str, Any], limits: Limits) -> None:
    """Reject metadata nested deeper, or whose JSON encoding is larger, than the limits.

    Depth first: the store and the response serializer recurse into metadata, and a
    value too deep for them would be stored and then break every read of it.
    """
    check_value(f"{field} depth", json_depth(metadata), limits.max_metadata_depth)
    size = len(json.dumps(metadata, ensure_ascii=False).encode())
    if size > limits.max_metadata_bytes:
        raise LimitExceededError(field, limits.max_metadata_bytes, size)
