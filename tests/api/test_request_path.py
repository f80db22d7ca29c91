"""What every request pays: no dependency hands the request to a worker thread.

FastAPI runs a dependency that is a plain function in anyio's worker threads: a
hand-off to another thread and back, on every request of every route that has it,
each a wake-up that waits for a core on a busy machine (docs/performance.md, "The
per-request floor"). Every dependency of the app is ``async``; a new plain one fails
here.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, iter_route_contexts

from app.api.app import create_app
from app.settings import Settings

pytestmark = pytest.mark.fake_embedder


def _dependencies(dependant: Dependant) -> Iterator[Dependant]:
    for sub in dependant.dependencies:
        yield sub
        yield from _dependencies(sub)


def _runs_on_the_loop(call: object) -> bool:
    return inspect.iscoroutinefunction(call) or inspect.iscoroutinefunction(
        getattr(call, "__call__", None)  # noqa: B004 - a class instance's method
    )


def _calls(app: FastAPI) -> Iterator[tuple[str, object]]:
    """Every route's path and each dependency it runs: the app's, routers', own."""
    for context in iter_route_contexts(app.routes):
        if not isinstance(context.route, APIRoute):
            continue  # the framework's own (the schema): no dependencies
        for depends in context.dependencies:  # the app's and its routers'
            yield context.path, depends.dependency
        for dep in _dependencies(context.route.dependant):
            yield context.path, dep.call


def test_every_dependency_of_every_route_runs_on_the_event_loop(tmp_path):
    app = create_app(Settings(data_dir=tmp_path))
    calls = list(_calls(app))
    searched = {call for path, call in calls if path.endswith("/{name}/search")}
    assert len(searched) >= 4  # unknown query, bearer, role, service
    plain = sorted(
        {
            f"{path}: {getattr(call, '__qualname__', call)}"
            for path, call in calls
            if call is not None and not _runs_on_the_loop(call)
        }
    )
    assert plain == []


def test_a_plain_dependency_would_be_found():
    def plain(x: int = 0) -> int:
        return x

    async def coroutine(x: int = 0) -> int:
        return x

    assert not _runs_on_the_loop(plain)
    assert _runs_on_the_loop(coroutine)
