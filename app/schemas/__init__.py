"""Request and response models (``extra="forbid"`` on every request)."""

from __future__ import annotations
