"""The documentation stays true: links resolve, tables follow the code, examples run.

- Every relative link in ``README.md``, ``CHANGELOG.md``, ``docs/`` and the client's
  README points at a file that exists, and every ``#anchor`` at a heading of its page
  (GitHub's slugs).
- Every problem type of ``app/api/errors.py`` and every setting and limit of
  ``app/settings.py`` is documented.
- The README's tour runs verbatim (``localhost:8000`` pointed at the server) against a
  real ``normcal serve``, and its expected output matches: same structure, equal
  strings and integers, floats within a tolerance; ``…`` marks what was trimmed.
- The Python blocks of ``docs/client.md`` run against a live server; the compose
  excerpt of ``docs/deployment.md`` is valid YAML; every ``make`` target the README
  names exists.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import yaml

# The product's own ServerProcess (a fresh interpreter a start, not the suite's
# zygote), so that path stays tested: the README's tour runs as a user runs it.
from app.cli.process import ServerProcess
from tests.support.server import source_env

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [
    README,
    REPO / "CHANGELOG.md",
    REPO / "clients" / "python" / "README.md",
    *sorted(DOCS.glob("*.md")),
]
ELLIPSIS = "…"

# ------------------------------------------------------------------ markdown


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced code block, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", text, re.M | re.S)


def prose(text: str) -> str:
    """The text without fenced blocks and inline code (links there are examples)."""
    text = re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def section(path: Path, title: str) -> str:
    """The body of the ``## title`` section of a page."""
    text = path.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its rendered text, lowercased, punctuation
    dropped (letters, digits, spaces, ``-`` and ``_`` stay), spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "")
    kept = "".join(
        c
        for c in text.strip().lower()
        if c in " -_" or unicodedata.category(c)[0] in "LN"
    )
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a page's headings; a repeated one gets ``-1``, ``-2``, …"""
    seen: dict[str, int] = {}
    found = set()
    text = re.sub(r"^```.*?^```$", "", path.read_text(), flags=re.M | re.S)
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    """Relative link targets of a page (``[text](target)``; URLs left out)."""
    targets = re.findall(r"\]\(([^)\s]+)\)", prose(path.read_text()))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_pages_are_found():
    names = {p.name for p in PAGES}
    assert {"README.md", "CHANGELOG.md", "api.md", "architecture.md"} <= names
    assert len(PAGES) >= 15


def test_slugs_follow_github():
    assert slug("Endpoints (v1)") == "endpoints-v1"
    assert slug("What answers 422 `backend-unsupported` on Milvus") == (
        "what-answers-422-backend-unsupported-on-milvus"
    )
    assert slug("4.3 The recommended family (NT)") == "43-the-recommended-family-nt"
    assert slug("Load: overload and batching") == "load-overload-and-batching"
    assert slug("[Unreleased]") == "unreleased"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no {dest.relative_to(REPO)}")
        elif anchor and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, broken


def test_a_broken_anchor_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## Part one\n\nSee [one](#part-one), [two](#part-two).\n"
    )
    assert [t for t in links(page) if t.partition("#")[2] not in anchors(page)] == [
        "#part-two"
    ]


# ------------------------------------------------------- tables follow the code


def test_every_problem_type_is_documented():
    from app.api import errors

    slugs = {p.slug for p in errors.PROBLEM_TABLE.values()}
    slugs |= {errors.VALIDATION.slug, errors.MALFORMED_JSON.slug, errors.INTERNAL.slug}
    api = section(DOCS / "api.md", "Errors")
    assert {s for s in slugs if f"| `{s}` |" not in api} == set()


def test_every_setting_and_limit_is_documented():
    from app.settings import Limits, Settings

    configuration = (DOCS / "configuration.md").read_text()
    missing = [
        f"NORMCAL_{name.upper()}"
        for name in Settings.model_fields
        if name != "limits" and f"`NORMCAL_{name.upper()}`" not in configuration
    ]
    assert missing == []
    limits = section(DOCS / "api.md", "Limits")
    assert [n for n in Limits.model_fields if f"| `{n}` |" not in limits] == []


