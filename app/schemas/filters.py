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
"""The tree of ``{}``: no condition (a search's "no filter")."""


@dataclass(frozen=True)
class Bounds:
    """How large a filter may be (``Settings.limits`` supplies them)."""

    max_depth: int = 8  # nesting of $and / $or / $not (a flat filter is depth 1)
    max_conditions: int = 64  # key conditions plus logical operators, as written
    max_values: int = 256  # values of one $in / $nin list
    max_chars: int = 4096  # characters of one key or string value


NUL_REFUSED = (
    "holds a NUL character (U+0000), which no key or string value may hold: "
    "SQLite's JSON functions end a string there"
)


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
        if not raw and depth > 1:
            raise FilterError(
                path,
                "an empty filter matches every document: remove it (to delete "
                'every document, send "all": true instead of a filter)',
            )
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
        if "\x00" in text:
            raise FilterError(path, NUL_REFUSED)
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


def always(node: Node) -> bool | None:
    """Whether ``node`` matches every metadata (True), none (False) or it depends (None).

    As far as cheap rules tell. Sound, not complete: True and False are proofs (a
    delete refuses a filter that is True of everything without ``"all": true``),
    None only "not recognised". The
    rules work on the tree with its negations pushed to the conditions (``$not`` of
    an ``$and`` is an ``$or`` of ``$not``) and nested ``$and``/``$or`` flattened:

    - an empty ``$in`` matches nothing, so an empty ``$nin`` matches everything;
    - a conjunction is false when one part is and true when every part is (no part:
      true), a disjunction the other way round;
    - a conjunction is false when two of its conditions exclude each other: a
      condition and its negation; ``$in S`` and ``$in T`` of one key with no value
      in common; ``$in S`` and ``$nin T`` with S within T; ``$in`` or a comparison
      and ``$exists: false``; a comparison with a string and one with a number;
      ``$in S`` and a comparison no value of S passes; and a disjunction each
      option of which excludes another part. A disjunction is true when its
      negation, a conjunction, is false (``$nin S`` or ``$in T`` with S within T;
      ``$ne 1`` or ``$ne 2``; ``a`` or ``b`` or not both).

    A comparison is never true of everything (a missing key fails it), and values
    are equal as :func:`equal` says (``1`` is ``1.0``, ``true`` is not ``1``).
    """
    return _truth(node, positive=True)


Signed = tuple[Node, bool]  # a condition (or an opposite junction) and whether it holds


def _strip(node: Node, positive: bool) -> Signed:
    while isinstance(node, Not):
        node, positive = node.part, not positive
    return node, positive


def _truth(node: Node, *, positive: bool) -> bool | None:
    node, positive = _strip(node, positive)
    if isinstance(node, And | Or):
        conjunction = isinstance(node, And) == positive
        parts = _flat(node, positive, conjunction)
        decided = [_truth(p, positive=s) for p, s in parts]
        if any(d is not conjunction and d is not None for d in decided):
            return not conjunction  # a false part of a conjunction, a true one of a
        if all(d is conjunction for d in decided):  # disjunction; all the other way
            return conjunction
        # A disjunction is true when its negation, a conjunction, is false.
        exclusive = _excluding(parts if conjunction else [(p, not s) for p, s in parts])
        return None if not exclusive else not conjunction
    if isinstance(node, In) and not node.values:
        return not positive
    return None


def _flat(node: And | Or, positive: bool, conjunction: bool) -> list[Signed]:
    """The parts of a junction, those that are junctions of the same kind opened."""
    out: list[Signed] = []
    for part in node.parts:
        inner, sign = _strip(part, positive)
        if (
            isinstance(inner, And | Or)
            and (isinstance(inner, And) == sign) == conjunction
        ):
            out.extend(_flat(inner, sign, conjunction))
        else:
            out.append((inner, sign))
    return out


def _excluding(parts: list[Signed]) -> bool:
    """Whether the conjunction of ``parts`` cannot hold.

    Two parts clash, or one part is a disjunction each option of which clashes
    with another part (``a`` and ``b`` and not both: one step of resolution).
    """
    if any(_clash(a, b) for i, a in enumerate(parts) for b in parts[i + 1 :]):
        return True
    for part in parts:
        node, sign = part
        if isinstance(node, And | Or) and isinstance(node, And) != sign:
            others = [p for p in parts if p is not part]
            options = _flat(node, sign, conjunction=False)
            if all(any(_clash(o, other) for other in others) for o in options):
                return True
    return False


def _clash(a: Signed, b: Signed) -> bool:
    """Whether ``a`` and ``b`` cannot both hold.

    A part and its negation, or two conditions of one key that exclude each other.
    """
    (x, x_holds), (y, y_holds) = a, b
    if repr(x) == repr(y):  # not ==, for which true is 1: In(a, (true,)) != In(a, (1,))
        return x_holds != y_holds
    conditions = In | Compare | Exists
    if isinstance(x, conditions) and isinstance(y, conditions) and x.key == y.key:
        return _exclude(a, b)
    return False


def _exclude(a: Signed, b: Signed) -> bool:
    """Whether conditions ``a`` and ``b`` of one key cannot both hold."""
    (x, x_holds), (y, y_holds) = sorted((a, b), key=lambda s: not s[1])
    if not x_holds:  # two negations: both hold of a missing key
        return False
    if not y_holds and isinstance(y, Exists):  # x needs the key, which is missing
        return True
    if isinstance(x, In) and isinstance(y, In):
        mine, theirs = _values(x), _values(y)
        return not mine & theirs if y_holds else mine <= theirs
    if isinstance(x, Compare) and isinstance(y, Compare) and y_holds:
        return isinstance(x.value, str) != isinstance(y.value, str)
    if isinstance(x, In) and isinstance(y, Compare) and y_holds:
        return not any(evaluate(y, {y.key: v}) for v in x.values)
    return False


def _values(node: In) -> set[tuple[str, Scalar]]:
    """``node``'s values, equal where :func:`equal` says so (``1`` and ``1.0``)."""
    return {(_kind(v), v) for v in node.values}
