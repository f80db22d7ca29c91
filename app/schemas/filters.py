"""The metadata filter language: one parser into one typed tree, and its meaning.

A filter is a JSON object. Each key is a metadata key (top-level keys only: a ``.``
in a key is just a character) or a logical operator; the conditions of one object
all hold (an implicit ``$and``)::

    {"topic": "medicine"}                       equality (the original form)
    {"year": {"$gte": 2000, "$lt": 2010}}       operators on one key, all hold
    {"$or": [{"topic": "a"}, {"tags": {"$in": ["x", "y"]}}]}
    {"$not": {"draft": true}}    {"x": {"$exists": false}}

:func:`parse` turns that JSON into a tree of six node types (``$eq`` is a one-value
``$in``; ``$ne``, ``$nin`` and ``$exists: false`` are a :class:`Not` of the positive
form) within declared :class:`Bounds`, naming the JSON path of any error
(``filter.$and[1].year.$gt``). :func:`evaluate` is the meaning, in pure Python:
both storage backends translate the tree and must agree with it.

Semantics: equality keeps JSON types apart (``true`` is not ``1``, ``"1"`` is not
``1``; ``1`` equals ``1.0``); ``null`` equals only a present ``null``; an array or
object value equals nothing and orders with nothing (only ``$exists`` sees it).
``$gt`` and friends compare numbers with numbers and strings with strings (by code
point); a missing key or a value of another type makes them false. ``$ne``, ``$nin``
and ``$not`` are plain negations, so they match documents without the key (as in
MongoDB). Free of pydantic and of every backend, so the storage layers, the
service and the tests share it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Scalar = str | int | float | bool | None
Ordered = str | int | float  # never a bool
Comparison = Literal["$gt", "$gte", "$lt", "$lte"]
COMPARE: dict[Comparison, Callable[[Any, Any], bool]] = {
    "$gt": operator.gt,
    "$gte": operator.ge,
    "$lt": operator.lt,
    "$lte": operator.le,
}
SYMBOL: dict[Comparison, str] = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
LOGICAL = ("$and", "$or", "$not")
FIELD_OPERATORS = ("$eq", "$ne", "$in", "$nin", *COMPARE, "$exists")


@dataclass(frozen=True)
class In:
    """``key`` is present and equals one of ``values`` (``$eq``, ``$in``)."""

    key: str
    values: tuple[Scalar, ...]


@dataclass(frozen=True)
class Compare:
    """``key`` holds a value of ``value``'s kind (number or string) ordered as ``op``."""

    key: str
    op: Comparison
    value: Ordered


@dataclass(frozen=True)
class Exists:
    """``key`` is present (with any value, ``null`` included)."""

    key: str


@dataclass(frozen=True)
class And:
    """Every part holds (none: true)."""

    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    """Some part holds."""

    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Not:
    """``part`` does not hold."""

    part: Node


Node = In | Compare | Exists | And | Or | Not
MATCH_ALL: Node = And(())


@dataclass(frozen=True)
class Bounds:
    """How large a filter may be (``Settings.limits`` supplies them)."""

    max_depth: int = 8  # nesting of $and / $or / $not (a flat filter is depth 1)
    max_conditions: int = 64  # key conditions plus logical operators, as written
    max_values: int = 256  # values of one $in / $nin list
    max_chars: int = 4096  # characters of one key or string value


