"""What the page tests share: the page's state, a key press, a served collection."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from app.api.app import create_app
from app.settings import Settings
from tests.support.browser import Browser
from tests.support.corpus import CORPUS
from tests.support.live import ThreadServer

STATE = "document.body.dataset.state"
SEQ = "Number(document.body.dataset.seq)"


def press(browser: Browser, key: str) -> None:
    """Press a key and wait until the judging page has rendered its outcome."""
    before = browser.evaluate(SEQ)
    browser.press(key)
    browser.wait_for(f"{SEQ} > {before} && {STATE} !== 'fitting' && {STATE}")


@contextmanager
def served_kb(
    chromium: str, tmp_path: Path, embedder: Any, api_key: str | None = None
) -> Iterator[tuple[ThreadServer, httpx.Client, Browser]]:
    """A live server whose collection ``kb`` holds the five documents, a client
    (with the key) and a browser: ``(server, api, browser)``."""
    settings = Settings(data_dir=tmp_path / "data", api_key=api_key)
    headers = {} if api_key is None else {"authorization": f"Bearer {api_key}"}
    with (
        ThreadServer(create_app(settings, embedder=embedder)) as server,
        httpx.Client(base_url=server.url, headers=headers) as api,
        Browser(chromium, tmp_path / "profile") as browser,
    ):
        api.post("/v1/collections", json={"name": "kb"}).raise_for_status()
        docs = [{"id": key, "text": text} for key, text in CORPUS.items()]
        api.put("/v1/collections/kb/documents", json={"documents": docs})
        yield server, api, browser
