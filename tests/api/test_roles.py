"""API keys with roles: every route against every role, scopes, the keys file's rules.

The route table is read from the app itself (:func:`app.api.auth.check_route_roles`,
FastAPI's routes), so a route added without a declared role fails here (and in
``create_app``), and a route whose role changes changes the docs table, which is
checked here too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi import APIRouter
from fastapi.testclient import TestClient
from pydantic import SecretStr

from app.api import auth
from app.api.app import create_app
from app.api.auth import READ, WRITE, check_route_roles
from app.api.keys import (
    KEY_MAX_CHARS,
    KEY_MIN_CHARS,
    KEYS_FILE_MAX_BYTES,
    MAX_KEY_COLLECTIONS,
    MAX_KEYS,
    Keyring,
    KeysFileError,
    parse_keys,
)
from app.schemas.keys import Role
from app.settings import Settings
from tests.support.server import source_env

pytestmark = pytest.mark.fake_embedder

REPO = Path(__file__).resolve().parents[2]
KEYS = {role: f"{role}-key-0123456789abcdef" for role in Role}
SCOPED_READ = "scoped-read-0123456789abcdef"  # read, collections ["kb"]
SCOPED_ADMIN = "scoped-admin-0123456789abcdef"  # admin, collections ["kb", "kb2"]
ENV_KEY = "the-env-admin-key-0123456789"
ALL_KEYS = [*KEYS.values(), SCOPED_READ, SCOPED_ADMIN, ENV_KEY]
SNAPSHOT_ID = "20250101T000000000Z-0123abcd"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def entries() -> list[dict[str, object]]:
    listed: list[dict[str, object]] = [
        {"name": f"{role}-key", "key": key, "role": role} for role, key in KEYS.items()
    ]
    listed[0] = {  # the read key by its digest, as an operator may list it
        "name": "read-key",
        "key_sha256": hashlib.sha256(KEYS[Role.READ].encode()).hexdigest(),
        "role": "read",
    }
    listed.append(
        {"name": "kb-reader", "key": SCOPED_READ, "role": "read", "collections": ["kb"]}
    )
    listed.append(
        {
            "name": "kb-admin",
            "key": SCOPED_ADMIN,
            "role": "admin",
            "collections": ["kb", "kb2"],
        }
    )
    return listed


def write_keys(path: Path, listed: object) -> Path:
    path.write_text(json.dumps(listed))
    path.chmod(0o600)
    return path


def locked_settings(tmp_path: Path, **kw: object) -> Settings:
    """Every path needs a key: the route table is checked without public paths."""
    return Settings(
        data_dir=tmp_path / "data",
        api_keys_file=write_keys(tmp_path / "keys.json", entries()),
        public_health=False,
        public_docs=False,
        public_ui=False,
        **kw,
    )


@pytest.fixture
def locked(tmp_path, embedder):
    with TestClient(create_app(locked_settings(tmp_path), embedder=embedder)) as c:
        admin = bearer(KEYS[Role.ADMIN])
        for name in ("kb", "other"):
            r = c.post("/v1/collections", json={"name": name}, headers=admin)
            assert r.status_code == 201, r.text
            docs = [{"id": "d1", "text": f"{name} first"}, {"id": "d2", "text": "x"}]
            r = c.put(
                f"/v1/collections/{name}/documents",
                json={"documents": docs},
                headers=admin,
            )
            assert r.status_code == 200, r.text
        yield c


# ------------------------------------------------------------ every route, every role


def concrete(path: str, collection: str) -> str:
    """A route's path with its parameters filled (a new parameter fails: add it)."""
    values = {
        "name": collection,
        "doc_id": "d1",
        "calibrator_id": "default",
        "snapshot_id": SNAPSHOT_ID,
        "job_id": "job1",
        "file": "judge.js" if path.startswith("/ui/") else "favicon.png",
    }
    return re.sub(r"\{(\w+)(:path)?\}", lambda m: values[m.group(1)], path)


