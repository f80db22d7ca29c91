"""Storage faults: broken files, interrupted creates, drop races, fds, full or read-only disks.

Real model, real SQLite files, real HTTP (``normcal serve`` subprocesses where a
restart or a process limit matters, the in-process app otherwise). Small real
filesystems are tmpfs mounts; those tests skip when mounting is not permitted.
"""

from __future__ import annotations

import errno
import hashlib
import os
import sqlite3
import stat
import subprocess
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.collections.registry import CollectionRegistry
from app.collections.store_files import build_store
from app.exceptions import NotFoundError
from app.settings import Settings
from calibration.profile import Profile
from tests.conftest import assert_problem
from tests.support.corpus import CORPUS, QUERIES
from tests.support.server import ServerProcess

DOCS = [
    {"id": k, "text": v, "metadata": {"n": i}}
    for i, (k, v) in enumerate(CORPUS.items())
]
MODEL = Settings().model_name


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _filled(client: TestClient | httpx.Client, name: str) -> None:
    assert client.post("/v1/collections", json={"name": name}).status_code == 201
    r = client.put(f"/v1/collections/{name}/documents", json={"documents": DOCS})
    assert r.status_code == 200, r.text


def _top(client: TestClient | httpx.Client, name: str, key: str = "paris") -> str:
    r = client.post(f"/v1/collections/{name}/search", json={"query": QUERIES[key]})
    assert r.status_code == 200, r.text
    return str(r.json()["hits"][0]["id"])


def _integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


@contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A small real filesystem at ``path``; skips when mounting is not permitted."""
    path.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _broken_files(data: Path, good: Path) -> dict[str, str]:
    """Write each damaged file a crash or an accident leaves; return name -> expected reason."""
    (data / "empty.sqlite3").write_bytes(b"")
    build_store(data / "nometa.sqlite3", {}, synchronous="FULL")  # killed before meta
    raw = good.read_bytes()
    page = 4096
    assert len(raw) >= 6 * page
    (data / "truncated.sqlite3").write_bytes(raw[: len(raw) // 2 + 100])
    (data / "random.sqlite3").write_bytes(os.urandom(len(raw)))
    garbage = bytearray(raw)
    garbage[page : 4 * page] = os.urandom(3 * page)
    (data / "garbage.sqlite3").write_bytes(bytes(garbage))
    (data / "folder.sqlite3").mkdir()
    build_store(
        data / "wrongdim.sqlite3",
        {"name": "wrongdim", "model": MODEL, "dim": 7, "created_at": 0.0},
        synchronous="FULL",
    )
    return {
        "empty": "empty file",
        "nometa": "meta lacks",
        "truncated": "",
        "random": "",
        "garbage": "",
        "folder": "not a regular file",
        "wrongdim": "dim 7",
    }


@pytest.mark.server
def test_broken_files_are_quarantined_untouched_and_healthy_ones_served(
    tmp_path, embedder
):
    data = tmp_path / "data"
    app = create_app(Settings(data_dir=data), embedder=embedder)
    with TestClient(app) as client:
        _filled(client, "good")
        for i in range(40):  # enough pages to truncate and overwrite some of them
            docs = [{"id": f"x{i}-{j}", "text": f"filler {i} {j}"} for j in range(8)]
            client.put("/v1/collections/good/documents", json={"documents": docs})
    expected = _broken_files(data, data / "good.sqlite3")
    hashes = {
        p.name: _sha(p)
        for p in data.iterdir()
        if p.is_file() and p.name != "good.sqlite3"
    }

    server = ServerProcess(data).start()  # on main: exit 3 at the first broken file
    try:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            assert _top(c, "good") == "paris"
            listed = {i["name"]: i for i in c.get("/v1/collections").json()["data"]}
            assert listed["good"]["status"] == "ready"
            for name, reason in expected.items():
                assert listed[name]["status"] == "unavailable", name
                assert reason in listed[name]["reason"], listed[name]
                for method, path, body in [
                    ("GET", f"/v1/collections/{name}", None),
                    ("POST", f"/v1/collections/{name}/search", {"query": "x"}),
                    ("GET", f"/v1/collections/{name}/documents/a", None),
                    ("GET", f"/v1/collections/{name}/calibrators", None),
                ]:
                    problem = assert_problem(c.request(method, path, json=body), 503)
                    assert problem["type"] == "/problems/collection-unavailable"
                    assert f"{name}.sqlite3" in problem["detail"]
                    assert "DELETE" in problem["detail"]
                r = c.post("/v1/collections", json={"name": name.upper()})
                assert_problem(r, 409)
            ready = c.get("/readyz").json()
            assert ready["status"] == "degraded"
            assert {u["name"] for u in ready["unavailable"]} == set(expected)
            metrics = c.get("/metrics").text
            assert f"normcal_collections_unavailable {float(len(expected))}" in metrics
            after = {p.name: _sha(p) for p in data.iterdir() if p.name in hashes}
            assert after == hashes  # nothing was modified
            # Recovery is the operator's call: DELETE removes a broken file.
            assert c.delete("/v1/collections/empty").status_code == 204
            assert not (data / "empty.sqlite3").exists()
            assert_problem(c.delete("/v1/collections/folder"), 409)
            assert c.post("/v1/collections", json={"name": "empty"}).status_code == 201
    finally:
        server.stop()


@pytest.mark.server
def test_interrupted_create_leaves_whole_collection_or_none(tmp_path, embedder):
    """kill -9 while collections are being created: every file on restart is whole."""
    data = tmp_path / "data"
    server = ServerProcess(data).start()
    created: list[str] = []
    attempted = threading.Event()

    def creator() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            for i in range(10_000):
                try:
                    r = c.post("/v1/collections", json={"name": f"c{i}"})
                except httpx.TransportError:
                    return
                assert r.status_code == 201, r.text
                created.append(f"c{i}")
                if len(created) >= 20:
                    attempted.set()

    thread = threading.Thread(target=creator)
    try:
        thread.start()
        assert attempted.wait(120)
        server.kill()
    finally:
        thread.join(60)
    # A crash state the old create left (tables, empty meta) now only exists under
    # the temporary name, which start-up removes.
    build_store(data / ".zz.creating-dead.sqlite3", {}, synchronous="FULL")
    (data / ".zz.creating-dead.sqlite3-journal").write_bytes(b"x")
    server = ServerProcess(data).start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            listed = c.get("/v1/collections").json()["data"]
        assert all(i["status"] == "ready" for i in listed), listed
        assert set(created) <= {i["name"] for i in listed}
        assert not [p for p in data.iterdir() if ".creating-" in p.name]
    finally:
        server.stop()


def test_create_never_writes_a_partial_file(tmp_path, monkeypatch):
    """Schema and meta are one transaction under a temporary name: a failure leaves nothing."""
    import app.collections.store_files

    def crash(*_args: object) -> None:
        raise KeyboardInterrupt  # stands in for the process dying mid-transaction

    registry = CollectionRegistry(
        tmp_path / "data", model_name=MODEL, dim=384, load_calibrator=Profile.from_json
    )
    registry.load()
    monkeypatch.setattr(app.collections.store_files, "write_meta", crash)
    with pytest.raises(KeyboardInterrupt):
        registry.create("kb")
    assert list((tmp_path / "data").iterdir()) == []
    monkeypatch.undo()
    assert registry.create("kb").meta["dim"] == 384
    registry.close()


@pytest.mark.server
def test_create_drop_race_gives_no_5xx(tmp_path):
    server = ServerProcess(tmp_path / "data").start()
    statuses: dict[str, Counter[int]] = {}
    done = threading.Event()
    errors: list[str] = []

    def loop(kind: str, call: Callable[[httpx.Client], httpx.Response]) -> None:
        counts = statuses.setdefault(kind, Counter())
        with httpx.Client(base_url=server.url, timeout=60) as c:
            for _ in range(400):
                if done.is_set() and counts.total() > 0:
                    return
                r = call(c)
                counts[r.status_code] += 1
                if r.status_code >= 500:
                    errors.append(f"{kind}: {r.status_code} {r.text[:300]}")

    def churn(c: httpx.Client) -> httpx.Response:
        r = c.post("/v1/collections", json={"name": "race"})
        if r.status_code == 201:
            assert r.json()["name"] == "race"  # described without a second lookup
        c.delete("/v1/collections/race")
        return r

    calls = {
        "upsert": lambda c: c.put(
            "/v1/collections/race/documents", json={"documents": DOCS[:2]}
        ),
        "search": lambda c: c.post("/v1/collections/race/search", json={"query": "x"}),
        "list": lambda c: c.get("/v1/collections"),
        "describe": lambda c: c.get("/v1/collections/race"),
        "calibrators": lambda c: c.get("/v1/collections/race/calibrators"),
    }
    threads = [threading.Thread(target=loop, args=(k, f)) for k, f in calls.items()]
    try:
        for t in threads:
            t.start()
        loop("churn", churn)  # ~400 create/drop cycles while the others run
        done.set()
        for t in threads:
            t.join(120)
    finally:
        server.stop()
    assert not errors, errors[:5]
    assert set(statuses["list"]) == {200}
    assert set(statuses["churn"]) <= {201, 409}
    for kind in ("upsert", "search", "describe", "calibrators"):
        assert set(statuses[kind]) <= {200, 404}, (kind, statuses[kind])


def test_dropped_collection_methods_raise_not_found(tmp_path, embedder):
    registry = CollectionRegistry(
        tmp_path / "data", model_name=MODEL, dim=384, load_calibrator=Profile.from_json
    )
    registry.load()
    collection = registry.create("kb")
    registry.drop("kb")  # a request that looked it up just before still holds it
    batch = embedder.embed(["x"], "query")
    for call in (
        lambda: collection.search(batch.vectors, ["x"], 3),
        collection.counts,
        collection.state.judgments,
        collection.norm_sample,
        lambda: collection.missing(["a"]),
        lambda: collection.state.add_judgments([("q", "a", 1)]),
        lambda: collection.get("a"),
    ):
        with pytest.raises(NotFoundError):
            call()
    assert list((tmp_path / "data").iterdir()) == []


@pytest.mark.server
def test_500_collections_start_under_1024_fds(tmp_path):
    data = tmp_path / "data"
    registry = CollectionRegistry(
        data, model_name=MODEL, dim=384, load_calibrator=Profile.from_json
    )
    registry.load()
    names = [f"kb{i:03d}" for i in range(500)]
    for name in names:
        registry.create(name)
    registry.close()
    # On main: too many open files after ~338 collections.
    server = ServerProcess(data, nofile=(1024, 1024)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            listed = c.get("/v1/collections").json()["data"]
            assert [i["name"] for i in listed] == names
            assert {i["status"] for i in listed} == {"ready"}
            for name in (names[0], names[-1], names[0]):
                r = c.put(f"/v1/collections/{name}/documents", json={"documents": DOCS})
                assert r.status_code == 200, r.text
                assert _top(c, name) == "paris"
    finally:
        server.stop()


def _fill(disk: Path) -> Path:
    """Fill the filesystem with one file; return it (delete it to free the space)."""
    filler = disk / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as error:
            assert error.errno == errno.ENOSPC
    return filler


@pytest.mark.slow  # fills a real tmpfs to the last byte
def test_full_disk_gives_507_and_writes_nothing(tmp_path, embedder):
    with _tmpfs(tmp_path / "disk", "2m") as disk:
        data = disk / "data"
        app = create_app(Settings(data_dir=data), embedder=embedder)
        with TestClient(app) as client:
            _filled(client, "kb")
            filler = _fill(disk)
            big = [
                {"id": f"big{i}", "text": f"document {i} " + "word " * 400}
                for i in range(64)
            ]
            r = client.put("/v1/collections/kb/documents", json={"documents": big})
            assert assert_problem(r, 507)["type"] == "/problems/insufficient-storage"
            r = client.post("/v1/collections", json={"name": "other"})
            assert_problem(r, 507)
            assert sorted(p.name for p in data.iterdir() if "kb" not in p.name) == []
            assert client.get("/v1/collections/kb").json()["documents"] == len(DOCS)
            filler.unlink()
            assert _top(client, "kb") == "paris"
            assert (
                client.post("/v1/collections", json={"name": "other"}).status_code
                == 201
            )
        assert _integrity(data / "kb.sqlite3") == "ok"


def test_injected_enospc_gives_507_and_writes_nothing(client, settings, monkeypatch):
    import app.collections.store
    import app.collections.store_files

    def no_space(*_args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    _filled(client, "kb")
    with monkeypatch.context() as m:
        m.setattr(
            app.collections.store, "_seqs_by_id", no_space
        )  # inside the upsert transaction
        docs = [{"id": "new", "text": "a new document"}, {"id": "paris", "text": "x"}]
        r = client.put("/v1/collections/kb/documents", json={"documents": docs})
        assert_problem(r, 507)
    with monkeypatch.context() as m:
        m.setattr(
            app.collections.store_files.os, "fsync", no_space
        )  # create: after the commit
        assert_problem(client.post("/v1/collections", json={"name": "other"}), 507)
    info = client.get("/v1/collections/kb").json()
    assert (info["documents"], info["indexed"]) == (len(DOCS), len(DOCS))
    assert (
        client.get("/v1/collections/kb/documents/paris").json()["text"]
        == CORPUS["paris"]
    )
    assert client.get("/v1/collections/other").status_code == 404
    assert sorted(p.name for p in Path(settings.data_dir).iterdir())[0] == "kb.sqlite3"
    assert _integrity(Path(settings.data_dir) / "kb.sqlite3") == "ok"


def test_unwritable_data_dir_is_not_ready(tmp_path, embedder):
    with _tmpfs(tmp_path / "disk", "1m") as disk:
        data = disk / "data"
        data.mkdir(mode=0o700)
        remount = subprocess.run(
            ["mount", "-o", "remount,ro", str(disk)], capture_output=True
        )
        if remount.returncode != 0:
            pytest.skip(f"cannot remount read-only: {remount.stderr.decode().strip()}")
        app = create_app(Settings(data_dir=data), embedder=embedder)
        with TestClient(
            app
        ) as client:  # starts: on main it also started, but said ready
            r = client.get("/readyz")
            assert r.status_code == 503
            assert r.json()["status"] == "not ready"
            assert "not writable" in r.json()["reasons"][0]
            problem = assert_problem(
                client.post("/v1/collections", json={"name": "kb"}), 503
            )
            assert problem["type"] == "/problems/storage-unavailable"
            assert "not writable" in problem["detail"]


def test_readyz_hides_collections_from_anonymous_callers(tmp_path, embedder):
    data = tmp_path / "data"
    data.mkdir()
    (data / "acme-payroll.sqlite3").write_bytes(b"")
    registry = CollectionRegistry(
        data, model_name=MODEL, dim=384, load_calibrator=Profile.from_json
    )
    registry.load()
    registry.create("secret-kb")
    registry.close()
    app = create_app(Settings(data_dir=data, api_key="k3y"), embedder=embedder)
    with TestClient(app) as client:
        anon = client.get("/readyz")
        assert anon.status_code == 200
        body = anon.json()
        assert body["status"] == "degraded"
        assert body["reasons"] == ["1 collection(s) unavailable"]
        assert body.get("collections") is None and body.get("unavailable") is None
        assert "acme" not in anon.text and "secret" not in anon.text
        wrong = client.get("/readyz", headers={"Authorization": "Bearer nope"})
        assert "acme" not in wrong.text and wrong.json().get("collections") is None
        full = client.get("/readyz", headers={"Authorization": "Bearer k3y"}).json()
        assert full["collections"] == 1
        assert full["unavailable"][0]["name"] == "acme-payroll"


def test_names_are_case_insensitive_and_not_device_names(client, settings):
    assert client.post("/v1/collections", json={"name": "Kb"}).status_code == 201
    assert_problem(client.post("/v1/collections", json={"name": "kb"}), 409)
    assert_problem(client.post("/v1/collections", json={"name": "KB"}), 409)
    for name in ("CON", "con", "Nul", "prn", "aux", "COM1", "com9", "LPT1", "lpt9"):
        r = client.post("/v1/collections", json={"name": name})
        assert assert_problem(r, 422)["errors"][0]["loc"] == ["name"], name
    assert client.post("/v1/collections", json={"name": "com10"}).status_code == 201
    assert client.post("/v1/collections", json={"name": "console"}).status_code == 201


def test_files_are_private(client, settings):
    data = Path(settings.data_dir)
    _filled(client, "kb")  # the write leaves -wal and -shm open
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    files = [p for p in data.iterdir() if p.name.startswith("kb.sqlite3")]
    assert {p.name for p in files} >= {"kb.sqlite3", "kb.sqlite3-wal", "kb.sqlite3-shm"}
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
