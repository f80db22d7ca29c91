"""The distribution's version: the one place it is written (pyproject reads it)."""

from __future__ import annotations

__version__ = "0.2.0"
