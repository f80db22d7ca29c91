"""The judging page in headless chromium: judge by keyboard, fit, search calibrated."""

from __future__ import annotations

import httpx

from app.api.app import create_app
from app.services import next_query
from app.settings import Settings
from tests.support.browser import Browser
from tests.support.corpus import CORPUS, QUERIES
from tests.support.live import ThreadServer
from tests.ui.pages import SEQ, STATE, press, served_kb

KEY = "judge-secret"
OFF_TOPIC = "weather forecast for tomorrow in Oslo"  # skipped on the page


def _prepare(api: httpx.Client) -> None:
    """A five-document collection whose query log holds six searched queries."""
    api.post("/v1/collections", json={"name": "kb"}).raise_for_status()
    docs = [{"id": key, "text": text} for key, text in CORPUS.items()]
    api.put("/v1/collections/kb/documents", json={"documents": docs})
    log = {"enabled": True, "retention": 100}
    api.put("/v1/collections/kb/query-log", json=log).raise_for_status()
    for query in [*QUERIES.values(), OFF_TOPIC]:
        r = api.post("/v1/collections/kb/search", json={"query": query})
        r.raise_for_status()
        before = r.json()["calibrator"]
        assert before["status"] == "default" and before["guarantee"] is None


def test_judge_by_keyboard_then_fit_now(chromium, tmp_path, embedder):
    settings = Settings(data_dir=tmp_path / "data", api_key=KEY)
    key_of = {query: key for key, query in QUERIES.items()}
    with (
        ThreadServer(create_app(settings, embedder=embedder)) as server,
        httpx.Client(
            base_url=server.url, headers={"authorization": f"Bearer {KEY}"}
        ) as api,
        Browser(chromium, tmp_path / "profile") as browser,
    ):
        _prepare(api)
        # The page is public; without the key its data call is refused.
        browser.goto(f"{server.url}/ui/collections/kb/judge")
        assert "Unauthorized" in browser.wait_for(
            f"{STATE} === 'error' && error.textContent"
        )
        assert browser.evaluate("document.getElementById('fit').disabled") is True
        before = browser.evaluate(SEQ)
        browser.evaluate(
            f"key.value = {KEY!r}; key.dispatchEvent(new Event('change')); true"
        )
        browser.wait_for(f"{SEQ} > {before} && {STATE} === 'judging'")

        judged: list[str] = []
        for _ in range(40):  # bounded: 6 queries, at most 5 hits each
            if browser.evaluate("!document.getElementById('fit').disabled"):
                break
            query = browser.evaluate("document.getElementById('query').textContent")
            if query == OFF_TOPIC:
                press(browser, "s")
                continue
            doc = browser.evaluate("document.getElementById('hit').dataset.docId")
            if doc != key_of[query]:
                press(browser, "k")  # not relevant; the next hit follows
                continue
            press(browser, "j" if len(judged) % 2 else "1")
            judged.append(query)
            # The rest of the hits count as not relevant: on to the next query.
            if (
                browser.evaluate(f"{STATE} === 'judging'")
                and browser.evaluate("document.getElementById('query').textContent")
                == query
            ):
                press(browser, "Enter" if len(judged) % 2 else "n")
        assert len(judged) == next_query.FIT_MIN_QUERIES
        progress = browser.evaluate("document.getElementById('progress').textContent")
        assert progress.startswith(f"{next_query.FIT_MIN_QUERIES} of ")

        press(browser, "f")
        assert browser.wait_for(f"{STATE} === 'fitted'")
        report = browser.evaluate("document.getElementById('report').href")
        calibrator = browser.evaluate(
            "document.getElementById('report').dataset.calibrator"
        )

        assert report.endswith(f"/ui/collections/kb/calibrators/{calibrator}/report")
        # The link works with the key set: the viewer fetches the report and its
        # diagram with the key the judging page kept (a plain link would get a 401).
        assert httpx.get(report.replace("/ui/", "/v1/")).status_code == 401
        browser.goto(report)  # following the link, in the same tab (same session)
        assert browser.wait_for(f"{STATE} === 'shown' && document.title") == (
            f"normcal calibrator {calibrator}"
        )
        heading = browser.evaluate("document.querySelector('h1').textContent")
        assert heading == f"Calibrator {calibrator}"
        assert (
            browser.wait_for(
                "document.getElementById('reliability').complete && "
                "document.getElementById('reliability').naturalWidth"
            )
            > 100
        )
        r = api.post("/v1/collections/kb/search", json={"query": QUERIES["paris"]})
        served = r.json()["calibrator"]
        assert served["default"] is False and served["id"] == calibrator
        # Fitted on this collection's judgments; five judged queries are too few for
        # Learn-then-Test to certify an abstain rate, so no guarantee is claimed.
        assert served["status"] == "fitted" and served["n_queries"] >= 5
        assert served["guarantee"] is None


def _shown(element: str) -> str:
    """JS: ``element``'s text when it is displayed, else ``''``."""
    return (
        f"(getComputedStyle(document.getElementById('{element}')).display !== 'none'"
        f" && document.getElementById('{element}').textContent)"
    )


def test_loading_then_empty_says_how_to_add_queries(chromium, tmp_path, embedder):
    """While a query loads the page says so; with none, it says how to get some."""
    with served_kb(chromium, tmp_path, embedder) as (server, api, browser):
        browser.goto(f"{server.url}/ui/collections/kb/judge")
        empty = browser.wait_for(f"{STATE} === 'empty' && {_shown('empty')}")
        assert empty.startswith("No query to judge yet.")
        assert 'POST /v1/collections/kb/judging/queries with {"queries"' in empty
        assert 'PUT /v1/collections/kb/query-log with {"enabled": true}' in empty
        assert not browser.evaluate(_shown("card"))

        api.put("/v1/collections/kb/query-log", json={"enabled": True})
        press(browser, "n")
        assert "The query log is on (0 logged)" in browser.evaluate(_shown("empty"))

        # Hold the next request, to see the page while it waits for the answer.
        browser.evaluate(
            "window.held = []; const send = window.fetch; window.fetch = (...a) =>"
            " new Promise((ok) => held.push(() => ok(send(...a)))); true"
        )
        api.post("/v1/collections/kb/judging/queries", json={"queries": ["paris"]})
        before = browser.evaluate(SEQ)
        browser.press("n")
        loading = browser.wait_for(f"held.length === 1 && {_shown('loading')}")
        assert loading == "Loading the next query…"
        assert browser.evaluate(f"{STATE} === 'loading' && !{_shown('empty')}")
        assert browser.evaluate(f"{SEQ} === {before}")
        browser.evaluate("held.pop()(); true")
        assert (
            browser.wait_for(f"{STATE} === 'judging' && {_shown('query')}") == "paris"
        )
        assert not browser.evaluate(_shown("loading"))
