"""The arrows between the app's layers point where the layout says they do.

Wire schemas and path parameters load no model or index library (a client of the
schemas, or a tool generating OpenAPI, must not wait 2 s for faiss and sklearn);
``app.embedding`` loads no torch until a model is loaded; routers talk only to the
service; the service never reaches past a collection into its store or index.
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


@pytest.mark.parametrize(
    "path", sorted((APP / "api" / "routers").glob("*.py")), ids=lambda p: p.name
)
def test_routers_use_only_the_service_methods(path: Path):
    inner = {"embedder", "registry", "pool", "metrics"}
    leaks = [
        f"{path.name}:{line} service.{attr}"
        for obj, attr, line in _attributes(path)
        if obj == "service" and attr in inner
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
