"""Logged rerank requests on the judging page (headless chromium): judge, fit, serve.

A namespace collection (no documents) logs the rerank requests sent with it; the page
offers each with the documents it was sent with, judged by keyboard like search hits.
"""

from __future__ import annotations

import httpx

from app.api.app import create_app
from app.services import next_query
from app.settings import Settings
from tests.support.browser import Browser
from tests.support.corpus import CORPUS, QUERIES
from tests.support.live import ThreadServer

STATE = "document.body.dataset.state"
SEQ = "Number(document.body.dataset.seq)"


def _request(name: str) -> dict:
    """A retriever's list for the query of ``name``: every text, the right one 2nd."""
    others = [n for n in CORPUS if n != name]
    order = [others[0], name, *others[1:]]
    return {
        "query": QUERIES[name],
        "documents": [{"text": CORPUS[n], "id": n} for n in order],
        "collection": "ns",
    }


def _press(browser: Browser, key: str) -> None:
    before = browser.evaluate(SEQ)
    browser.press(key)
    browser.wait_for(f"{SEQ} > {before} && {STATE} !== 'fitting' && {STATE}")


def test_a_logged_rerank_request_is_judged_on_the_page(chromium, tmp_path, embedder):
    settings = Settings(data_dir=tmp_path / "data")
    with (
        ThreadServer(create_app(settings, embedder=embedder)) as server,
        httpx.Client(base_url=server.url) as api,
        Browser(chromium, tmp_path / "profile") as browser,
    ):
        api.post("/v1/collections", json={"name": "ns"}).raise_for_status()
        log = {"enabled": True}
        api.put("/v1/collections/ns/query-log", json=log).raise_for_status()
        for name in CORPUS:
            r = api.post("/v1/rerank", json=_request(name))
            r.raise_for_status()
            assert r.json()["calibrator"]["status"] == "default"
        browser.goto(f"{server.url}/ui/collections/ns/judge")
        browser.wait_for(f"{STATE} === 'judging'")
        source = browser.evaluate("document.getElementById('source').textContent")
        assert source == "(from a logged rerank request: its own documents)"
        name_of = {query: name for name, query in QUERIES.items()}
        judged = []
        for _ in range(40):  # bounded: 5 queries of 5 hits
            if browser.evaluate("!document.getElementById('fit').disabled"):
                break
            query = browser.evaluate("document.getElementById('query').textContent")
            doc = browser.evaluate("document.getElementById('hit').dataset.docId")
            assert doc in CORPUS  # the caller's ids, as sent
            if doc != name_of[query]:
                _press(browser, "k")
                continue
            _press(browser, "j")
            judged.append(query)
            if browser.evaluate(
                "document.getElementById('query').textContent"
            ) == query and browser.evaluate(f"{STATE} === 'judging'"):
                _press(browser, "n")
        assert len(judged) == next_query.FIT_MIN_QUERIES
        stored = api.get("/v1/collections/ns/feedback").json()["data"]
        assert {(j["query"], j["document_id"]) for j in stored if j["relevance"]} == {
            (QUERIES[n], n) for n in CORPUS
        }
        _press(browser, "f")
        assert browser.wait_for(f"{STATE} === 'fitted'")
        calibrator = browser.evaluate(
            "document.getElementById('report').dataset.calibrator"
        )
        served = api.post("/v1/rerank", json=_request("paris")).json()
        assert served["calibrator"]["status"] == "fitted"
        assert served["calibrator"]["id"] == calibrator
        assert served["results"][0]["id"] == "paris"