def send(client: TestClient, route: str, collection: str, key: str | None):
    method, path = route.split(" ", 1)
    body = {} if method in {"POST", "PUT", "PATCH"} else None
    headers = bearer(key) if key is not None else {}
    return client.request(
        method, concrete(path, collection), json=body, headers=headers
    )


def state(client: TestClient) -> dict[str, object]:
    """What a refused request must not change."""
    admin = bearer(KEYS[Role.ADMIN])
    out: dict[str, object] = {}
    for name in ("kb", "other"):
        out[name] = client.get(f"/v1/collections/{name}", headers=admin).json()
        out[f"{name}/docs"] = client.get(
            f"/v1/collections/{name}/documents", headers=admin
        ).json()
        out[f"{name}/feedback"] = client.get(
            f"/v1/collections/{name}/feedback", headers=admin
        ).json()["data"]
        out[f"{name}/log"] = client.get(
            f"/v1/collections/{name}/query-log", headers=admin
        ).json()
    out["collections"] = client.get("/v1/collections", headers=admin).json()
    return out


def test_the_route_table_is_read_from_the_app(locked):
    roles = check_route_roles(locked.app)
    assert roles["POST /v1/collections/{name}/search"].role is Role.READ
    assert roles["DELETE /v1/collections/{name}"].role is Role.ADMIN
    assert roles["GET /openapi.json"].role is Role.READ
    assert roles["GET /metrics"].every_collection
    assert len(roles) >= 50


def test_every_route_refuses_the_roles_below_its_own(locked):
    """Each role's key against each route: 403 naming the role needed, or served."""
    before = state(locked)
    wrong = []
    for route, check in check_route_roles(locked.app).items():
        for role, key in KEYS.items():
            allowed = role.allows(check.role)
            # Allowed: an unknown collection (or an empty body) ends it in the
            # handler or the validation, after the role check, changing nothing.
            r = send(locked, route, "kb" if not allowed else "nope", key)
            if allowed and r.status_code in (401, 403):
                wrong.append(f"{route} refused {role}: {r.status_code} {r.text}")
            elif not allowed and (
                r.status_code != 403
                or r.json()["type"] != "/problems/forbidden"
                or r.json()["role"] != check.role
                or f"needs the {check.role} role" not in r.json()["detail"]
            ):
                wrong.append(f"{route} served {role}: {r.status_code} {r.text}")
    assert wrong == []
    assert state(locked) == before


@pytest.mark.parametrize("key", [None, "not-a-key-0123456789", KEYS[Role.ADMIN] + "x"])
def test_every_route_refuses_an_unknown_key(locked, key):
    before = state(locked)
    wrong = [
        route
        for route in check_route_roles(locked.app)
        if send(locked, route, "kb", key).status_code != 401
    ]
    assert wrong == []
    assert state(locked) == before


def test_a_route_without_a_declared_role_fails_loudly(settings, embedder):
    app = create_app(settings, embedder=embedder)
    router = APIRouter()

    @router.get("/forgotten")
    def forgotten() -> dict[str, str]:
        return {}

    @router.get("/twice", dependencies=[READ, WRITE])
    def twice() -> dict[str, str]:
        return {}

    app.include_router(router, prefix="/v1")
    with pytest.raises(RuntimeError) as raised:
        check_route_roles(app)
    assert "GET /v1/forgotten (0 roles)" in str(raised.value)
    assert "GET /v1/twice (2 roles)" in str(raised.value)
    assert "dependencies=[READ]" in str(raised.value)


def test_the_403_problem(locked):
    r = locked.post(
        "/v1/collections/kb/calibrators",
        json={"method": "auto", "include_feedback": True},
        headers=bearer(KEYS[Role.JUDGE]),
    )
    assert r.status_code == 403
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["title"] == "Forbidden" and body["role"] == "write"
    assert body["detail"] == (
        "key 'judge-key' has the judge role; POST /v1/collections/kb/calibrators "
        "needs the write role or a higher one"
    )
    assert body["instance"] == f"urn:request:{r.headers['x-request-id']}"