# ------------------------------------------------------- the README runs


def expected_json(text: str) -> Any:
    """Parse an expected-output block: JSON where a bare ``…`` stands for what was
    trimmed (a member of an object, the rest of a list, or any value) and a string
    ending in ``…`` for any string with that start."""
    out, stack, in_string, escaped = [], [], False, False
    last = ""  # the last significant character outside strings
    for char in text:
        if in_string:
            out.append(char)
            in_string = not (char == '"' and not escaped)
            escaped = char == "\\" and not escaped
            continue
        if char == ELLIPSIS:
            key_position = stack and stack[-1] == "{" and last in "{,"
            out.append(
                f'"{ELLIPSIS}": "{ELLIPSIS}"' if key_position else f'"{ELLIPSIS}"'
            )
            last = '"'
            continue
        if char == '"':
            in_string = True
        elif char in "{[":
            stack.append(char)
        elif char in "}]":
            stack.pop()
        if not char.isspace():
            last = char
        out.append(char)
    return json.loads("".join(out))


def mismatches(expected: Any, actual: Any, where: str = "$") -> list[str]:
    """Where ``actual`` differs from ``expected`` (see :func:`expected_json`)."""
    if expected == ELLIPSIS:
        return []
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{where}: {actual!r} is not an object"]
        keys = set(expected) - {ELLIPSIS}
        out = [f"{where}.{k}: missing" for k in sorted(keys - set(actual))]
        if ELLIPSIS not in expected:
            out += [f"{where}.{k}: not expected" for k in sorted(set(actual) - keys)]
        for key in sorted(keys & set(actual)):
            out += mismatches(expected[key], actual[key], f"{where}.{key}")
        return out
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return [f"{where}: {actual!r} is not a list"]
        trimmed = bool(expected) and expected[-1] == ELLIPSIS
        items = expected[:-1] if trimmed else expected
        if len(actual) < len(items) or (not trimmed and len(actual) != len(items)):
            return [f"{where}: {len(actual)} items, expected {len(expected)}"]
        return [
            m
            for i, item in enumerate(items)
            for m in mismatches(item, actual[i], f"{where}[{i}]")
        ]
    if isinstance(expected, str) and expected.endswith(ELLIPSIS):
        same = isinstance(actual, str) and actual.startswith(expected[:-1])
        return [] if same else [f"{where}: {actual!r} does not start {expected!r}"]
    number = (int, float)
    if isinstance(expected, number) and not isinstance(expected, bool):
        if (
            isinstance(actual, number)
            and not isinstance(actual, bool)
            and (
                actual == expected
                if isinstance(expected, int) and isinstance(actual, int)
                else math.isclose(actual, expected, rel_tol=0.02, abs_tol=0.01)
            )
        ):
            return []
        return [f"{where}: {actual!r}, expected about {expected!r}"]
    return [] if actual == expected else [f"{where}: {actual!r}, expected {expected!r}"]


def test_the_output_comparison_catches_a_difference():
    expected = expected_json(
        '{"a": 0.78, "n": 3, "id": "urn:…", "hits": [{"id": "1", …}, …], …}'
    )
    actual = {"a": 0.7843, "n": 3, "id": "urn:x", "hits": [{"id": "1", "s": 2}, {}]}
    assert mismatches(expected, actual | {"extra": True}) == []
    assert mismatches(expected, actual | {"a": 0.9}) == [
        "$.a: 0.9, expected about 0.78"
    ]
    assert mismatches(expected, actual | {"n": 4}) == ["$.n: 4, expected about 3"]
    assert mismatches(expected, actual | {"hits": []}) == [
        "$.hits: 0 items, expected 2"
    ]
    assert mismatches(expected_json('{"a": 1}'), {"a": 1, "b": 2}) == [
        "$.b: not expected"
    ]
    assert mismatches(expected_json('["…x", "y…"]'), ["…x", "yes"]) == []


