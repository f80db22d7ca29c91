"""Enforcement of the limits declared in ``Settings.limits``.

Each check raises :class:`LimitExceededError` (HTTP 422) naming the field, the limit
and the value; nothing has been written when it does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from app.exceptions import InvalidRequestError, LimitExceededError
from app.schemas.common import json_depth
from app.schemas.filters import Bounds, FilterBoundError, FilterError, Node, parse
from app.settings import Limits


def check_count(field: str, items: Sequence[Any], limit: int) -> None:
    """Reject more than ``limit`` items."""
    if len(items) > limit:
        raise LimitExceededError(field, limit, len(items))


def parse_filter(field: str, raw: dict[str, Any] | None, limits: Limits) -> Node:
    """The filter tree of ``raw`` within the declared bounds (no filter: match all).

    A filter outside the language is an :class:`InvalidRequestError`, one past a
    bound a :class:`LimitExceededError`; both name the JSON path
    (``filter.$and[1].year.$gt``).
    """
    bounds = Bounds(
        max_depth=limits.max_filter_depth,
        max_conditions=limits.max_filter_keys,
        max_values=limits.max_filter_values,
        max_chars=limits.max_filter_value_chars,
    )
    try:
        return parse(raw or {}, bounds, field)
    except FilterBoundError as error:
        raise LimitExceededError(
            error.path, error.limit, error.actual, rule=error.what
        ) from None
    except FilterError as error:
        raise InvalidRequestError(str(error), field=error.path) from None


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
