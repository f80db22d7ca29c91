"""The blocking client is generated from the async one (``scripts/unasync.py``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "unasync.py"


def load_script():
    spec = importlib.util.spec_from_file_location("unasync", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_regenerating_the_blocking_client_changes_nothing():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_an_edit_of_the_generated_file_is_caught(tmp_path, monkeypatch):
    unasync = load_script()
    edited = tmp_path / "_sync_client.py"
    edited.write_text(unasync.TARGET.read_text().replace("Blocking", "Sync", 1))
    monkeypatch.setattr(unasync, "TARGET", edited)
    assert unasync.main(["--check"]) == 1
    assert unasync.main([]) == 0 and unasync.main(["--check"]) == 0


def test_the_rules_turn_async_code_into_its_blocking_twin():
    unasync = load_script()
    source = (
        '"""The async module."""\n'
        "async def lines(c: AsyncNormcalClient) -> AsyncIterator[str]:\n"
        "    async with c.stream() as response:\n"
        "        async for line in response.aiter_lines():\n"
        "            yield line\n"
        "    await c.aclose()\n"
    )
    assert unasync.unasync(source) == unasync.HEADER + (
        "def lines(c: NormcalClient) -> Iterator[str]:\n"
        "    with c.stream() as response:\n"
        "        yield from response.iter_lines()\n"
        "    c.close()\n"
    )