def test_a_judge_key_takes_back_one_judgment_but_deletes_no_other_feedback(locked):
    """The judging page's undo works with the key that judged; wider deletes do not."""
    judge = bearer(KEYS[Role.JUDGE])
    judgments = [
        {"query": "q", "document_id": "d1", "relevance": 1},
        {"query": "q", "document_id": "d2", "relevance": 0},
    ]
    url = "/v1/collections/kb/feedback"
    assert locked.post(url, json={"judgments": judgments}, headers=judge).is_success
    assert locked.delete(url, headers=judge).status_code == 403
    assert locked.delete(url, params={"query": "q"}, headers=judge).status_code == 403
    undo = "/v1/collections/kb/judging/judgment"
    r = locked.delete(undo, params={"query": "q", "document_id": "d1"}, headers=judge)
    assert r.status_code == 200 and r.json()["deleted"] == 1, r.text
    left = locked.get(url, headers=judge).json()["data"]
    assert [(j["query"], j["document_id"]) for j in left] == [("q", "d2")]
    assert locked.delete(undo, params={"query": "q"}, headers=judge).status_code == 422


# ------------------------------------------------------------ keys scoped to collections


def test_a_scoped_key_sees_only_its_collections(locked):
    reader = bearer(SCOPED_READ)
    listed = locked.get("/v1/collections", headers=reader).json()
    assert [c["name"] for c in listed["data"]] == ["kb"] and listed["count"] == 1
    assert locked.get("/v1/collections/kb", headers=reader).status_code == 200
    r = locked.post("/v1/collections/kb/search", json={"query": "x"}, headers=reader)
    assert r.status_code == 200
    # Another collection answers what an unknown one does: its name is not leaked.
    other = locked.get("/v1/collections/other", headers=reader)
    ghost = locked.get("/v1/collections/ghost", headers=reader)
    unknown = locked.get("/v1/collections/ghost", headers=bearer(KEYS[Role.READ]))
    assert other.status_code == ghost.status_code == unknown.status_code == 404
    assert other.json()["detail"] == "collection 'other' does not exist"
    assert ghost.json()["detail"] == unknown.json()["detail"]
    for path in ("search", "documents/get"):
        r = locked.post(f"/v1/collections/other/{path}", json={}, headers=reader)
        assert r.status_code == 404, (path, r.text)
    # Its role still counts inside its collections.
    r = locked.put(
        "/v1/collections/kb/documents",
        json={"documents": [{"id": "new", "text": "y"}]},
        headers=reader,
    )
    assert r.status_code == 403 and r.json()["role"] == "write"
    # Paths that name every collection are not for it.
    metrics = locked.get("/metrics", headers=reader)
    assert metrics.status_code == 403 and "role" not in metrics.json()
    assert locked.get("/readyz", headers=reader).json()["collections"] is None
    ready = locked.get("/readyz", headers=bearer(KEYS[Role.READ])).json()
    assert ready["collections"] == 2


