"""Input validation shared by the calibration modules (private)."""

from __future__ import annotations

from typing import Any

import numpy as np

from calibration._typing import ArrayLike, FloatArray, IntArray
from calibration.exceptions import (
    InsufficientDataError,
    InvalidInputError,
    SingleClassError,
)


def as_float_1d(values: ArrayLike, name: str) -> FloatArray:
    """Return ``values`` as a finite 1-D float64 array or raise InvalidInputError."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{name} must be numeric.", field=name) from exc
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise InvalidInputError(
            f"{name} must be one-dimensional, got shape {arr.shape}.", field=name
        )
    if not np.all(np.isfinite(arr)):
        raise InvalidInputError(f"{name} contains NaN or infinite values.", field=name)
    return arr


def as_float_2d(values: ArrayLike, name: str, min_columns: int = 1) -> FloatArray:
    """Return ``values`` as a finite 2-D float64 array with enough columns."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{name} must be numeric.", field=name) from exc
    if arr.ndim == 1 and min_columns == 1:
        arr = arr.reshape(-1, 1)
    if arr.ndim != 2:
        raise InvalidInputError(
            f"{name} must be a 2-D matrix (n_pairs, n_features), got shape "
            f"{arr.shape}.",
            field=name,
        )
    if arr.shape[1] < min_columns:
        raise InvalidInputError(
            f"{name} needs at least {min_columns} feature columns, got {arr.shape[1]}.",
            field=name,
        )
    if arr.shape[0] == 0:
        raise InvalidInputError(f"{name} is empty.", field=name)
    if not np.all(np.isfinite(arr)):
        raise InvalidInputError(f"{name} contains NaN or infinite values.", field=name)
    return arr


def as_labels(y: ArrayLike, n: int, *, allow_single_class: bool = False) -> FloatArray:
    """Return binary labels as float64 0/1 of length ``n``."""
    arr = as_float_1d(y, "y")
    if arr.shape[0] != n:
        raise InvalidInputError(
            f"y has {arr.shape[0]} labels but X has {n} rows.", field="y"
        )
    if not np.all((arr == 0.0) | (arr == 1.0)):
        raise InvalidInputError("y must contain only 0 and 1.", field="y")
    if not allow_single_class and (arr.min() == arr.max()):
        raise SingleClassError(
            f"All {n} labels are {int(arr[0])}; judgments must include both "
            "relevant and non-relevant hits.",
            label=int(arr[0]),
            n_pairs=n,
        )
    return arr


def as_groups(groups: ArrayLike | None, n: int) -> IntArray:
    """Return integer query codes of length ``n``; ``None`` means one query per row."""
    if groups is None:
        return np.arange(n, dtype=np.int64)
    arr: Any = np.asarray(groups)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise InvalidInputError(
            f"groups must be one query id per row ({n}), got shape {arr.shape}.",
            field="groups",
        )
    _, codes = np.unique(arr, return_inverse=True)
    return np.asarray(codes, dtype=np.int64).reshape(-1)


def require_queries(n_queries: int, required: int, what: str) -> None:
    """Raise InsufficientDataError when fewer than ``required`` queries are given."""
    if n_queries < required:
        raise InsufficientDataError(
            f"{what} needs at least {required} labelled queries, got {n_queries}.",
            n_queries=n_queries,
            required=required,
        )
