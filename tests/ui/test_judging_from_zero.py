"""A new collection judged from an empty page, and the home page, in headless chromium.

Nothing is logged and nothing queued: the page offers suggestions drawn from the
documents, takes typed queries, hides the scores while judging, undoes by key, and
fits. The home page lists the collections with a key set.
"""

from __future__ import annotations

import httpx

from app.services import next_query
from tests.support.browser import Browser
from tests.support.corpus import QUERIES
from tests.ui.pages import SEQ, STATE, press, served_kb

KEY = "judge-secret"


def _text(element: str) -> str:
    return f"document.getElementById('{element}').textContent"


def _shown(element: str) -> str:
    """JS: whether ``element`` is displayed."""
    return f"getComputedStyle(document.getElementById('{element}')).display !== 'none'"


def _type_query(browser: Browser, text: str) -> None:
    """``a`` focuses the box; the text is typed and Enter judges it now."""
    browser.press("a")
    assert browser.evaluate("document.activeElement.id") == "new-query"
    browser.call("Input.insertText", text=text)
    press(browser, "Enter")
    assert browser.wait_for(f"{STATE} === 'judging' && {_text('query')}") == text


def _move_on(browser: Browser, query: str) -> None:
    """After a judgment: on to the next query unless the page already is there."""
    if browser.evaluate(_text("query")) == query and browser.evaluate(
        f"{STATE} === 'judging'"
    ):
        press(browser, "n")  # the rest of its hits count as not relevant


def _feedback(api: httpx.Client) -> list[tuple[str, str, int]]:
    rows = api.get("/v1/collections/kb/feedback").json()["data"]
    return [(j["query"], j["document_id"], j["relevance"]) for j in rows]


def test_from_an_empty_page_type_judge_undo_and_fit(chromium, tmp_path, embedder):
    key_of = {query: key for key, query in QUERIES.items()}
    with served_kb(chromium, tmp_path, embedder, KEY) as (server, api, browser):
        browser.goto(f"{server.url}/ui/collections/kb/judge")
        browser.wait_for(f"{STATE} === 'error'")
        browser.evaluate(
            f"key.value = {KEY!r}; key.dispatchEvent(new Event('change')); true"
        )
        # Nothing logged, nothing queued: suggestions drawn from the documents.
        browser.wait_for(f"{STATE} === 'empty'")
        assert browser.evaluate(_text("empty")).startswith("No query to judge yet.")
        suggested = browser.evaluate(
            "[...document.querySelectorAll('#suggested button')].map(b => b.textContent)"
        )
        assert len(suggested) == next_query.FIT_MIN_QUERIES
        assert browser.evaluate(_shown("suggestions"))

        # A typed query, judged by keyboard, with the scores hidden until asked for.
        _type_query(browser, QUERIES["paris"])
        assert "typed here" in browser.evaluate(_text("source"))
        assert not browser.evaluate(_shown("score"))
        browser.press("p")  # a toggle: nothing to load
        browser.wait_for(_shown("score"))
        assert "P(relevant)" in browser.evaluate(_text("score"))
        browser.press("p")
        browser.wait_for(f"!({_shown('score')})")
        first = browser.evaluate("document.getElementById('hit').dataset.docId")
        press(browser, "k" if first != "paris" else "j")
        assert browser.evaluate(_text("position")).startswith("2 of ")
        assert len(_feedback(api)) == 1
        # Undo: the judgment is gone and the same hit is back.
        press(browser, "u")
        assert _feedback(api) == []
        assert browser.evaluate(_text("position")).startswith("1 of ")
        assert browser.evaluate("document.getElementById('hit').dataset.docId") == first
        assert browser.evaluate(_text("message")).startswith("Undone")

        # Judge the five typed queries: the right hit relevant, then move on.
        for query in QUERIES.values():
            if browser.evaluate(_text("query")) != query:
                _type_query(browser, query)
            while (
                browser.evaluate("document.getElementById('hit').dataset.docId")
                != key_of[query]
            ):
                press(browser, "k")
            press(browser, "j")
            _move_on(browser, query)
        judged = {q for q, _, r in _feedback(api) if r > 0}
        assert judged == set(QUERIES.values())
        # Undo across queries: back to the last judgment of the previous query.
        last = _feedback(api)[-1]
        press(browser, "u")
        assert _feedback(api)[-1] != last
        assert browser.evaluate(_text("query")) == last[0]
        assert (
            browser.evaluate("document.getElementById('hit').dataset.docId")
            == (last[1])
        )
        press(browser, "j")
        _move_on(browser, last[0])
        assert browser.evaluate(STATE) == "done"
        press(browser, "f")
        assert browser.wait_for(f"{STATE} === 'fitted'")
        calibrator = browser.evaluate(
            "document.getElementById('report').dataset.calibrator"
        )
        served = api.get("/v1/collections/kb").json()["calibrator"]
        assert served["id"] == calibrator and served["status"] == "fitted"
        assert served["n_queries"] == len(QUERIES)


def test_a_suggestion_is_judged_with_one_click(chromium, tmp_path, embedder):
    with served_kb(chromium, tmp_path, embedder) as (server, api, browser):
        browser.goto(f"{server.url}/ui/collections/kb/judge")
        browser.wait_for(f"{STATE} === 'empty'")
        picked = browser.evaluate(
            "document.querySelector('#suggested button').textContent"
        )
        before = browser.evaluate(SEQ)
        browser.evaluate("document.querySelector('#suggested button').click(); true")
        browser.wait_for(f"{SEQ} > {before} && {STATE} === 'judging'")
        assert browser.evaluate(_text("query")) == picked
        # Skipped by mistake: undo brings it back.
        press(browser, "s")
        assert browser.evaluate(STATE) == "done"  # nothing left: 1 skipped
        press(browser, "u")
        assert browser.evaluate(_text("query")) == picked
        assert api.get("/v1/collections/kb/judging/next").json()["query"] == picked


def test_home_page_lists_the_collections_with_a_key(chromium, tmp_path, embedder):
    with served_kb(chromium, tmp_path, embedder, KEY) as (server, api, browser):
        api.post("/v1/collections", json={"name": "notes"}).raise_for_status()
        assert httpx.get(f"{server.url}/v1/collections").status_code == 401

        browser.goto(f"{server.url}/")
        assert "Unauthorized" in browser.wait_for(
            f"{STATE} === 'error' && {_text('error')}"
        )
        browser.evaluate(
            f"key.value = {KEY!r}; key.dispatchEvent(new Event('change')); true"
        )
        browser.wait_for(f"{STATE} === 'shown'")
        rows = browser.evaluate(
            "[...document.querySelectorAll('#collections tbody tr')].map(r =>"
            " [r.dataset.collection, ...[...r.cells].map(c => c.textContent)])"
        )
        assert [r[:3] for r in rows] == [["kb", "kb", "5"], ["notes", "notes", "0"]]
        assert all(r[3].startswith("shipped default") for r in rows)
        assert [r[4:] for r in rows] == [["judge", "report"], ["judge", "report"]]
        links = browser.evaluate(
            "[...document.querySelectorAll('tr[data-collection=kb] a')].map(a => a.href)"
        )
        default = api.get("/v1/collections/kb").json()["calibrator"]["id"]
        assert links == [
            f"{server.url}/ui/collections/kb/judge",
            f"{server.url}/ui/collections/kb/calibrators/{default}/report",
        ]
        # The key typed here is the judging page's too (same tab).
        browser.goto(links[0])
        browser.wait_for(f"{STATE} === 'empty' || {STATE} === 'error'")
        assert browser.evaluate(STATE) == "empty"
