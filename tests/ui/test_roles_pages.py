"""The pages with keys that have roles: the judging page with a judge key, the
report viewer with a read key (headless chromium, a real server in a thread)."""

from __future__ import annotations

import json

import httpx

from app.api.app import create_app
from app.settings import Settings
from tests.support.browser import Browser
from tests.support.corpus import CORPUS, QUERIES
from tests.support.live import ThreadServer

JUDGE = "annotator-0123456789abcdef"
READ = "dashboard-0123456789abcdef"
ADMIN = "operator-0123456789abcdef"
STATE = "document.body.dataset.state"
SEQ = "Number(document.body.dataset.seq)"
JUDGMENTS = [
    {"query": q, "document_id": doc, "relevance": int(doc == key)}
    for doc in CORPUS
    for key, q in QUERIES.items()
]


def _type_key(browser: Browser, key: str, state: str) -> None:
    before = browser.evaluate(SEQ)
    browser.evaluate(
        f"key.value = {key!r}; key.dispatchEvent(new Event('change')); true"
    )
    browser.wait_for(f"{SEQ} > {before} && {STATE} === {state!r}")


def test_a_judge_key_judges_and_a_read_key_reads_the_report(
    chromium, tmp_path, embedder
):
    keys = tmp_path / "keys.json"
    keys.write_text(
        json.dumps(
            [
                {
                    "name": "annotator",
                    "key": JUDGE,
                    "role": "judge",
                    "collections": ["kb"],
                },
                {"name": "dashboard", "key": READ, "role": "read"},
                {"name": "operator", "key": ADMIN, "role": "admin"},
            ]
        )
    )
    keys.chmod(0o600)
    settings = Settings(data_dir=tmp_path / "data", api_keys_file=keys)
    with (
        ThreadServer(create_app(settings, embedder=embedder)) as server,
        httpx.Client(
            base_url=server.url, headers={"authorization": f"Bearer {ADMIN}"}
        ) as api,
        Browser(chromium, tmp_path / "profile") as browser,
    ):
        api.post("/v1/collections", json={"name": "kb"}).raise_for_status()
        docs = [{"id": key, "text": text} for key, text in CORPUS.items()]
        api.put(
            "/v1/collections/kb/documents", json={"documents": docs}
        ).raise_for_status()
        queue = {"queries": list(QUERIES.values())}
        api.post("/v1/collections/kb/judging/queries", json=queue).raise_for_status()

        browser.goto(f"{server.url}/ui/collections/kb/judge")
        browser.wait_for(f"{STATE} === 'error'")  # no key yet: 401
        _type_key(browser, JUDGE, "judging")
        progress = browser.evaluate("document.getElementById('progress').textContent")
        assert progress.endswith("fitting needs a write key (this judge key judges)")
        assert browser.evaluate("document.getElementById('fit').disabled") is True

        # Judging works: each key press posts a judgment with the judge key.
        for _ in range(3):
            before = browser.evaluate(SEQ)
            browser.press("k")
            browser.wait_for(f"{SEQ} > {before} && {STATE}")
        assert len(api.get("/v1/collections/kb/feedback").json()["data"]) == 3
        # f does nothing with a judge key: no fit is tried (it would start at once).
        calibrators = api.get("/v1/collections/kb/calibrators").json()["count"]
        browser.press("f")
        assert browser.evaluate(f"{STATE}") == "judging"
        assert api.get("/v1/collections/kb/calibrators").json()["count"] == calibrators

        # The report viewer, with a read key typed into it.
        r = api.post(
            "/v1/collections/kb/calibrators",
            json={"judgments": JUDGMENTS, "method": "platt"},
        )
        calibrator = r.json()["id"]
        browser.evaluate("sessionStorage.clear(); true")  # forget the judge key
        browser.goto(f"{server.url}/ui/collections/kb/calibrators/{calibrator}/report")
        assert "Unauthorized" in browser.wait_for(
            f"{STATE} === 'error' && error.textContent"
        )
        browser.evaluate(
            f"key.value = {READ!r}; key.dispatchEvent(new Event('change')); true"
        )
        assert browser.wait_for(f"{STATE} === 'shown' && document.title") == (
            f"normcal calibrator {calibrator}"
        )
        assert (
            browser.wait_for(
                "document.getElementById('reliability').complete && "
                "document.getElementById('reliability').naturalWidth"
            )
            > 100
        )
