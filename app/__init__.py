"""normcal: a retrieval calibration service (FastAPI app, CLI, storage, embedding)."""

from __future__ import annotations

__version__ = "0.1.0"
