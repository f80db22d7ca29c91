r"""Reusable constrained types and base models.

Numeric limits that operators may change (batch sizes, text length, ``k``, metadata
depth) live in ``Settings.limits`` and are enforced by ``app.services.limits``; the types here
only state what is true of every request.

Strings: pydantic-core has to turn a string into UTF-8 to match a ``pattern``, so
every patterned field (``Text``, ``DocumentId``) already refuses a lone surrogate
(``"\ud800"``) with ``string_unicode``. Metadata and filters hold arbitrary JSON that
pydantic does not look into, so :func:`check_json` applies the same rule to them, along
with the rules SQLite's JSON functions need: finite numbers, 64-bit integers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints
from pydantic_core import PydanticCustomError

# SQLite stores integers as signed 64-bit; a larger Python int cannot be bound.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# A text must contain something other than white space.
Text = Annotated[str, StringConstraints(min_length=1, pattern=r"\S")]
# Not blank, and no NUL (C APIs, file names and logs cut a string at NUL).
DOCUMENT_ID_PATTERN = r"^[^\x00]*[^\s\x00][^\x00]*$"
DocumentId = Annotated[str, StringConstraints(pattern=DOCUMENT_ID_PATTERN)]
# Names become file names: letters, digits, '_' and '-', starting with a letter or
# digit. Declared here, with the wire types, so the schemas and the path parameters
# use it without loading storage; the registry checks the same pattern.
COLLECTION_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Metadata = dict[str, Any]


def _walk(value: object) -> Iterator[tuple[str, int, object]]:
    """Yield ``(path, depth, node)`` of every node of a JSON value, parents first.

    Iterative, so a value nested far deeper than the recursion limit is walked
    safely. A container is one deeper than its parent; a scalar has its parent's depth.
    """
    stack: list[tuple[str, int, object]] = [("", 0, value)]
    while stack:
        path, parent_depth, node = stack.pop()
        depth = parent_depth + 1 if isinstance(node, dict | list) else parent_depth
        yield path, depth, node
        if isinstance(node, dict):
            stack.extend((_join(path, k), depth, c) for k, c in node.items())
        elif isinstance(node, list):
            stack.extend((_join(path, i), depth, c) for i, c in enumerate(node))


def _join(path: str, key: object) -> str:
    """``path.key``, with a key that is not valid Unicode escaped (it goes in a message)."""
    label = str(key).encode("utf-8", "backslashreplace").decode()
    return f"{path}.{label}" if path else label


def _check_unicode(path: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PydanticCustomError(
            "string_unicode",
            "{path}: not valid Unicode (lone surrogate at position {position})",
            {"path": path or "value", "position": error.start},
        ) from None
    if "\x00" in text:
        raise _invalid(
            path,
            f"NUL character (U+0000) at position {text.find(chr(0))}: no key or "
            "string value may hold one (SQLite's JSON functions end a string there)",
        )


def _invalid(path: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(
        "json_value", "{path}: {message}", {"path": path or "value", "message": message}
    )


def check_json(value: object) -> object:
    r"""Refuse what JSON or SQLite's JSON functions cannot hold exactly, or return ``value``.

    A lone surrogate cannot be encoded, NaN and ±Infinity (and ``1e400``, which
    parses to infinity) are not JSON and come back as ``null``, and an int outside
    64 bits overflows SQLite. A NUL (U+0000) in a key or a string is refused too:
    SQLite's JSON functions end the string there, so ``"alice\u0000mallory"``
    would compare equal to ``"alice"`` in a filter (PostgreSQL's ``jsonb`` refuses
    it as well); every other control character is kept and compared exactly. Runs
    before type coercion, so ``2**63`` is refused rather than turned into a float.
    """
    for path, _, node in _walk(value):
        if isinstance(node, str):
            _check_unicode(path, node)
        elif isinstance(node, bool) or node is None:
            continue
        elif isinstance(node, int):
            if not INT64_MIN <= node <= INT64_MAX:
                raise _invalid(path, "integer outside the signed 64-bit range")
        elif isinstance(node, float):
            if not math.isfinite(node):
                raise _invalid(path, "number must be finite (no NaN or Infinity)")
        elif isinstance(node, dict):
            for key in node:
                if not isinstance(key, str):
                    raise _invalid(path, "object keys must be strings")
                _check_unicode(_join(path, key), key)
        elif not isinstance(node, list):
            raise _invalid(path, f"{type(node).__name__} is not a JSON value")
    return value


def json_depth(value: object) -> int:
    """Nesting depth of a JSON value: ``{"a": 1}`` is 1, ``{"a": [1]}`` is 2."""
    return max(depth for _, depth, _ in _walk(value))


# JSON that the store keeps and returns unchanged; the depth limit is in app.services.limits.
MetadataIn = Annotated[Metadata, BeforeValidator(check_json)]
# A filter's JSON; app.schemas.filters is its language, parsed within the limits.
Filter = Annotated[dict[str, Any], BeforeValidator(check_json)]
FILTER_DESCRIPTION = (
    "metadata filter: {key: value} equality, {key: {$eq|$ne|$in|$nin|$gt|$gte|"
    "$lt|$lte|$exists: ...}}, $and/$or (arrays of filters), $not (a filter); see "
    "docs/api.md (bounded by limits.max_filter_keys, max_filter_depth, "
    "max_filter_values, max_filter_value_chars)"
)


class RequestModel(BaseModel):
    """Base of request bodies: unknown fields are errors, and types are strict.

    Strict means no coercion on the wire: ``true`` is not 1 and ``"5"`` is not 5
    (an int is still accepted where a float is expected).
    """

    model_config = ConfigDict(extra="forbid", strict=True)


class ListEnvelope(BaseModel):
    """Base of list responses: ``{"data": [...], "count": n}``."""

    count: int


# A client's own embedding: finite numbers (the length and a non-zero norm are
# checked against the collection in app.services.own_vectors).
Vector = Annotated[
    list[Annotated[float, Field(allow_inf_nan=False)]], Field(min_length=1)
]