def test_a_scoped_key_reranks_only_with_its_collections(locked):
    """The collection a rerank body names is checked as a path's name is."""
    admin, reader = bearer(KEYS[Role.ADMIN]), bearer(SCOPED_READ)
    for name in ("kb", "other"):  # logged requests would show in state()
        r = locked.put(
            f"/v1/collections/{name}/query-log", json={"enabled": True}, headers=admin
        )
        assert r.status_code == 200, r.text
    before = state(locked)
    body = {"query": "first", "documents": ["other first", "x"]}
    refused = {}
    for name in ("other", "ghost"):
        r = locked.post("/v1/rerank", json=body | {"collection": name}, headers=reader)
        assert r.status_code == 404, r.text
        refused[name] = r.json()["detail"]
    assert refused["other"] == "collection 'other' does not exist"
    unknown = locked.post(
        "/v1/rerank",
        json=body | {"collection": "ghost"},
        headers=bearer(KEYS[Role.READ]),
    )
    assert unknown.json()["detail"] == refused["ghost"]
    assert state(locked) == before  # nothing logged in 'other'
    # Without a collection (the shipped default) and with its own: served.
    assert locked.post("/v1/rerank", json=body, headers=reader).status_code == 200
    r = locked.post("/v1/rerank", json=body | {"collection": "kb"}, headers=reader)
    assert r.status_code == 200, r.text
    log = locked.get("/v1/collections/kb/query-log", headers=reader).json()
    assert log["entries"] == 1
    r = locked.post("/v1/embeddings", json={"input": "x"}, headers=reader)
    assert r.status_code == 200, r.text


def test_a_scoped_admin_creates_and_drops_only_its_collections(locked):
    before = state(locked)
    admin = bearer(SCOPED_ADMIN)
    r = locked.post("/v1/collections", json={"name": "elsewhere"}, headers=admin)
    assert r.status_code == 403 and "cannot create 'elsewhere'" in r.json()["detail"]
    assert locked.delete("/v1/collections/other", headers=admin).status_code == 404
    r = locked.put(
        "/v1/collections/other/documents",
        json={"documents": [{"id": "d1", "text": "overwritten"}]},
        headers=admin,
    )
    assert r.status_code == 404
    assert state(locked) == before
    assert (
        locked.post("/v1/collections", json={"name": "kb2"}, headers=admin).status_code
        == 201
    )
    assert locked.delete("/v1/collections/kb2", headers=admin).status_code == 204


def test_the_key_endpoint_says_who_a_key_is(locked, client):
    r = locked.get("/v1/key", headers=bearer(SCOPED_READ))
    assert r.json() == {
        "auth": True,
        "name": "kb-reader",
        "role": "read",
        "collections": ["kb"],
    }
    judge = locked.get("/v1/key", headers=bearer(KEYS[Role.JUDGE])).json()
    assert judge["role"] == "judge" and judge["collections"] is None
    assert client.get("/v1/key").json() == {
        "auth": False,
        "name": None,
        "role": "admin",
        "collections": None,
    }


# ------------------------------------------------------------------ public paths


def test_public_paths_stay_public_and_read_only(tmp_path, embedder):
    settings = Settings(
        data_dir=tmp_path / "data",
        api_keys_file=write_keys(tmp_path / "keys.json", entries()),
    )
    with TestClient(create_app(settings, embedder=embedder)) as c:
        for path in (
            "/healthz",
            "/readyz",
            "/openapi.json",
            "/docs",
            "/ui/static/judge.js",
        ):
            assert c.get(path).status_code == 200, path
        assert c.get("/metrics").status_code == 401  # names collections: a key
        assert c.get("/metrics", headers=bearer(KEYS[Role.READ])).status_code == 200
        assert c.get("/version").status_code == 401
        # A wrong key on a public path is anonymous there, as no key is.
        assert (
            c.get("/healthz", headers=bearer("wrong-key-0123456789")).status_code == 200
        )
    public = Settings(
        data_dir=tmp_path / "data2",
        api_keys_file=tmp_path / "keys.json",
        public_metrics=True,
    )
    with TestClient(create_app(public, embedder=embedder)) as c:
        assert c.get("/metrics").status_code == 200


def test_an_anonymous_request_passes_only_read_routes():
    """Public paths are read-only: were one ever a write route, no key is 401."""
    import asyncio

    from starlette.requests import Request

    from app.api.keys import ANONYMOUS
    from app.exceptions import UnauthorizedError

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/ui/x",
        "headers": [],
        "state": {"key": ANONYMOUS},
        "path_params": {},
    }
    asyncio.run(auth.RoleCheck(Role.READ)(Request(scope)))
    with pytest.raises(UnauthorizedError):
        asyncio.run(auth.RoleCheck(Role.JUDGE)(Request(scope)))