def tour() -> list[tuple[str, str | None]]:
    """``(command, expected output or None)`` of every step of the README's tour."""
    blocks = fenced_blocks(section(README, "A 60-second tour"))
    steps: list[tuple[str, str | None]] = []
    for i, (language, body) in enumerate(blocks):
        if language == "bash":
            follows = blocks[i + 1] if i + 1 < len(blocks) else ("", "")
            steps.append((body, follows[1] if follows[0] == "json" else None))
        else:
            assert language == "json" and blocks[i - 1][0] == "bash", body
    return steps


def test_the_tour_shows_the_output_of_each_step():
    steps = tour()
    assert len(steps) >= 6
    assert all(output is not None for _, output in steps)
    for _, output in steps:
        expected_json(output)  # each parses


@pytest.mark.server
def test_the_readme_tour_runs_verbatim_with_its_output(tmp_path):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed: the tour's commands are curl commands")
    server = ServerProcess(tmp_path / "data").start()
    try:
        for command, output in tour():
            run = command.replace("localhost:8000", f"127.0.0.1:{server.port}")
            proc = subprocess.run(
                ["bash", "-c", run], capture_output=True, text=True, timeout=120
            )
            assert proc.returncode == 0, f"{command}\n{proc.stderr}"
            if output is not None:
                actual = json.loads(proc.stdout)
                assert mismatches(expected_json(output), actual) == [], command
    finally:
        server.stop()


def test_the_make_targets_the_readme_names_exist(tmp_path):
    targets = set(re.findall(r"\bmake ([a-z][a-z-]*)", README.read_text()))
    assert {"run", "test", "test-fast", "lint"} <= targets
    for target in sorted(targets):
        proc = subprocess.run(
            ["make", "-n", target, f"VENV={tmp_path / 'venv'}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, f"make {target}: {proc.stderr}"


# ------------------------------------------------------- the other pages' examples


def test_the_compose_excerpt_is_valid_yaml():
    (compose,) = [
        b
        for lang, b in fenced_blocks(
            section(DOCS / "deployment.md", "Compose: normcal next to a RAG client")
        )
        if lang == "yaml"
    ]
    assert yaml.safe_load(compose)["services"]["rag-example"]


@pytest.mark.slow
def test_each_client_page_python_example_runs_on_its_own(tmp_path, embedder):
    """Every Python block of docs/client.md runs alone: a fresh interpreter against a
    fresh, empty server, so no block relies on what another one made."""
    from app.api.app import create_app
    from app.settings import Settings
    from tests.support.live import ThreadServer

    blocks = [
        b
        for lang, b in fenced_blocks((DOCS / "client.md").read_text())
        if lang == "python"
    ]
    assert len(blocks) >= 8
    failed = []
    for n, block in enumerate(blocks):
        work = tmp_path / f"block-{n}"
        work.mkdir()  # a block may write a file (an export) into its directory
        settings = Settings(data_dir=work / "data")
        with ThreadServer(create_app(settings, embedder=embedder)) as server:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    block.replace("http://127.0.0.1:8000", server.url),
                ],
                capture_output=True,
                text=True,
                timeout=300,
                env=source_env(),
                cwd=work,
            )
        if proc.returncode != 0 or not proc.stdout.strip():
            failed.append(f"docs/client.md python block {n}: {proc.stderr[-2000:]}")
    assert failed == []


def test_the_client_page_covers_every_public_method():
    """Each method of the clients is named on the client page (as `name(`...)."""
    from normcal_client import NormcalClient

    text = (DOCS / "client.md").read_text()
    methods = [
        name
        for name in dir(NormcalClient)
        if not name.startswith("_") and callable(getattr(NormcalClient, name))
    ]
    assert len(methods) > 50
    missing = [m for m in methods if not re.search(rf"\b{m}\(|`{m}`", text)]
    assert missing == [], f"docs/client.md does not mention {missing}"
