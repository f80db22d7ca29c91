"""The calibration report page in a real headless browser (Debian's chromium)."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import httpx
import pytest

from app.api.app import create_app
from app.settings import Settings
from tests.app.browser import Browser
from tests.app.live import ThreadServer

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
# The diagram was fetched and decoded: its natural width, once it has loaded.
DIAGRAM = (
    "(() => { const img = document.getElementById('reliability');"
    " return img && img.complete && img.naturalWidth; })()"
)


@pytest.mark.slow
def test_report_page_renders_in_chromium(chromium, tmp_path, embedder):
    settings = Settings(data_dir=tmp_path / "data")
    with (
        ThreadServer(create_app(settings, embedder=embedder)) as server,
        Browser(chromium, tmp_path / "profile") as browser,
    ):
        httpx.post(
            f"{server.url}/v1/collections", json={"name": "kb"}
        ).raise_for_status()
        info = httpx.get(f"{server.url}/v1/collections/kb").json()
        calibrator = info["calibrator"]["id"]  # the shipped default profile
        url = f"{server.url}/v1/collections/kb/calibrators/{calibrator}/report"
        browser.goto(url)
        assert browser.wait_for(DIAGRAM) > 100
        dom = browser.evaluate("document.documentElement.outerHTML")
        # Its style sheet (no inline style: the CSP allows none) applied.
        weight = browser.evaluate(
            "getComputedStyle(document.querySelector('tr.chosen')).fontWeight"
        )
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            width=1000,
            height=1600,
            deviceScaleFactor=1,
            mobile=False,
        )
        shot = browser.call("Page.captureScreenshot", format="png")
    ARTIFACTS.mkdir(exist_ok=True)
    png = base64.b64decode(shot["data"])
    (ARTIFACTS / "report_page.png").write_bytes(png)
    assert f"Calibrator {calibrator}" in dom
    assert int(weight) >= 700
    methods = re.findall(r'<tr class="method[^"]*"><td>([^<]+)</td>', dom)
    assert methods == ["prior"]  # the default is the cross-domain prior (issue 9)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
