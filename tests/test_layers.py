"""The arrows between the app's layers point where the layout says they do.

``ls app`` is the architecture: each package (and the few foundation modules) is one
row of :data:`LAYERS`, and a module imports only its own package and rows below it.
So the back doors stay shut: nothing but the command line imports the HTTP layer
(services use ``app.schemas``, fit jobs get the error table's renderer passed in,
storage never reaches up for a schema), nothing imports the command line, and
observability, reports and wire models sit below everything that uses them.
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

import app.schemas

APP = Path(__file__).resolve().parents[1] / "app"
HEAVY = ("faiss", "torch", "sentence_transformers", "sklearn")


def _loaded_heavy(modules: list[str], then: str = "") -> list[str]:
    """Heavy libraries in ``sys.modules`` after a fresh interpreter imports ``modules``
    (and runs the statement ``then``)."""
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"{then}\n"
        f"print(','.join(h for h in {HEAVY!r} if h in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    )
    return [m for m in out.stdout.strip().split(",") if m]


@pytest.mark.slow  # starts a Python process
def test_schemas_and_path_params_load_no_heavy_library():
    schemas = [
        m.name
        for m in pkgutil.iter_modules(app.schemas.__path__, prefix="app.schemas.")
    ]
    assert "app.schemas.collections" in schemas  # the walk found the modules
    modules = ["app.schemas", *schemas, "app.api.routers.params"]
    assert _loaded_heavy(modules) == []


@pytest.mark.slow  # starts a Python process
def test_embedding_package_loads_no_model_library():
    assert _loaded_heavy(["app.embedding"]) == []


@pytest.mark.slow  # starts a Python process
def test_reading_a_beir_folder_for_ingest_loads_no_heavy_library(tmp_path):
    """``normcal ingest`` of a BEIR folder read it through ``app.cli.beir``, which
    imports scikit-learn (~2.3 s before the first request)."""
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d", "title": "", "text": "t"}\n')
    read = f"sys.modules['app.cli.inputs'].read_documents(__import__('pathlib').Path({str(tmp_path)!r}))"
    assert _loaded_heavy(["app.cli.main", "app.cli.inputs"], then=read) == []


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
    "rerank.py": "rerank",
    "judging.py": "judging",
    "embed.py": "system",
    "embeddings.py": "system",
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


# The layers, bottom first. A module may import its own package and any lower row,
# never its own row's other packages or a row above (type-only imports included).
LAYERS: list[tuple[str, set[str]]] = [
    ("foundation", {"app", "app.exceptions"}),
    ("configuration", {"app.settings", "app.concurrency"}),
    ("leaves: wire models, report rendering", {"app.schemas", "app.ui"}),
    ("engines", {"app.embedding", "app.collections", "app.profiles"}),
    ("infrastructure", {"app.observability"}),
    ("use cases", {"app.services"}),
    ("HTTP", {"app.api"}),
    ("command line", {"app.cli"}),
]
ROW = {unit: row for row, (_, units) in enumerate(LAYERS) for unit in units}


def _unit(module: str) -> str:
    """The row of the table a dotted ``app`` module belongs to: ``app.api.errors`` is
    ``app.api``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else "app"


def _app_imports(path: Path) -> list[tuple[str, int]]:
    """``(module, line)`` of every import of an ``app`` module, type-only ones too.

    ``from app import x`` counts as ``app.x`` when ``x`` is a module of the package.
    """
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                path = APP.parent / sub.replace(".", "/")
                is_module = path.with_suffix(".py").exists() or path.is_dir()
                found.append((sub if is_module else node.module, node.lineno))
    return [(m, line) for m, line in found if m == "app" or m.startswith("app.")]


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(APP.parent).with_suffix("").parts)


def _files(unit: str) -> list[Path]:
    """The source files of a row-table entry (a package's, recursively)."""
    if unit == "app":
        return [APP / "__init__.py"]
    path = APP.parent / unit.replace(".", "/")
    return sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]


def _imports_of(unit: str) -> list[tuple[str, str, int]]:
    """``(importing module, imported module, line)`` for every module of a unit."""
    return [
        (_module_of(p), target, line)
        for p in _files(unit)
        for target, line in _app_imports(p)
    ]


def test_ls_app_is_the_architecture():
    """Every package and module at the top of ``app/`` is a row of the table: no
    loose modules (fit jobs, limits, paging, the judging order live in the layer they
    serve), no ``ops`` mixing the command line with what the service runs on."""
    top = {
        f"app.{p.stem}"
        for p in APP.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py")
        or (p.is_dir() and (p / "__init__.py").exists())
    }
    assert top == set(ROW) - {"app"}


@pytest.mark.parametrize("unit", sorted(ROW), ids=str)
def test_imports_point_down_the_layers(unit: str):
    leaks = [
        f"{module}:{line} imports {target} ({LAYERS[ROW[_unit(target)]][0]})"
        for module, target, line in _imports_of(unit)
        if _unit(target) != unit and ROW[_unit(target)] >= ROW[unit]
    ]
    assert all(p.exists() for p in _files(unit)) and _files(unit)
    assert leaks == []


def _importers_outside(units: set[str], target: str) -> list[str]:
    return [
        f"{module}:{line} {imported}"
        for p in sorted(APP.rglob("*.py"))
        if _unit(_module_of(p).removesuffix(".__init__")) not in units
        for module in [_module_of(p)]
        for imported, line in _app_imports(p)
        if imported == target or imported.startswith(target + ".")
    ]


def test_only_the_command_line_uses_the_http_layer():
    """Services, fit jobs, storage and schemas never import ``app.api``: the use
    cases speak ``app.schemas``, and a failed job is described by the error table's
    renderer the HTTP layer hands to it (``app.api.errors.job_error``)."""
    assert _importers_outside({"app.api", "app.cli"}, "app.api") == []


def test_nothing_imports_the_command_line():
    assert _importers_outside({"app.cli"}, "app.cli") == []


def test_wire_schemas_live_outside_the_http_layer():
    assert not (APP / "api" / "schemas").exists()
    imported = {target for _, target, _ in _imports_of("app.schemas")}
    assert {_unit(t) for t in imported} <= {"app.schemas"}


def test_fit_jobs_record_errors_without_the_error_table():
    jobs = APP / "services" / "jobs.py"
    assert [t for t, _ in _app_imports(jobs) if _unit(t) == "app.api"] == []
    assert "job_error" in (APP / "api" / "errors.py").read_text()


def test_reports_and_observability_know_no_caller():
    """Report rendering uses only the maths; observability knows no use case, HTTP
    route module or command."""
    assert {_unit(t) for _, t, _ in _imports_of("app.ui")} <= {"app.ui"}
    above = {"app.services", "app.api", "app.cli"}
    assert {_unit(t) for _, t, _ in _imports_of("app.observability")} & above == set()


def test_calibration_imports_no_app_module():
    leaks = [
        f"{p.relative_to(APP.parent)}:{line} {target}"
        for p in sorted((APP.parent / "calibration").rglob("*.py"))
        for target, line in _app_imports(p)
    ]
    assert leaks == []
