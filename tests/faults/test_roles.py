"""Issue 33, finding 10: one key opened everything. Keys with roles, against ``normcal serve``.

Real ``normcal serve`` subprocesses (real model, SQLite and FAISS) with a
``NORMCAL_API_KEYS_FILE``:

- every role's key against representative routes above its role (writes, fits,
  activation, drops, restores, imports, query-log settings), a key scoped to another
  collection, and unknown keys: each refused (403 naming the role needed, 404 for a
  collection out of scope, 401) and **nothing changed**: every collection's documents,
  calibrators, feedback, query log and snapshots, and a search's result;
- SIGHUP rotation: old and new keys both valid while the file lists both, a removed
  key refused after the reload, a broken file keeping the keys in use (the log says
  why), and no key in the server's log (which names the keys).

Nothing sleeps to synchronise: a reload is awaited by polling, with a deadline, for
what it changes (a key accepted or refused) or for its log line.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import assert_problem
from tests.support.corpus import CORPUS, QUERIES
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.server]

KEYS = {
    "read": "reader-0123456789abcdef",
    "judge": "judge-0123456789abcdef",
    "write": "writer-0123456789abcdef",
    "admin": "admin-0123456789abcdef",
}
SCOPED = "other-reader-0123456789abcdef"  # read, collections ["other"]
WAIT = 60.0  # bound on any wait for the server to act


def write_keys(path: Path, entries: list[dict[str, Any]]) -> None:
    """Replace the file whole (a temporary file, then a rename), as the docs say."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(entries))
    partial.chmod(0o600)
    os.replace(partial, path)


def role_entries() -> list[dict[str, Any]]:
    return [
        *(
            {"name": f"{role}-key", "key": key, "role": role}
            for role, key in KEYS.items()
        ),
        {
            "name": "other-reader",
            "key": SCOPED,
            "role": "read",
            "collections": ["other"],
        },
    ]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def fill(api: httpx.Client, name: str) -> None:
    admin = auth(KEYS["admin"])
    assert (
        api.post("/v1/collections", json={"name": name}, headers=admin).status_code
        == 201
    )
    docs = [{"id": key, "text": text} for key, text in CORPUS.items()]
    r = api.put(
        f"/v1/collections/{name}/documents", json={"documents": docs}, headers=admin
    )
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerProcess, Path]]:
    tmp = tmp_path_factory.mktemp("roles")
    keys = tmp / "keys.json"
    write_keys(keys, role_entries())
    env = {"NORMCAL_API_KEYS_FILE": str(keys), "NORMCAL_LOG_LEVEL": "INFO"}
    with (tmp / "server.log").open("wb") as log:
        proc = ServerProcess(tmp / "data", env=env, log=log).start()
        try:
            yield proc, tmp / "server.log"
        finally:
            proc.stop()


JUDGMENTS = [
    {"query": q, "document_id": doc, "relevance": int(doc == key)}
    for doc in CORPUS
    for key, q in QUERIES.items()
]


def everything(api: httpx.Client) -> dict[str, Any]:
    """Every collection's documents, calibrators, feedback, query log and snapshots,
    and a search's result, read with the admin key."""
    admin = auth(KEYS["admin"])
    seen: dict[str, Any] = {
        "collections": api.get("/v1/collections", headers=admin).json()
    }
    for name in ("kb", "other"):
        c = f"/v1/collections/{name}"
        seen[name] = {
            "info": api.get(c, headers=admin).json(),
            "documents": api.get(f"{c}/documents", headers=admin).json(),
            "calibrators": api.get(f"{c}/calibrators", headers=admin).json(),
            "feedback": api.get(f"{c}/feedback", headers=admin).json(),
            "query-log": api.get(f"{c}/query-log", headers=admin).json(),
            "snapshots": api.get(f"{c}/snapshots", headers=admin).json(),
            "search": api.post(
                f"{c}/search", json={"query": QUERIES["paris"], "k": 5}, headers=admin
            ).json()["hits"],
        }
    return seen


