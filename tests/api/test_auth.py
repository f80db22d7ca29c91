"""Optional bearer API key: off by default, 401 problem without it, public health."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.api.keys import bearer_token
from app.settings import Settings

# What the model makes of a text does not matter here: the deterministic fake.
pytestmark = pytest.mark.fake_embedder

KEY = "s3cret-token-value"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _client(tmp_path, embedder, **kw):
    settings = Settings(data_dir=tmp_path / "d", **kw)
    return TestClient(create_app(settings, embedder=embedder))


def _unauthorized(r):
    assert r.status_code == 401, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["www-authenticate"] == "Bearer"
    body = r.json()
    assert body["type"] == "/problems/unauthorized" and body["status"] == 401
    assert body["instance"] == f"urn:request:{r.headers['x-request-id']}"
    return body


def test_without_a_key_everything_is_open(client):
    assert client.post("/v1/collections", json={"name": "kb"}).status_code == 201
    assert client.get("/v1/collections").status_code == 200


@pytest.fixture
def locked(tmp_path, embedder):
    with _client(tmp_path, embedder, api_key=KEY) as c:
        assert (
            c.post("/v1/collections", json={"name": "kb"}, headers=AUTH).status_code
            == 201
        )
        yield c


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {KEY}x"},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": KEY},
        {"Authorization": "Bearer "},
    ],
)
def test_missing_or_wrong_key_is_401(locked, headers):
    _unauthorized(locked.get("/v1/collections", headers=headers))


def test_right_key_is_accepted(locked):
    assert locked.get("/v1/collections", headers=AUTH).status_code == 200
    lower = {"Authorization": f"bearer {KEY}"}
    assert locked.get("/v1/collections/kb", headers=lower).status_code == 200


def test_401_does_not_reveal_whether_a_collection_exists(locked):
    existing = _unauthorized(locked.get("/v1/collections/kb"))
    missing = _unauthorized(locked.get("/v1/collections/nope"))
    bad_name = _unauthorized(locked.get("/v1/collections/..%2Fetc"))
    bad_json = _unauthorized(
        locked.post(
            "/v1/collections/kb/search",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
    )
    strip = [
        {k: v for k, v in b.items() if k != "instance"}
        for b in (existing, missing, bad_name, bad_json)
    ]
    assert all(s == strip[0] for s in strip)
    # And nothing was written by unauthenticated writes.
    _unauthorized(
        locked.put(
            "/v1/collections/kb/documents",
            json={"documents": [{"id": "a", "text": "x"}]},
        )
    )
    assert locked.get("/v1/collections/kb", headers=AUTH).json()["documents"] == 0


def test_health_and_docs_public_by_default(locked):
    for path in ("/healthz", "/readyz", "/openapi.json", "/docs"):
        assert locked.get(path).status_code == 200, path
    schemes = locked.get("/openapi.json").json()["components"]["securitySchemes"]
    assert schemes["apiKey"]["scheme"] == "bearer"


def test_metrics_need_the_key_when_one_is_set(locked):
    """/metrics names collections and calibrators: private unless opted in."""
    _unauthorized(locked.get("/metrics"))
    r = locked.get("/metrics", headers=AUTH)
    assert r.status_code == 200 and 'collection="kb"' in r.text


def test_metrics_can_be_made_public(tmp_path, embedder):
    with _client(tmp_path, embedder, api_key=KEY, public_metrics=True) as c:
        assert c.get("/metrics").status_code == 200


def test_metrics_are_public_without_a_key(client):
    assert client.get("/metrics").status_code == 200


@pytest.mark.parametrize(
    "bad", ["", " ", f" {KEY}", f"{KEY}\n", f"{KEY}\t", "k\x7fy", "cl\u00e9"]
)
def test_unusable_keys_are_refused_at_settings(tmp_path, embedder, monkeypatch, bad):
    """An empty key would silently disable auth; a padded one can never match."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="api_key"):
        Settings(api_key=bad)
    monkeypatch.setenv("NORMCAL_API_KEY", bad)
    with pytest.raises(ValidationError, match="api_key"):
        create_app(Settings(), embedder=embedder)


def test_health_and_docs_can_be_protected(tmp_path, embedder):
    with _client(
        tmp_path, embedder, api_key=KEY, public_health=False, public_docs=False
    ) as c:
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"):
            _unauthorized(c.get(path))
            assert c.get(path, headers=AUTH).status_code == 200, path


def test_key_is_never_logged(tmp_path, embedder, caplog):
    caplog.set_level(logging.DEBUG)
    with _client(tmp_path, embedder, api_key=KEY) as c:
        c.get("/v1/collections", headers=AUTH)
        c.get("/v1/collections", headers={"Authorization": "Bearer guess"})
    assert KEY not in caplog.text
    assert KEY not in repr(Settings(api_key=KEY))


def test_bearer_token_parsing():
    assert bearer_token(b"Bearer abc") == b"abc"
    assert bearer_token(b"BEARER abc") == b"abc"
    assert bearer_token(None) is None
    assert bearer_token(b"Bearer ") is None
    assert bearer_token(b"Token abc") is None