class FilterError(ValueError):
    """A filter that is not in the language; ``path`` names where (``filter.$or[0]``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


class FilterBoundError(FilterError):
    """A filter past one of its :class:`Bounds` (``what`` says which)."""

    def __init__(self, path: str, what: str, limit: int, actual: int) -> None:
        super().__init__(path, f"{actual} {what} exceeds the limit of {limit}")
        self.what = what
        self.limit = limit
        self.actual = actual


def parse(raw: object, bounds: Bounds, path: str = "filter") -> Node:
    """The tree of filter ``raw`` (JSON already decoded), or :class:`FilterError`."""
    return _Parser(bounds).node(raw, path, 1)


class _Parser:
    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.conditions = 0

    def count(self, path: str) -> None:
        self.conditions += 1
        if self.conditions > self.bounds.max_conditions:
            raise FilterBoundError(
                path, "conditions", self.bounds.max_conditions, self.conditions
            )

    def node(self, raw: object, path: str, depth: int) -> Node:
        if depth > self.bounds.max_depth:
            raise FilterBoundError(path, "levels", self.bounds.max_depth, depth)
        if not isinstance(raw, Mapping):
            raise FilterError(path, f"a filter is an object, not {_kind(raw)}")
        parts = [self.entry(str(k), v, f"{path}.{k}", depth) for k, v in raw.items()]
        return parts[0] if len(parts) == 1 else And(tuple(parts))

    def entry(self, key: str, value: object, path: str, depth: int) -> Node:
        if key in ("$and", "$or"):
            self.count(path)
            if not isinstance(value, list) or not value:
                raise FilterError(path, f"{key} takes a non-empty array of filters")
            parts = tuple(
                self.node(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)
            )
            return And(parts) if key == "$and" else Or(parts)
        if key == "$not":
            self.count(path)
            return Not(self.node(value, path, depth + 1))
        if key.startswith("$"):
            raise FilterError(
                path,
                f"unknown operator {key!r} here (logical: {', '.join(LOGICAL)}; "
                "the others go inside a key's object)",
            )
        self.string(key, path)
        if isinstance(value, Mapping):
            if not value:
                raise FilterError(path, "an operator object needs an operator")
            ops = [
                self.operator(key, str(op), v, f"{path}.{op}")
                for op, v in value.items()
            ]
            return ops[0] if len(ops) == 1 else And(tuple(ops))
        return self.operator(key, "$eq", value, path)

    def operator(self, key: str, op: str, value: object, path: str) -> Node:
        self.count(path)
        if op in ("$eq", "$ne"):
            node: Node = In(key, (self.scalar(value, path),))
            return node if op == "$eq" else Not(node)
        if op in ("$in", "$nin"):
            if not isinstance(value, list):
                raise FilterError(path, f"{op} takes an array, not {_kind(value)}")
            if len(value) > self.bounds.max_values:
                raise FilterBoundError(
                    path, "values", self.bounds.max_values, len(value)
                )
            values = tuple(self.scalar(v, f"{path}[{i}]") for i, v in enumerate(value))
            return In(key, values) if op == "$in" else Not(In(key, values))
        if op in COMPARE:
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise FilterError(
                    path, f"{op} compares a number or a string, not {_kind(value)}"
                )
            return Compare(key, op, self.scalar(value, path))  # type: ignore[arg-type]
        if op == "$exists":
            if not isinstance(value, bool):
                raise FilterError(
                    path, f"$exists takes true or false, not {_kind(value)}"
                )
            return Exists(key) if value else Not(Exists(key))
        raise FilterError(
            path, f"unknown operator {op!r} (known: {', '.join(FIELD_OPERATORS)})"
        )

    def scalar(self, value: object, path: str) -> Scalar:
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, str):
            return self.string(value, path)
        raise FilterError(
            path,
            f"a filter value is a string, number, boolean or null, not {_kind(value)}",
        )

    def string(self, text: str, path: str) -> str:
        if len(text) > self.bounds.max_chars:
            raise FilterBoundError(path, "characters", self.bounds.max_chars, len(text))
        return text


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def is_number(value: object) -> bool:
    """A JSON number (a bool is not one)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def equal(have: object, want: Scalar) -> bool:
    """JSON equality of a stored value and a filter value, types kept apart."""
    if want is None or isinstance(want, bool):
        return have is want
    if isinstance(want, str):
        return isinstance(have, str) and have == want
    return is_number(have) and have == want


def evaluate(node: Node, metadata: Mapping[str, Any]) -> bool:
    """Whether ``metadata`` matches ``node``: the meaning of the language."""
    if isinstance(node, In):
        return node.key in metadata and any(
            equal(metadata[node.key], v) for v in node.values
        )
    if isinstance(node, Compare):
        have = metadata.get(node.key)
        same_kind = (
            isinstance(have, str) if isinstance(node.value, str) else is_number(have)
        )
        return same_kind and COMPARE[node.op](have, node.value)
    if isinstance(node, Exists):
        return node.key in metadata
    if isinstance(node, And):
        return all(evaluate(p, metadata) for p in node.parts)
    if isinstance(node, Or):
        return any(evaluate(p, metadata) for p in node.parts)
    return not evaluate(node.part, metadata)