def test_each_key_is_refused_past_its_role_and_nothing_changes(server):
    proc, log = server
    with httpx.Client(base_url=proc.url, timeout=120) as api:
        admin = auth(KEYS["admin"])
        fill(api, "kb")
        fill(api, "other")
        r = api.post(
            "/v1/collections/kb/calibrators",
            json={"judgments": JUDGMENTS, "method": "platt"},
            headers=auth(KEYS["write"]),
        )
        assert r.status_code == 201, r.text
        calibrator = r.json()["id"]
        snapshot = api.post("/v1/collections/kb/snapshots", headers=admin).json()["id"]
        export = api.get(
            f"/v1/collections/kb/calibrators/{calibrator}/export", headers=admin
        ).json()
        before = everything(api)

        kb = "/v1/collections/kb"
        writes: list[tuple[str, str, Any, str]] = [  # method, path, body, role needed
            (
                "PUT",
                f"{kb}/documents",
                {"documents": [{"id": "aspirin", "text": "x"}]},
                "write",
            ),
            ("POST", f"{kb}/documents/delete", {"all": True}, "write"),
            ("DELETE", f"{kb}/documents/paris", None, "write"),
            ("PATCH", f"{kb}/documents/paris", {"metadata": {"a": 1}}, "write"),
            ("POST", f"{kb}/feedback", {"judgments": JUDGMENTS[:3]}, "judge"),
            ("POST", f"{kb}/judging/queries", {"queries": ["new query"]}, "judge"),
            ("POST", f"{kb}/judging/skip", {"query": QUERIES["paris"]}, "judge"),
            ("DELETE", f"{kb}/feedback", None, "write"),
            (
                "POST",
                f"{kb}/calibrators",
                {"judgments": JUDGMENTS, "method": "platt"},
                "write",
            ),
            (
                "POST",
                f"{kb}/fit-jobs",
                {"judgments": JUDGMENTS, "method": "platt"},
                "write",
            ),
            ("POST", f"{kb}/calibrators/default/activate", None, "write"),
            ("DELETE", f"{kb}/calibrators/{calibrator}", None, "write"),
            ("POST", f"{kb}/calibrators/import", {"profile": export}, "admin"),
            ("PUT", f"{kb}/query-log", {"enabled": True, "retention": 10}, "admin"),
            ("POST", f"{kb}/snapshots", None, "admin"),
            ("POST", f"{kb}/snapshots/{snapshot}/restore", None, "admin"),
            ("DELETE", f"{kb}/snapshots/{snapshot}", None, "admin"),
            ("DELETE", kb, None, "admin"),
            ("POST", "/v1/collections", {"name": "intruder"}, "admin"),
        ]
        order = list(KEYS)
        refused = 0
        for role, key in KEYS.items():
            for method, path, body, needed in writes:
                if order.index(role) >= order.index(needed):
                    continue
                r = api.request(method, path, json=body, headers=auth(key))
                problem = assert_problem(r, 403)
                assert problem["role"] == needed, (role, method, path)
                assert f"has the {role} role" in problem["detail"]
                refused += 1
        # read: all 19; judge: the 9 write and 7 admin ones; write: the 7 admin ones.
        assert refused == 19 + 16 + 7

        # A key scoped to "other" gets for kb what an unknown collection gets.
        for method, path, body in [
            ("POST", f"{kb}/search", {"query": "paris"}),
            ("GET", f"{kb}/documents", None),
            ("POST", f"{kb}/documents/get", {"ids": ["paris"]}),
            ("GET", f"{kb}/calibrators/{calibrator}/export", None),
        ]:
            r = api.request(method, path, json=body, headers=auth(SCOPED))
            assert assert_problem(r, 404)["detail"] == "collection 'kb' does not exist"
        listed = api.get("/v1/collections", headers=auth(SCOPED)).json()
        assert [c["name"] for c in listed["data"]] == ["other"]
        assert assert_problem(api.get("/metrics", headers=auth(SCOPED)), 403)

        # Unknown keys, and none: 401 on every one of those routes.
        for key in ("unknown-key-0123456789", KEYS["admin"] + "0", ""):
            headers = auth(key) if key else {}
            for method, path, body, _ in writes:
                r = api.request(method, path, json=body, headers=headers)
                assert assert_problem(r, 401)["type"] == "/problems/unauthorized"

        assert everything(api) == before

        # Each key does what its role allows.
        r = api.post(
            f"{kb}/search",
            json={"query": QUERIES["paris"], "k": 5},
            headers=auth(KEYS["read"]),
        )
        assert r.status_code == 200 and r.json()["hits"] == before["kb"]["search"]
        r = api.post(
            f"{kb}/feedback",
            json={"judgments": JUDGMENTS[:3]},
            headers=auth(KEYS["judge"]),
        )
        assert r.status_code == 201, r.text
        r = api.get(f"{kb}/judging/next", headers=auth(KEYS["judge"]))
        assert r.status_code == 200, r.text
        r = api.put(
            f"{kb}/documents",
            json={"documents": [{"id": "new", "text": "a new document"}]},
            headers=auth(KEYS["write"]),
        )
        assert (
            r.status_code == 200 and api.get(kb, headers=admin).json()["documents"] == 6
        )
    # The log names the keys that were used, never a key.
    text = log.read_text()
    assert '"key": "judge-key"' in text and '"key": "other-reader"' in text
    assert not [k for k in [*KEYS.values(), SCOPED] if k in text]


