"""The blocking and the async client offer the same methods with the same parameters.

The blocking one is generated from the async one (``scripts/unasync.py``); this
checks what the generation must preserve, on the installed package.
"""

from __future__ import annotations

import inspect

from normcal_client import AsyncNormcalClient, NormcalClient

# What is named differently on purpose: the async way to close a client.
ASYNC_NAMES = {"close": "aclose", "__enter__": "__aenter__", "__exit__": "__aexit__"}


def methods(cls: type) -> dict[str, object]:
    return {
        name: member
        for name, member in vars(cls).items()
        if callable(member) and (not name.startswith("_") or name.startswith("__"))
    }


def test_every_method_has_its_twin_with_the_same_parameters():
    sync, asynchronous = methods(NormcalClient), methods(AsyncNormcalClient)
    assert {ASYNC_NAMES.get(n, n) for n in sync} == set(asynchronous)
    assert len(sync) > 50  # one per endpoint, and then some
    for name, method in sync.items():
        twin = asynchronous[ASYNC_NAMES.get(name, name)]
        ours, theirs = inspect.signature(method), inspect.signature(twin)
        assert [(p.name, p.kind) for p in ours.parameters.values()] == [
            (p.name, p.kind) for p in theirs.parameters.values()
        ], name
        assert [p.default for p in ours.parameters.values() if p.name != "sleep"] == [
            p.default for p in theirs.parameters.values() if p.name != "sleep"
        ], name
        assert (inspect.getdoc(method) is None) == (inspect.getdoc(twin) is None), name


def test_async_methods_are_awaitable_and_blocking_ones_are_not():
    for name, method in methods(NormcalClient).items():
        twin = methods(AsyncNormcalClient)[ASYNC_NAMES.get(name, name)]
        if name in ("__init__", "with_options", "from_env", "options"):
            continue
        assert not inspect.iscoroutinefunction(method), name
        if inspect.isgeneratorfunction(method):
            assert inspect.isasyncgenfunction(twin), name
        else:
            assert inspect.iscoroutinefunction(twin), name
