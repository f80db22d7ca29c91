"""The arrows between the app's layers point where the layout says they do.

Wire schemas and path parameters load no model or index library (a client of the
schemas, or a tool generating OpenAPI, must not wait 2 s for faiss and sklearn);
``app.embedding`` loads no torch until a model is loaded; each router talks only to
its resource's part of the service (``app.services``), which knows no HTTP; the
service never reaches past a collection into its store or index.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import app.api.schemas

APP = Path(__file__).resolve().parents[1] / "app"
HEAVY = ("faiss", "torch", "sentence_transformers", "sklearn")


def _loaded_heavy(modules: list[str]) -> list[str]:
    """Heavy libraries in ``sys.modules`` after a fresh interpreter imports ``modules``."""
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(','.join(h for h in {HEAVY!r} if h in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    )
    return [m for m in out.stdout.strip().split(",") if m]


def test_schemas_and_path_params_load_no_heavy_library():
    schemas = [
        m.name
        for m in pkgutil.iter_modules(
            app.api.schemas.__path__, prefix="app.api.schemas."
        )
    ]
    assert "app.api.schemas.collections" in schemas  # the walk found the modules
    modules = ["app.api.schemas", *schemas, "app.api.routers.params"]
    assert _loaded_heavy(modules) == []


def test_embedding_package_loads_no_model_library():
    assert _loaded_heavy(["app.embedding"]) == []


def _attributes(path: Path) -> list[tuple[str, str, int]]:
    """``(object, attribute, line)`` of every ``name.attribute`` in a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.value.id, node.attr, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    ]


# The part of the service (``app.services.<part>``) each router calls: the layout
# answers "where does this request go" (``ServiceDep`` -> ``service.<part>``).
ROUTER_PARTS = {
    "calibrators.py": "calibrators",
    "fit_jobs.py": "calibrators",
    "collections.py": "collections",
    "snapshots.py": "collections",
    "documents.py": "documents",
    "search.py": "search",
    "judging.py": "judging",
    "embed.py": "system",
    "health.py": "system",
    "metrics.py": "system",
}


def _service_paths(path: Path) -> list[tuple[str, int]]:
    """``(dotted path, line)`` of every ``service.a`` and ``service.a.b`` in a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: dict[int, tuple[str, int]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        inner = node.value
        if isinstance(inner, ast.Name) and inner.id == "service":
            found.setdefault(id(node), (f"service.{node.attr}", node.lineno))
        elif (
            isinstance(inner, ast.Attribute)
            and isinstance(inner.value, ast.Name)
            and inner.value.id == "service"
        ):
            found[id(inner)] = (f"service.{inner.attr}.{node.attr}", node.lineno)
    return list(found.values())


@pytest.mark.parametrize(
    "path", sorted((APP / "api" / "routers").glob("*.py")), ids=lambda p: p.name
)
def test_routers_call_only_their_resources_use_cases(path: Path):
    part = ROUTER_PARTS.get(path.name)
    inner = {"context", "embedder", "registry", "pool", "batcher", "fit_jobs"}
    leaks = [
        f"{path.name}:{line} {dotted}"
        for dotted, line in _service_paths(path)
        if dotted.split(".")[1] != part or set(dotted.split(".")[2:]) & inner
    ]
    assert leaks == []


def test_every_router_that_uses_the_service_has_its_part():
    using = {
        p.name
        for p in (APP / "api" / "routers").glob("*.py")
        if "ServiceDep" in p.read_text()
    }
    assert using == set(ROUTER_PARTS)


def test_the_use_cases_know_no_http():
    http = ("fastapi", "starlette", "app.api.routers", "app.api.deps")
    leaks = [
        f"{p.name}: {name}"
        for p in sorted((APP / "services").glob("*.py"))
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
        )
        if name.startswith(http)
    ]
    assert leaks == []


def test_only_collections_touch_a_store_or_an_index():
    outside = [p for p in APP.rglob("*.py") if APP / "collections" not in p.parents]
    leaks = [
        f"{p.relative_to(APP)}:{line} {obj}.{attr}"
        for p in outside
        for obj, attr, line in _attributes(p)
        if attr in {"store", "_store", "index"} and obj != "np"
    ]
    assert leaks == []
