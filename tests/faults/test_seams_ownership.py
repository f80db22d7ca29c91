"""Acknowledged writes lost at the seams (issue 21, defects 1-3), against real servers.

1. ``normcal restore`` into the data dir of a running server exited 0 and swapped the
   file under it: an upsert it had answered 200 was gone after shutdown.
2. A second ``normcal serve`` on the same data dir started; its writes never reached
   the first one's FAISS index.
3. A crafted snapshot restored with 200: an extra ``AFTER INSERT`` trigger deleted
   every later upsert, a mistyped ``query_log`` in meta made every search 500.

Every test runs against ``normcal serve`` subprocesses (the real model, SQLite, FTS5,
FAISS, HTTP), sharing one data dir and one server per module; each leaves a server
running on it. "Nothing changed" is the collection's counts (SQLite = FTS5 = FAISS =
the documents acknowledged) and a search's hits.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.cli.main import EXIT_BUSY
from tests.conftest import alter_sqlite, assert_problem
from tests.support.server import ServerProcess, run_cli

pytestmark = pytest.mark.server

URL = "/v1/collections/kb"
SNAPS = f"{URL}/snapshots"
QUERY = {"query": "which instrument has eighty-eight keys?", "k": 3}
CORPUS = [
    {"id": "piano", "text": "The piano has eighty-eight keys."},
    {"id": "volcano", "text": "Lava flows from an erupting volcano."},
    {"id": "coffee", "text": "Espresso is brewed under pressure."},
    {"id": "glacier", "text": "Glaciers carve U-shaped valleys."},
]


class Owner:
    """The module's server on its data dir, and the ids it acknowledged."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.server = ServerProcess(data).start()
        self.ids: set[str] = set()

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.server.url, timeout=120)

    def upsert(self, c: httpx.Client, *docs: dict[str, Any]) -> None:
        r = c.put(f"{URL}/documents", json={"documents": list(docs)})
        assert r.status_code == 200, r.text
        self.ids.update(d["id"] for d in docs)

    def assert_all_acknowledged(self, c: httpx.Client) -> None:
        """SQLite = FTS5 = FAISS = every document acknowledged, each readable."""
        info = c.get(URL).json()
        counts = (info["documents"], info["lexical_indexed"], info["indexed"])
        assert counts == (len(self.ids),) * 3, info
        for doc_id in sorted(self.ids):
            assert c.get(f"{URL}/documents/{doc_id}").status_code == 200, doc_id


@pytest.fixture(scope="module")
def owner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Owner]:
    owner = Owner(tmp_path_factory.mktemp("seams") / "data")
    try:
        with owner.client() as c:
            assert c.post("/v1/collections", json={"name": "kb"}).status_code == 201
            owner.upsert(c, *CORPUS)
        yield owner
    finally:
        owner.server.stop()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=120)


def _one_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("normcal: "), (
        out.stderr
    )
    assert "Traceback" not in out.stderr
    return out.stderr


def _state(c: httpx.Client) -> tuple[Any, ...]:
    info = c.get(URL).json()
    r = c.post(f"{URL}/search", json=QUERY)
    assert r.status_code == 200, r.text
    hits = [(h["id"], h["score"], h["probability"]) for h in r.json()["hits"]]
    return info["documents"], info["lexical_indexed"], info["indexed"], hits


def test_offline_restore_into_a_served_dir_is_refused_and_acked_writes_survive(
    owner: Owner,
):
    """Defect 1."""
    with owner.client() as c:
        snap = c.post(SNAPS).json()
        backup = owner.data.parent / "kb-backup.sqlite3"
        backup.write_bytes(c.get(f"{SNAPS}/{snap['id']}").content)
        owner.upsert(c, {"id": "late", "text": "Written after the snapshot."})
    out = _cli(
        "restore", str(backup), "--collection", "kb", "--data-dir", str(owner.data)
    )
    assert out.returncode == EXIT_BUSY
    line = _one_line(out)
    assert f"pid {owner.server.proc.pid} (normcal serve)" in line
    assert "POST /v1/collections/kb/snapshots/{id}/restore" in line
    owner.server.stop()  # SIGTERM: the graceful shutdown
    owner.server.start()
    with owner.client() as c:
        owner.assert_all_acknowledged(c)  # "late" included


def test_a_second_server_is_refused_and_a_killed_owner_frees_the_dir(owner: Owner):
    """Defect 2."""
    with owner.client() as c:
        for i in range(3):
            owner.upsert(c, {"id": f"acked-{i}", "text": f"Acknowledged record {i}."})
    second = _cli("serve", "--port", "0", "--data-dir", str(owner.data))
    assert second.returncode == EXIT_BUSY
    line = _one_line(second)
    assert f"pid {owner.server.proc.pid} (normcal serve)" in line
    assert "one server per data dir" in line
    owner.server.kill()  # SIGKILL: no handler runs; the kernel drops the lock
    owner.server.start()
    with owner.client() as c:
        owner.assert_all_acknowledged(c)


@pytest.mark.parametrize(
    ("statement", "problem"),
    [
        (
            "CREATE TRIGGER eat AFTER INSERT ON documents BEGIN "
            "DELETE FROM documents WHERE seq = new.seq; END",
            "schema differs: extra trigger 'eat'",
        ),
        (
            "INSERT OR REPLACE INTO meta(key, value) VALUES "
            """('query_log', '{"enabled": "yes please", "retention": -4}')""",
            "meta 'query_log.enabled': Input should be a valid boolean",
        ),
    ],
    ids=["extra-trigger", "mistyped-query-log"],
)
def test_a_crafted_snapshot_is_refused_and_changes_nothing(
    owner: Owner, statement: str, problem: str
):
    """Defect 3: the snapshot's schema and meta are checked in full before restore."""
    with owner.client() as c:
        snap = c.post(SNAPS).json()
        alter_sqlite(
            owner.data / "snapshots" / "kb" / f"{snap['id']}.sqlite3", statement
        )
        before = _state(c)
        body = assert_problem(c.post(f"{SNAPS}/{snap['id']}/restore"), 422)
        assert problem in body["detail"], body
        assert _state(c) == before  # counts and the search's hits
        # the live file is the old one: an upsert is kept, searches still answer
        owner.upsert(c, {"id": f"after-{snap['id']}", "text": "Still written."})
        owner.assert_all_acknowledged(c)
        assert c.post(f"{URL}/search", json=QUERY).status_code == 200
