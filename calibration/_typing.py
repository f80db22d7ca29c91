"""Shared type aliases for the calibration package."""

from __future__ import annotations

from typing import Literal, TypeAlias

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray: TypeAlias = NDArray[np.float64]
IntArray: TypeAlias = NDArray[np.int64]
BoolArray: TypeAlias = NDArray[np.bool_]

Regime: TypeAlias = Literal["confidence", "conflict", "flat"]
PriorWidth: TypeAlias = Literal["auto", "fixed", "tight", "wide", "none"]
MethodName: TypeAlias = Literal["platt", "isotonic", "nt", "nt-list", "prior"]
BinStrategy: TypeAlias = Literal["uniform", "quantile"]

__all__ = [
    "ArrayLike",
    "BinStrategy",
    "BoolArray",
    "FloatArray",
    "IntArray",
    "MethodName",
    "PriorWidth",
    "Regime",
]