# ------------------------------------------------------------ NORMCAL_API_KEY with a file


def test_the_env_key_is_one_more_admin_key(tmp_path, embedder):
    settings = locked_settings(tmp_path, api_key=ENV_KEY)
    with TestClient(create_app(settings, embedder=embedder)) as c:
        me = c.get("/v1/key", headers=bearer(ENV_KEY)).json()
        assert me == {
            "auth": True,
            "name": "NORMCAL_API_KEY",
            "role": "admin",
            "collections": None,
        }
        assert c.get("/v1/key", headers=bearer(KEYS[Role.JUDGE])).status_code == 200


def test_the_file_may_not_repeat_the_env_key(tmp_path):
    listed = [{"name": "again", "key": ENV_KEY, "role": "read"}]
    path = write_keys(tmp_path / "keys.json", listed)
    with pytest.raises(KeysFileError, match="'again' holds the key of NORMCAL_API_KEY"):
        Keyring(api_key=SecretStr(ENV_KEY), path=path)


# ------------------------------------------------------------ the keys file's rules


def one(**entry: object) -> bytes:
    return json.dumps([{"name": "k", "role": "read", **entry}]).encode()


GOOD_KEY = "k" * KEY_MIN_CHARS


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{not json", "not JSON: Expecting property name"),
        (b"\xff\xfe[]", "not UTF-8"),
        (b'{"keys": []}', "must be a JSON list of keys"),
        (b"[" * 100_000 + b"]" * 100_000, "not usable JSON"),
        (one(), "entry 1 ('k'): give exactly one of key and key_sha256"),
        (
            one(key=GOOD_KEY, key_sha256="0" * 64),
            "give exactly one of key and key_sha256",
        ),
        (one(key="k" * (KEY_MIN_CHARS - 1)), "field key: String should have at least"),
        (one(key="k" * (KEY_MAX_CHARS + 1)), "field key: String should have at most"),
        (one(key="with a space-0123456789"), "must be printable ASCII without spaces"),
        (one(key="clé-0123456789abcdef"), "must be printable ASCII without spaces"),
        (one(key_sha256="0" * 63), "must be 64 hex digits"),
        (one(key=GOOD_KEY, role="owner"), "field role: Input should be 'read'"),
        (one(key=GOOD_KEY, collections=[]), "field collections: List should have at"),
        (one(key=GOOD_KEY, collections=["a/b"]), "field collections[0]: must be a"),
        (one(key=GOOD_KEY, colections=["kb"]), "field colections: unknown"),
        (
            json.dumps([{"name": "n" * 65, "key": GOOD_KEY, "role": "read"}]).encode(),
            "entry 1, field name: must be letters",
        ),
        (
            b'[{"name": "k", "key": "' + GOOD_KEY.encode() + b'", "role": "read",'
            b' "role": "admin"}]',
            "field role appears twice in one object",
        ),
        (
            json.dumps(
                [
                    {"name": "k", "key": GOOD_KEY, "role": "read"},
                    {"name": "k", "key": GOOD_KEY + "2", "role": "read"},
                ]
            ).encode(),
            "the name 'k' is given to 2 entries",
        ),
        (
            json.dumps(
                [
                    {"name": "a", "key": GOOD_KEY, "role": "read"},
                    {
                        "name": "b",
                        "key_sha256": hashlib.sha256(GOOD_KEY.encode()).hexdigest(),
                        "role": "admin",
                    },
                ]
            ).encode(),
            "entries 'a' and 'b' hold the same key",
        ),
    ],
    ids=lambda v: v[:40] if isinstance(v, str) else None,
)
def test_a_bad_file_is_refused_in_one_line_without_its_keys(data, reason):
    with pytest.raises(KeysFileError) as raised:
        parse_keys(data)
    message = str(raised.value)
    assert reason in message
    assert "\n" not in message and len(message) < 400
    assert GOOD_KEY not in message and "0123456789" not in message