def test_sighup_rotates_keys_without_a_restart(tmp_path):
    keys = tmp_path / "keys.json"
    old, new = "old-reader-0123456789abcdef", "new-reader-0123456789abcdef"
    ops = {"name": "ops", "key": KEYS["admin"], "role": "admin"}
    old_entry = {"name": "old-reader", "key": old, "role": "read"}
    new_entry = {"name": "new-reader", "key": new, "role": "read"}
    write_keys(keys, [old_entry, ops])
    env = {"NORMCAL_API_KEYS_FILE": str(keys), "NORMCAL_LOG_LEVEL": "INFO"}
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        proc = ServerProcess(tmp_path / "data", env=env, log=log).start()
        try:
            with httpx.Client(base_url=proc.url, timeout=120) as api:
                fill(api, "kb")
                query = {"query": QUERIES["paris"], "k": 3}

                def status(key: str) -> int:
                    r = api.post(
                        "/v1/collections/kb/search", json=query, headers=auth(key)
                    )
                    return r.status_code

                hits = api.post(
                    "/v1/collections/kb/search", json=query, headers=auth(old)
                ).json()["hits"]
                assert status(old) == 200 and status(new) == 401

                def hup() -> None:
                    assert proc.proc is not None
                    proc.proc.send_signal(signal.SIGHUP)

                # Rotation: while the file lists both, both are valid.
                write_keys(keys, [old_entry, new_entry, ops])
                hup()
                until(lambda: status(new) == 200, "the new key after SIGHUP")
                assert status(old) == 200
                # The old key removed: refused after the reload.
                write_keys(keys, [new_entry, ops])
                hup()
                until(lambda: status(old) == 401, "the old key refused after SIGHUP")
                assert status(new) == 200

                # A broken file (bad JSON, then a rule broken) keeps the keys in use.
                for broken in ("[{", json.dumps([new_entry, {**ops, "key": "tiny"}])):
                    kept = log_path.read_text().count("kept the api keys in use")
                    keys.write_text(broken)
                    hup()
                    until(
                        lambda n=kept: (
                            log_path.read_text().count("kept the api keys in use") > n
                        ),
                        "the reload's refusal in the log",
                    )
                    assert status(new) == 200 and status(old) == 401
                    assert status(KEYS["admin"]) == 200
                assert proc.proc is not None
                assert proc.proc.poll() is None  # still serving

                after = api.post(
                    "/v1/collections/kb/search", json=query, headers=auth(new)
                ).json()["hits"]
                assert after == hits
                info = api.get("/v1/collections/kb", headers=auth(KEYS["admin"])).json()
                assert info["documents"] == len(CORPUS)
        finally:
            proc.stop()
    text = log_path.read_text()
    assert "added new-reader; removed none" in text
    assert "added none; removed old-reader" in text
    assert "entry 2 ('ops'), field key: String should have at least 16" in text
    assert not [k for k in (old, new, KEYS["admin"], "tiny") if k in text]
