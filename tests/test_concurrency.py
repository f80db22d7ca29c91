"""The keyed gate: so many holders per key, the rest wait (no thread), a bounded queue.

Pure asyncio logic: events synchronise, nothing is timed.
"""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from app.concurrency import KeyedGate
from app.exceptions import OverloadedError
from app.settings import Settings


async def _enter(gate: KeyedGate, key: str, inside: list[str], leave: asyncio.Event):
    async with gate.hold(key):
        inside.append(key)
        await leave.wait()


async def _settle() -> None:
    for _ in range(5):  # let every ready task run to its next await
        await asyncio.sleep(0)


def test_a_key_holds_at_most_its_places_and_others_pass():
    async def scenario() -> None:
        gate = KeyedGate(per_key=1, max_waiting=10)
        inside: list[str] = []
        leave = asyncio.Event()
        tasks = [
            asyncio.create_task(_enter(gate, key, inside, leave))
            for key in ("a", "a", "a", "b")
        ]
        await _settle()
        assert sorted(inside) == ["a", "b"]  # one "a" in, two wait; "b" passes
        leave.set()
        await asyncio.gather(*tasks)
        assert sorted(inside) == ["a", "a", "a", "b"]
        assert not gate._gates and not gate._users  # idle keys are forgotten

    asyncio.run(scenario())


def test_waiting_past_the_bound_is_overloaded_and_at_it_is_served():
    async def scenario() -> None:
        gate = KeyedGate(per_key=1, max_waiting=2)
        inside: list[str] = []
        leave = asyncio.Event()
        tasks = [
            asyncio.create_task(_enter(gate, "a", inside, leave)) for _ in range(3)
        ]
        await _settle()  # one holds, two wait: the bound
        with pytest.raises(OverloadedError) as caught:
            async with gate.hold("a"):
                pass
        assert caught.value.retry_after == 1
        async with gate.hold("b"):  # a free key never waits, so it is never refused
            pass
        leave.set()
        await asyncio.gather(*tasks)
        assert len(inside) == 3

    asyncio.run(scenario())


def test_a_cancelled_waiter_gives_its_place_back():
    async def scenario() -> None:
        gate = KeyedGate(per_key=1, max_waiting=10)
        inside: list[str] = []
        leave = asyncio.Event()
        holder = asyncio.create_task(_enter(gate, "a", inside, leave))
        waiter = asyncio.create_task(_enter(gate, "a", inside, leave))
        await _settle()
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert gate._waiting == 0 and gate._users == {"a": 1}
        leave.set()
        await holder
        assert not gate._users

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("field", "at", "past"),
    [
        ("filter_timeout_ms", 10, 9),
        ("filter_timeout_ms", 600_000, 600_001),
        ("filter_jobs_per_collection", 0, -1),
        ("filter_jobs_per_collection", 64, 65),
        ("lexical_build_wait_s", 0, -1),
        ("lexical_build_wait_s", 3600, 3601),
    ],
)
def test_the_bounds_of_work_settings_hold_at_the_bound_and_refuse_one_past(
    tmp_path, field: str, at: int, past: int
):
    assert getattr(Settings(data_dir=tmp_path, **{field: at}), field) == at
    with pytest.raises(ValidationError, match=field):
        Settings(data_dir=tmp_path, **{field: past})