def test_a_key_pasted_as_a_field_name_is_not_shown():
    data = json.dumps(
        [{"name": "k", "key": GOOD_KEY, "role": "read", "sk-live-0123456789/=": 1}]
    )
    with pytest.raises(KeysFileError) as raised:
        parse_keys(data.encode())
    assert "sk-live" not in str(raised.value) and "a field: unknown" in str(
        raised.value
    )


def test_limits_at_the_bound_and_one_past():
    # Keys: 16 and 256 characters are accepted (15 and 257 refused above).
    assert parse_keys(one(key="k" * KEY_MIN_CHARS))[0].key == "k" * KEY_MIN_CHARS
    assert parse_keys(one(key="k" * KEY_MAX_CHARS))
    # Entries.
    many = [
        {"name": f"k{i}", "key": f"key-{i:012d}-abcd", "role": "read"}
        for i in range(MAX_KEYS + 1)
    ]
    assert len(parse_keys(json.dumps(many[:MAX_KEYS]).encode())) == MAX_KEYS
    with pytest.raises(
        KeysFileError, match=f"the list: List should have at most {MAX_KEYS}"
    ):
        parse_keys(json.dumps(many).encode())
    # Collections of one key.
    names = [f"c{i}" for i in range(MAX_KEY_COLLECTIONS + 1)]
    assert parse_keys(one(key=GOOD_KEY, collections=names[:MAX_KEY_COLLECTIONS]))
    with pytest.raises(
        KeysFileError, match="field collections: List should have at most"
    ):
        parse_keys(one(key=GOOD_KEY, collections=names))
    # Bytes: white space pads a good file to the cap exactly, then one past it.
    good = one(key=GOOD_KEY)
    assert parse_keys(good + b" " * (KEYS_FILE_MAX_BYTES - len(good)))
    with pytest.raises(KeysFileError, match=f"larger than {KEYS_FILE_MAX_BYTES} bytes"):
        parse_keys(good + b" " * (KEYS_FILE_MAX_BYTES - len(good) + 1))


def test_a_bad_file_fails_create_app(tmp_path, embedder):
    settings = Settings(
        data_dir=tmp_path / "data",
        api_keys_file=write_keys(tmp_path / "keys.json", [{"name": "k"}]),
    )
    with pytest.raises(KeysFileError, match="entry 1"):
        create_app(settings, embedder=embedder)


@pytest.mark.slow  # starts a Python process
def test_normcal_serve_refuses_a_bad_file_in_one_line(tmp_path):
    path = write_keys(
        tmp_path / "keys.json",
        [{"name": "ops", "key": "short-secret", "role": "admin"}],
    )
    out = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--port", "0"],
        env=source_env(
            NORMCAL_API_KEYS_FILE=str(path),
            NORMCAL_DATA_DIR=str(tmp_path / "data"),
            HF_HUB_OFFLINE="1",
        ),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert lines == [
        f"normcal: invalid settings: NORMCAL_API_KEYS_FILE {path}: entry 1 ('ops'), "
        "field key: String should have at least 16 characters"
    ]
    assert "short-secret" not in out.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was opened


# ------------------------------------------------------------ reloading (SIGHUP's work)


