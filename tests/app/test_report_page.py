"""The calibration report page in a real headless browser (Debian's chromium)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import httpx
import pytest

from app.api.app import create_app
from app.settings import Settings
from tests.app.browser import HEADLESS_FLAGS
from tests.app.live import ThreadServer

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM_FLAGS = [*HEADLESS_FLAGS, "--virtual-time-budget=5000"]


def _run(chromium: str, tmp_path: Path, *args: str) -> str:
    result = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.stdout


@pytest.mark.slow
def test_report_page_renders_in_chromium(chromium, tmp_path, embedder):
    settings = Settings(data_dir=tmp_path / "data")
    with ThreadServer(create_app(settings, embedder=embedder)) as server:
        httpx.post(
            f"{server.url}/v1/collections", json={"name": "kb"}
        ).raise_for_status()
        info = httpx.get(f"{server.url}/v1/collections/kb").json()
        calibrator = info["calibrator"]["id"]  # the shipped default profile
        url = f"{server.url}/v1/collections/kb/calibrators/{calibrator}/report"
        dom = _run(chromium, tmp_path, "--dump-dom", url)
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "report_page.png"
        _run(chromium, tmp_path, f"--screenshot={shot}", "--window-size=1000,1600", url)
    assert f"Calibrator {calibrator}" in dom
    # The diagram was fetched and decoded: the page's onload hook records its size.
    loaded = re.search(r'id="reliability"[^>]*data-natural-width="(\d+)"', dom)
    assert loaded and int(loaded.group(1)) > 100, dom[:2000]
    methods = re.findall(r'<tr class="method[^"]*">\s*<td>([^<]+)</td>', dom)
    assert methods == ["prior"]  # the default is the cross-domain prior (issue 9)
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
