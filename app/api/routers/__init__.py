"""One router per resource."""

from __future__ import annotations
