"""Storage unit tests: random unit vectors stand in for embeddings (no model)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from app.collections.base import NewDocument
from app.collections.store import CollectionStore
from app.collections.store_files import build_store
from app.schemas.filters import Bounds, Node, parse

DIM = 8


def unit_vectors(n: int, seed: int = 0) -> NDArray[np.float32]:
    """``n`` random unit vectors of dimension :data:`DIM`."""
    z = np.random.default_rng(seed).standard_normal((n, DIM))
    return (z / np.linalg.norm(z, axis=1, keepdims=True)).astype(np.float32)


def new_docs(ids: list[str], seed: int = 0, **metadata: Any) -> list[NewDocument]:
    """Documents with distinct random vectors; ``norm`` and ``n_tokens`` follow the
    position so that a test can tell them apart."""
    vectors = unit_vectors(len(ids), seed)
    return [
        NewDocument(
            id=doc_id,
            text=f"text of {doc_id}",
            metadata=dict(metadata),
            vector=vectors[i],
            norm=1.0 + i,
            n_tokens=3 + i,
            truncated=False,
        )
        for i, doc_id in enumerate(ids)
    ]


def where(raw: dict[str, Any]) -> Node:
    """The filter tree of ``raw`` (bounds but for long strings: not tested here)."""
    return parse(raw, Bounds(max_chars=1 << 20))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CollectionStore]:
    """A new, empty collection file (no fsync: durability is tested elsewhere)."""
    path = tmp_path / "kb.sqlite3"
    meta = {"name": "kb", "model": "m", "dim": DIM, "created_at": 0.0}
    build_store(path, meta, synchronous="OFF")
    opened = CollectionStore(path, synchronous="OFF")
    yield opened
    opened.close()
