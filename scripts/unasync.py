"""Generate the blocking client from the async one: ``python scripts/unasync.py``.

``clients/python/src/normcal_client/_async_client.py`` is the source; this writes
``_sync_client.py`` beside it by deleting ``async``/``await`` and renaming the async
names below (whole words, docstrings included), then sorting imports and formatting
with ruff, the way ``make fmt`` would. ``--check`` writes nothing and exits 1 when
the generated file is not what is committed (``tests/client/test_unasync.py``).

The direction is the one unasync and httpcore use: removing ``await`` is mechanical,
adding it is not (nothing in blocking code says which calls would wait).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "clients/python/src/normcal_client"
SOURCE = PACKAGE / "_async_client.py"
TARGET = PACKAGE / "_sync_client.py"

HEADER = '''"""The blocking client, generated from ``_async_client.py``: do not edit.

Edit the async client and run ``python scripts/unasync.py``; a test fails when
this file is not what the script writes.
"""
'''

# Whole-word replacements, in order; the keyword deletions come first.
RENAMES = [
    (r"\basync (def|with|for) ", r"\1 "),
    (r"\bawait ", ""),
    (r"\bAsyncNormcalClient\b", "NormcalClient"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\basynccontextmanager\b", "contextmanager"),
    (r"\bAsyncBaseTransport\b", "BaseTransport"),
    (r"\bAsyncClient\b", "Client"),
    (r"\bAsyncSleep\b", "Sleep"),
    (r"\basyncio\b", "time"),
    (r"\bAsync client\b", "Blocking client"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\baclose\b", "close"),
    (r"\baread\b", "read"),
    (r"\baiter_lines\b", "iter_lines"),
    (r"\baiter_bytes\b", "iter_bytes"),
]


def unasync(source: str) -> str:
    """The blocking twin of the async module ``source``, before formatting."""
    docstring = re.match(r'"""(.*?)"""\n', source, re.S)
    if docstring is None:
        raise SystemExit(f"{SOURCE.name} must start with its docstring")
    code = source[docstring.end() :]
    for pattern, replacement in RENAMES:
        code = re.sub(pattern, replacement, code)
    # ``async for x in y: yield x`` was the async way of ``yield from y``.
    code = re.sub(
        r"^( *)for (\w+) in (.+):\n *yield \2\n", r"\1yield from \3\n", code, flags=re.M
    )
    return HEADER + code


def ruff(args: list[str], code: str) -> str:
    """``code`` through ``ruff ARGS -`` (as the file ``TARGET``)."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(TARGET), "-"],
        input=code,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"ruff {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def generate() -> str:
    """The text ``_sync_client.py`` must have."""
    code = unasync(SOURCE.read_text())
    code = ruff(["check", "--quiet", "--fix", "--select", "I"], code)
    return ruff(["format", "--quiet"], code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the file is out of date"
    )
    check = parser.parse_args(argv).check
    wanted = generate()
    if check:
        if not TARGET.exists() or TARGET.read_text() != wanted:
            print(f"{TARGET} is out of date: run python scripts/unasync.py")
            return 1
        return 0
    TARGET.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
