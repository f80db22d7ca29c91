"""The calibration report page in a real headless browser (Debian's chromium)."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import httpx
import pytest

from app.api.app import create_app
from app.settings import Settings
from tests.support.browser import Browser
from tests.support.live import ThreadServer

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


HOSTILE = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>&"


def test_every_value_on_the_report_page_is_escaped():
    """Whatever a stored report holds (strings where numbers belong included), the
    page shows it as text: the template escapes every value, and holds no script."""
    import dataclasses
    import json

    from app.profiles import default_profile_path
    from app.ui.report import report_html
    from calibration.profile import Profile
    from calibration.query import AbstainPolicy
    from calibration.selection import GroupLift, SelectionRule, SelectionWhy

    shipped = Profile.from_json(
        json.loads(
            default_profile_path("sentence-transformers/all-MiniLM-L6-v2").read_text()
        )
    )
    report = shipped.report
    abstain = AbstainPolicy(
        threshold=0.5,
        target_risk=0.1,
        delta=HOSTILE,  # type: ignore[arg-type]
        n_calibration=HOSTILE,  # type: ignore[arg-type]
        empirical_risk=0.05,
        coverage=0.8,
        certified=True,
        method=HOSTILE,
        p_value=0.01,
    )
    lift = GroupLift(
        group=HOSTILE,
        model=HOSTILE,
        base=HOSTILE,
        nll_gain=HOSTILE,  # type: ignore[arg-type]
        nll_gain_se=0.01,
        brier_change=-0.01,
        verdict=HOSTILE,
        reason=HOSTILE,
    )
    scores = next(iter(report.cv.values()))
    why = SelectionWhy(
        chosen=HOSTILE,
        recalibrated=True,
        served=dataclasses.replace(scores, nll=HOSTILE),  # type: ignore[arg-type]
        ece_noise_floor=HOSTILE,  # type: ignore[arg-type]
        rules=(SelectionRule("one-se", HOSTILE, HOSTILE),),
        recalibrated_cv={HOSTILE: scores},
    )
    hostile = dataclasses.replace(
        report,
        selection=why,
        n_queries=HOSTILE,
        n_pairs=HOSTILE,
        n_positive=HOSTILE,
        k=HOSTILE,
        n_splits=HOSTILE,
        abstain=abstain,
        evidence_lift=(lift,),
        cv={HOSTILE: next(iter(report.cv.values()))},
        norm_lift=dataclasses.replace(
            report.norm_lift,
            reason=HOSTILE,
            base_method=HOSTILE,
            terms={HOSTILE: (HOSTILE, 0.1)},
        ),
    )
    profile = dataclasses.replace(
        shipped, id=HOSTILE, method=HOSTILE, model=HOSTILE, report=hostile
    )
    page = report_html(
        profile, png_url=HOSTILE, collection=HOSTILE, css_url="report.css"
    )
    assert "<script" not in page and "<img src=x" not in page
    # (attribute values, which hold escaped text, left out)
    tags = [re.sub(r'"[^"]*"', '""', t) for t in re.findall(r"<[a-zA-Z][^>]*>", page)]
    assert not [t for t in tags if re.search(r"\son\w+\s*=", t)], tags
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;&#34;&#39;&gt;&lt;img src=x"
    # id x2 (title, heading), collection, model, method x3, the five counts, k again,
    # abstain method and n_calibration, the evidence row x3, cv name, the lift's
    # reason, base and term name, the diagram's src, the choice (chosen, NLL, floor,
    # a rule's outcome and detail).
    assert page.count(escaped) >= 26, page