def test_reload_swaps_the_keys_or_keeps_them(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    path = write_keys(tmp_path / "keys.json", entries())
    keyring = Keyring(api_key=None, path=path)
    judge = f"Bearer {KEYS[Role.JUDGE]}".encode()
    fresh = "fresh-judge-0123456789abcdef"
    assert keyring.authenticate(judge) is not None
    # Rotation: both listed, both valid.
    rotated = [*entries(), {"name": "fresh", "key": fresh, "role": "judge"}]
    write_keys(path, rotated)
    assert keyring.reload()
    assert keyring.authenticate(judge) is not None
    assert keyring.authenticate(f"Bearer {fresh}".encode()) is not None
    # The old one removed: refused after the reload.
    write_keys(path, [e for e in rotated if e["name"] != "judge-key"])
    assert keyring.reload()
    assert keyring.authenticate(judge) is None
    assert "added none; removed judge-key" in caplog.text
    # A broken file: the keys in use stay, and the log says why.
    for broken in ("[{", json.dumps([{"name": "x", "key": "short", "role": "read"}])):
        path.write_text(broken)
        assert not keyring.reload()
        assert keyring.authenticate(f"Bearer {fresh}".encode()) is not None
    path.unlink()
    assert not keyring.reload()
    assert keyring.authenticate(f"Bearer {fresh}".encode()) is not None
    assert "kept the api keys in use" in caplog.text and "cannot be read" in caplog.text
    assert all(key not in caplog.text for key in [*ALL_KEYS, fresh, "short"])


def test_plain_keys_in_a_readable_file_are_warned_of(tmp_path, caplog):
    path = write_keys(tmp_path / "keys.json", entries())
    path.chmod(0o644)
    Keyring(api_key=None, path=path)
    assert "readable by others (mode 644)" in caplog.text


def test_keys_are_never_logged_but_their_names_are(tmp_path, embedder, caplog):
    caplog.set_level(logging.DEBUG)
    settings = locked_settings(tmp_path, api_key=ENV_KEY)
    with TestClient(create_app(settings, embedder=embedder)) as c:
        for key in ALL_KEYS:
            c.get("/v1/collections", headers=bearer(key))
            c.post("/v1/collections", json={"name": "x y"}, headers=bearer(key))
            c.get("/v1/collections", headers=bearer(key + "x"))
    assert all(key not in caplog.text for key in ALL_KEYS)
    access = [r for r in caplog.records if r.name == "normcal.access"]
    assert {getattr(r, "key", None) for r in access} == {
        None,  # the wrong keys
        "NORMCAL_API_KEY",
        "kb-reader",
        "kb-admin",
        *(f"{role}-key" for role in Role),
    }


# ------------------------------------------------------------ the docs' table


def roles_table(roles: dict[str, auth.RoleCheck]) -> list[str]:
    """The table of docs/production.md#routes-by-role, from the route table."""
    public = {
        "NORMCAL_PUBLIC_HEALTH": auth.HEALTH_PATHS,
        "NORMCAL_PUBLIC_METRICS": auth.METRICS_PATHS,
        "NORMCAL_PUBLIC_DOCS": auth.DOCS_PATHS,
        "NORMCAL_PUBLIC_UI": auth.UI_PATHS,
    }
    defaults = Settings.model_fields
    rows = ["| route | role |", "|---|---|"]
    for route, check in roles.items():
        path = route.split(" ", 1)[1]
        needs = check.role.value
        if check.every_collection:
            needs += ", a key for every collection"
        for setting, paths in public.items():
            if any(
                path == p or (auth.is_prefix(p) and path.startswith(p)) for p in paths
            ):
                field = setting.removeprefix("NORMCAL_").lower()
                if defaults[field].default:
                    needs += f"; public unless `{setting}=false`"
                else:
                    needs += f"; public with `{setting}=true`"
        rows.append(f"| `{route.replace(':path}', '}')}` | {needs} |")
    return rows


def test_the_docs_table_of_routes_by_role_follows_the_code(app):
    text = (REPO / "docs" / "production.md").read_text()
    start = text.index("\n### Routes by role\n")
    table = [
        line
        for line in text[start:].split("\n\n", 3)[2].splitlines()
        if line.startswith("|")
    ]
    expected = roles_table(check_route_roles(app))
    assert table == expected, "\n".join(["docs/production.md should read:", *expected])
