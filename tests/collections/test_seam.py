"""The storage seam stays a seam: its rules, checked on the source.

``base.py`` holds the contracts and the shared types and imports no backend; a
search's pool is assembled in one place (``app.collections.pool``, from
``calibration.fusion.hybrid_pool``); the service reaches a collection's state only
through ``collection.state``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from app.collections.base import CollectionState

ROOT = Path(__file__).resolve().parents[2]
COLLECTIONS = ROOT / "app" / "collections"


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at run time or for type checking."""
    names: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def _calls(path: Path, name: str) -> list[int]:
    """Lines where ``path`` calls ``name`` (as a bare name or an attribute)."""
    return [
        node.lineno
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == name)
            or (isinstance(node.func, ast.Attribute) and node.func.attr == name)
        )
    ]


def test_the_seam_imports_no_backend():
    backends = {
        f"app.collections.{p.stem}"
        for p in COLLECTIONS.glob("*.py")
        if p.stem not in {"__init__", "base", "index", "snapshots"}
    }
    assert "app.collections.store" in backends  # the glob found the modules
    # ``snapshots`` only as a type: the one capability only the local backend has.
    assert _imported(COLLECTIONS / "base.py") & backends == set()


def test_a_pool_is_assembled_in_one_place():
    sources = [
        *ROOT.joinpath("app").rglob("*.py"),
        *ROOT.joinpath("calibration").rglob("*.py"),
    ]
    pools = {p.relative_to(ROOT).as_posix() for p in sources if _calls(p, "Pool")}
    merged = {
        p.relative_to(ROOT).as_posix() for p in sources if _calls(p, "candidate_pool")
    }
    assert pools == {"app/collections/pool.py"}
    assert merged == {"calibration/fusion.py"}


def test_the_service_reaches_state_only_through_collection_state():
    state = {
        name
        for name, member in vars(CollectionState).items()
        if callable(member) and not name.startswith("_")
    } | {"profile"}
    assert {"judgments_count", "add_calibrator", "log_queries"} <= state
    wrong = []
    for path in ROOT.joinpath("app", "services").glob("*.py"):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Attribute) and node.attr in state:
                if _is_collection(node.value):
                    wrong.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert wrong == []


def _is_collection(node: ast.expr) -> bool:
    """A ``collection`` variable, or a registry's ``get``/``get_compatible`` result."""
    if isinstance(node, ast.Name):
        return node.id == "collection"
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"get", "get_compatible"}
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "registry"
    )
