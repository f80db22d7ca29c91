"""CORS (``NORMCAL_CORS_ORIGINS``): off by default; on, only the listed origins."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from app.api.app import create_app
from app.settings import Settings

pytestmark = pytest.mark.fake_embedder

ALLOWED = "https://app.example.com"
PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization,content-type",
}


def _client(tmp_path, embedder, **kw):
    settings = Settings(data_dir=tmp_path / "d", **kw)
    return TestClient(create_app(settings, embedder=embedder))


def _cors_headers(response):
    return {k for k in response.headers if k.startswith("access-control-")}


def test_off_by_default_no_cors_headers(tmp_path, embedder):
    with _client(tmp_path, embedder) as client:
        pre = client.options(
            "/v1/collections", headers={"Origin": ALLOWED, **PREFLIGHT}
        )
        assert not _cors_headers(pre)
        got = client.get("/v1/collections", headers={"Origin": ALLOWED})
        assert got.status_code == 200 and not _cors_headers(got)


def test_from_env_preflight_only_for_listed_origins(tmp_path, embedder, monkeypatch):
    monkeypatch.setenv("NORMCAL_CORS_ORIGINS", f" {ALLOWED} , http://localhost:3000")
    with _client(tmp_path, embedder, api_key="k3y-value") as client:
        # The preflight carries no key: it must not be refused with 401.
        pre = client.options(
            "/v1/collections", headers={"Origin": ALLOWED, **PREFLIGHT}
        )
        assert pre.status_code == 200, pre.text
        assert pre.headers["access-control-allow-origin"] == ALLOWED
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert "authorization" in pre.headers["access-control-allow-headers"].lower()

        other = client.options(
            "/v1/collections", headers={"Origin": "https://evil.example", **PREFLIGHT}
        )
        assert other.status_code == 400
        assert "access-control-allow-origin" not in other.headers

        # Actual requests: the allowed origin can read the answer (a 401 too).
        denied = client.get("/v1/collections", headers={"Origin": ALLOWED})
        assert denied.status_code == 401
        assert denied.headers["access-control-allow-origin"] == ALLOWED
        assert "x-request-id" in denied.headers["access-control-expose-headers"]
        ok = client.get(
            "/v1/collections",
            headers={"Origin": ALLOWED, "Authorization": "Bearer k3y-value"},
        )
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == ALLOWED
        foreign = client.get(
            "/v1/collections",
            headers={
                "Origin": "https://evil.example",
                "Authorization": "Bearer k3y-value",
            },
        )
        assert "access-control-allow-origin" not in foreign.headers


@pytest.mark.parametrize(
    "value",
    [
        "https://app.example.com/",
        "app.example.com",
        "ftp://x.example",
        "https://x.example/path",
    ],
)
def test_an_origin_no_browser_sends_is_refused(value):
    with pytest.raises(ValidationError, match="is not an origin"):
        Settings(cors_origins=value)
