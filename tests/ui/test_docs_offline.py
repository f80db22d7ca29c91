"""``/docs`` and ``/redoc`` render in headless chromium with the outside network cut.

Chromium gets a proxy that refuses every connection (loopback bypasses a proxy, so
only the service is reachable) and a resolver that resolves no name: a page that
needs a CDN stays blank. The page must also have requested nothing but the service.
"""

from __future__ import annotations

import json

import httpx
import pytest

from app.api.app import create_app
from app.settings import Settings
from tests.support.browser import Browser
from tests.support.live import ThreadServer
from tests.support.server import refused_port

pytestmark = [pytest.mark.fake_embedder, pytest.mark.slow]

# Every URL the page loaded (the document included), to compare with the origin.
LOADED = "[location.href, ...performance.getEntriesByType('resource').map(e => e.name)]"


@pytest.fixture
def offline_browser(chromium, tmp_path):
    with refused_port() as dead:
        flags = [
            f"--proxy-server=http://127.0.0.1:{dead}",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        ]
        with Browser(chromium, tmp_path / "profile", flags=flags) as browser:
            yield browser


@pytest.fixture
def server(tmp_path, embedder):
    with ThreadServer(
        create_app(Settings(data_dir=tmp_path / "d"), embedder=embedder)
    ) as live:
        yield live


def _only_local(browser, origin, *, cosmetic=()):
    urls = browser.evaluate(LOADED)
    outside = [u for u in urls if not u.startswith(origin + "/") and u not in cosmetic]
    assert not outside, json.dumps(urls)
    return urls


def test_swagger_ui_renders_offline(offline_browser, server):
    offline_browser.goto(f"{server.url}/docs")
    # The operations list appears: Swagger UI loaded its script and the schema.
    n_ops = offline_browser.wait_for("document.querySelectorAll('.opblock').length")
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    assert n_ops == sum(len(ops) for ops in paths.values())
    assert offline_browser.evaluate(
        "[...document.querySelectorAll('.opblock-summary-path')]"
        ".some(e => e.textContent.includes('/v1/collections/{name}/search'))"
    )
    urls = _only_local(offline_browser, server.url)
    assert f"{server.url}/docs/static/swagger-ui-bundle.js" in urls
    # The cut is real: a CDN is unreachable from this browser.
    assert (
        offline_browser.evaluate(
            "fetch('https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css')"
            ".then(() => 'reached', () => 'blocked')"
        )
        == "blocked"
    )


def test_redoc_renders_offline(offline_browser, server):
    offline_browser.goto(f"{server.url}/redoc")
    offline_browser.wait_for(
        "document.body.innerText.includes('/v1/collections/{name}/search')"
    )
    # ReDoc's "API docs by Redocly" badge is an <img> its script always asks the
    # vendor for (no option turns it off); offline it is a missing 16px logo.
    badge = "https://cdn.redoc.ly/redoc/logo-mini.svg"
    urls = _only_local(offline_browser, server.url, cosmetic=(badge,))
    assert f"{server.url}/docs/static/redoc.standalone.js" in urls


def test_assets_are_a_fixed_list(server):
    assert httpx.get(f"{server.url}/docs/static/swagger-ui.css").status_code == 200
    for name in ("core.py", "..%2F__init__.py", "nope.js"):
        got = httpx.get(f"{server.url}/docs/static/{name}")
        assert got.status_code == 404, name
        assert got.headers["content-type"] == "application/problem+json"


def test_assets_are_public_with_the_docs(tmp_path, embedder):
    from fastapi.testclient import TestClient

    for public_docs, expected in ((True, 200), (False, 401)):
        settings = Settings(
            data_dir=tmp_path / "d", api_key="k3y-value", public_docs=public_docs
        )
        with TestClient(create_app(settings, embedder=embedder)) as client:
            for path in ("/docs", "/redoc", "/docs/static/swagger-ui-bundle.js"):
                assert client.get(path).status_code == expected, path
