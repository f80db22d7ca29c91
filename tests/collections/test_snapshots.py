"""Snapshots: online backup under concurrent writes, download, restore, delete, CLI.

Real SQLite, FTS5 and FAISS over real HTTP (uvicorn in a thread); the hash embedder
stands in for the model (a restore must give back the same vectors and answers,
whatever they mean).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from normcal_client import Conflict, InvalidRequest, NormcalClient, NotFound

from app.api.app import create_app
from app.cli.main import EXIT_INPUT, EXIT_USAGE, main
from app.collections.checks import check_file
from app.collections.ownership import LOCK_FILE
from app.collections.store import CollectionStore
from app.services.jobs import JOBS_FILE
from app.settings import Limits, Settings
from tests.conftest import alter_sqlite, assert_problem
from tests.support.fakes import HashEmbedder
from tests.support.live import ThreadServer

pytestmark = pytest.mark.fake_embedder

SNAPS = "/v1/collections/kb/snapshots"
CORPUS = [
    {"id": "d0", "text": "Lava flows from an erupting volcano."},
    {"id": "d1", "text": "Magma chambers feed eruptions."},
    {"id": "d2", "text": "The piano has eighty-eight keys."},
    {"id": "d3", "text": "Pianists practise scales daily."},
    {"id": "d4", "text": "Coffee beans are roasted."},
    {"id": "d5", "text": "Espresso is brewed under pressure."},
    {"id": "d6", "text": "Glaciers carve U-shaped valleys."},
]
QUERIES = ["volcano eruption", "piano keys", "coffee roasting", "valleys"]
LATER = [
    {"id": "d1", "text": "Volcano eruptions spread lava and ash."},
    {"id": "n0", "text": "A volcano of coffee: espresso erupts from the pot."},
    {"id": "n1", "text": "Piano keys and valleys of sound."},
]


def _app(data_dir: Path, embedder):
    return create_app(Settings(data_dir=data_dir), embedder=embedder)


def _answers(client: NormcalClient) -> list[list[tuple[str, float]]]:
    return [
        [(h.id, h.score) for h in client.search("kb", q, k=5).hits] for q in QUERIES
    ]


def _counts(path: Path) -> tuple[int, int]:
    store = CollectionStore(path)
    try:
        return store.count(), store.lexical_count()
    finally:
        store.close()


def test_snapshot_during_concurrent_upserts_is_one_committed_state(tmp_path, embedder):
    """Each upsert adds 4 documents in one transaction: a snapshot holds whole ones."""
    batch = 4
    written = threading.Event()
    stop = threading.Event()
    errors: list[BaseException] = []

    def write(url: str) -> None:
        try:
            with NormcalClient(url) as writer:
                for i in range(500):  # bounded; stopped once the snapshots are taken
                    docs = [
                        {"id": f"w{i}-{j}", "text": f"write {i} part {j} lava"}
                        for j in range(batch)
                    ]
                    writer.upsert_documents("kb", docs)
                    written.set()
                    if stop.is_set():
                        return
        except BaseException as error:  # reported by the test thread
            errors.append(error)
            written.set()

    with ThreadServer(_app(tmp_path / "data", embedder)) as server:
        with NormcalClient(server.url) as client:
            client.create_collection("kb")
            thread = threading.Thread(target=write, args=(server.url,))
            thread.start()
            try:
                assert written.wait(60)
                taken = [client.create_snapshot("kb") for _ in range(3)]
            finally:
                stop.set()
                thread.join(60)
            assert not errors
            for info in taken:
                data = client.download_snapshot("kb", info.id)
                assert len(data) == info.bytes
                copy = tmp_path / f"{info.id}.sqlite3"
                copy.write_bytes(data)
                assert check_file(copy)["name"] == "kb"
                documents, lexical = _counts(copy)
                assert documents == lexical == info.documents
                assert documents > 0 and documents % batch == 0
            listed = client.list_snapshots("kb")
            assert [s.id for s in listed] == sorted(s.id for s in taken)
            assert [s.documents for s in listed] == [
                s.documents for s in sorted(taken, key=lambda s: s.id)
            ]


def test_restore_gives_back_the_answers_of_snapshot_time_and_survives_a_restart(
    tmp_path, embedder
):
    data_dir = tmp_path / "data"
    with ThreadServer(_app(data_dir, embedder)) as server:
        with NormcalClient(server.url) as client:
            client.create_collection("kb")
            client.upsert_documents("kb", CORPUS)
            before = _answers(client)
            snapshot = client.create_snapshot("kb")
            assert snapshot.collection == "kb" and snapshot.documents == len(CORPUS)
            file = data_dir / "snapshots" / "kb" / f"{snapshot.id}.sqlite3"
            assert file.stat().st_mode & 0o777 == 0o600
            client.upsert_documents("kb", LATER)
            client.delete_documents("kb", ["d0"])
            assert _answers(client) != before  # the writes changed the answers
            restored = client.restore_snapshot("kb", snapshot.id)
            assert restored.documents == restored.indexed == len(CORPUS)
            assert restored.lexical_indexed == len(CORPUS)
            assert _answers(client) == before
            assert client.get_document("kb", "d0").text == CORPUS[0]["text"]
            client.upsert_documents("kb", LATER[1:])  # still writable after the swap
            assert client.get_collection("kb").documents == len(CORPUS) + 2
            client.delete_documents("kb", ["n0", "n1"])
    with ThreadServer(_app(data_dir, embedder)) as server:  # a restart
        with NormcalClient(server.url) as client:
            assert _answers(client) == before
            info = client.get_collection("kb")
            assert info.documents == info.indexed == len(CORPUS)


@pytest.fixture
def kb(tmp_path, embedder):
    with TestClient(_app(tmp_path / "data", embedder)) as c:
        assert c.post("/v1/collections", json={"name": "kb"}).status_code == 201
        r = c.put("/v1/collections/kb/documents", json={"documents": CORPUS})
        assert r.is_success, r.text
        yield c


def _state(c: TestClient) -> tuple[object, ...]:
    searched = c.post("/v1/collections/kb/search", json={"query": QUERIES[0]})
    described = c.get("/v1/collections/kb").json()
    return searched.json()["hits"], described["documents"], described["indexed"]


def test_snapshot_lifecycle_and_404s(kb, tmp_path):
    r = kb.post(SNAPS)
    assert r.status_code == 201, r.text
    snap = r.json()
    assert set(snap) == {"id", "collection", "created_at", "documents", "bytes"}
    download = kb.get(f"{SNAPS}/{snap['id']}")
    assert download.status_code == 200
    assert download.headers["content-type"] == "application/vnd.sqlite3"
    assert download.content.startswith(b"SQLite format 3\x00")
    assert kb.get(SNAPS).json() == {"data": [snap], "count": 1}

    missing = "20260101T000000000Z-00000000"
    for method, path in [
        ("GET", f"{SNAPS}/{missing}"),
        ("DELETE", f"{SNAPS}/{missing}"),
        ("POST", f"{SNAPS}/{missing}/restore"),
        ("GET", "/v1/collections/nope/snapshots"),
        ("POST", "/v1/collections/nope/snapshots"),
        ("POST", f"/v1/collections/nope/snapshots/{snap['id']}/restore"),
    ]:
        assert_problem(kb.request(method, path), 404)
    for bad in ["latest", "...", f"{snap['id']}x", snap["id"][:-1] + "G"]:
        assert_problem(kb.get(f"{SNAPS}/{bad}"), 422)
        assert_problem(kb.post(f"{SNAPS}/{bad}/restore"), 422)
    assert_problem(kb.get(f"{SNAPS}/..%2F..%2Fkb.sqlite3"), 404)  # no such route

    assert kb.delete(f"{SNAPS}/{snap['id']}").status_code == 204
    assert_problem(kb.delete(f"{SNAPS}/{snap['id']}"), 404)
    assert kb.get(SNAPS).json() == {"data": [], "count": 0}


@pytest.mark.parametrize(
    "damage", ["truncated", "not-sqlite", "other-collection", "bad-calibrator"]
)
def test_restore_of_a_bad_snapshot_is_refused_and_changes_nothing(kb, tmp_path, damage):
    snap = kb.post(SNAPS).json()
    kb.put("/v1/collections/kb/documents", json={"documents": LATER}).raise_for_status()
    before = _state(kb)
    file = tmp_path / "data" / "snapshots" / "kb" / f"{snap['id']}.sqlite3"
    if damage == "truncated":
        data = file.read_bytes()
        file.write_bytes(data[: len(data) // 2])
    elif damage == "not-sqlite":
        file.write_bytes(b"not a database\n" * 1000)
    elif damage == "bad-calibrator":  # a stored calibrator that does not decode
        alter_sqlite(
            file,
            "INSERT INTO calibrators(id, created_at, method, profile)"
            " VALUES ('bad', 1.0, 'platt', '{\"format\": \"nonsense\"}')",
        )
    else:  # a healthy snapshot of another collection, put in kb's folder
        assert kb.post("/v1/collections", json={"name": "other"}).status_code == 201
        other = kb.post("/v1/collections/other/snapshots").json()
        other_file = file.parent.parent / "other" / f"{other['id']}.sqlite3"
        file.write_bytes(other_file.read_bytes())
    body = assert_problem(kb.post(f"{SNAPS}/{snap['id']}/restore"), 422)
    assert "snapshot" in body["detail"]
    assert _state(kb) == before
    leftovers = [
        p.name
        for p in (tmp_path / "data").iterdir()
        if p.is_file() and not p.name.startswith(JOBS_FILE)  # the fit-job file
    ]
    assert sorted(leftovers) == sorted(
        ["kb.sqlite3", "kb.sqlite3-wal", "kb.sqlite3-shm"]
        + (
            ["other.sqlite3", "other.sqlite3-wal", "other.sqlite3-shm"]
            if damage == "other-collection"
            else []
        )
    )


def test_offline_restore_with_the_cli(tmp_path, embedder, capsys):
    data_dir = tmp_path / "data"
    with ThreadServer(_app(data_dir, embedder)) as server:
        with NormcalClient(server.url) as client:
            client.create_collection("kb")
            client.upsert_documents("kb", CORPUS)
            before = _answers(client)
            snapshot = client.create_snapshot("kb")
            file = tmp_path / "kb-backup.sqlite3"
            file.write_bytes(client.download_snapshot("kb", snapshot.id))
            client.upsert_documents("kb", LATER)
            with pytest.raises(NotFound):
                client.download_snapshot("kb", "20260101T000000000Z-00000000")
            with pytest.raises(InvalidRequest):
                client.download_snapshot("kb", "nope")
    args = ["restore", str(file), "--data-dir", str(data_dir)]
    assert main([*args, "--collection", "kb"]) == 0
    with ThreadServer(_app(data_dir, embedder)) as server:
        with NormcalClient(server.url) as client:
            assert _answers(client) == before
    capsys.readouterr()

    fresh = tmp_path / "fresh"  # a disaster recovery into an empty data dir
    assert (
        main(["restore", str(file), "--collection", "kb", "--data-dir", str(fresh)])
        == 0
    )
    assert _counts(fresh / "kb.sqlite3") == (len(CORPUS), len(CORPUS))
    capsys.readouterr()

    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"not a database\n" * 100)
    for argv, code in [
        ([str(tmp_path / "absent.sqlite3"), "--collection", "kb"], EXIT_INPUT),
        ([str(garbage), "--collection", "kb"], EXIT_INPUT),
        ([str(file), "--collection", "other"], EXIT_INPUT),
        ([str(file), "--collection", "../kb"], EXIT_USAGE),
    ]:
        assert main(["restore", *argv, "--data-dir", str(fresh)]) == code
        err = capsys.readouterr().err
        assert err.startswith("normcal: ") and err.count("\n") == 1, err
        assert "Traceback" not in err
    assert _counts(fresh / "kb.sqlite3") == (len(CORPUS), len(CORPUS))
    # and the data dir's lock file, which outlives its holders (ownership.py)
    assert sorted(p.name for p in fresh.iterdir()) == [LOCK_FILE, "kb.sqlite3"]


def test_restore_brings_a_quarantined_collection_back(tmp_path, embedder):
    data_dir = tmp_path / "data"
    with TestClient(_app(data_dir, embedder)) as c:
        assert c.post("/v1/collections", json={"name": "kb"}).status_code == 201
        r = c.put("/v1/collections/kb/documents", json={"documents": CORPUS})
        assert r.is_success, r.text
        snap = c.post(SNAPS).json()
        before = _state(c)
    (data_dir / "kb.sqlite3").write_bytes(b"damaged\n" * 512)
    with TestClient(_app(data_dir, embedder)) as c:
        assert_problem(c.get("/v1/collections/kb"), 503)
        assert_problem(c.post(SNAPS), 503)  # nothing sound to back up
        assert [s["id"] for s in c.get(SNAPS).json()["data"]] == [snap["id"]]
        r = c.post(f"{SNAPS}/{snap['id']}/restore")
        assert r.status_code == 200, r.text
        assert r.json()["documents"] == len(CORPUS)
        assert _state(c) == before


def test_a_restore_that_cannot_replace_the_file_keeps_serving_the_old_data(
    kb, monkeypatch
):
    """A full disk at the swap is a 507, and the live collection stays as it was."""
    import errno

    import app.collections.registry

    def full(*_args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    snap = kb.post(SNAPS).json()
    kb.put("/v1/collections/kb/documents", json={"documents": LATER}).raise_for_status()
    before = _state(kb)
    monkeypatch.setattr(app.collections.registry, "_replace_file", full)
    assert_problem(kb.post(f"{SNAPS}/{snap['id']}/restore"), 507)
    assert _state(kb) == before
    kb.put(
        "/v1/collections/kb/documents", json={"documents": CORPUS[:1]}
    ).raise_for_status()


# ------------------------------------------------------------ snapshots travel


def _listing(c: TestClient, name: str) -> list[tuple[str, str]]:
    page = c.get(f"/v1/collections/{name}/documents", params={"limit": 100}).json()
    return [(d["id"], d["text"]) for d in page["data"]]


def test_restore_into_a_new_collection_leaves_the_source_serving(kb):
    snap = kb.post(SNAPS).json()
    at_snapshot = _listing(kb, "kb")
    kb.put("/v1/collections/kb/documents", json={"documents": LATER}).raise_for_status()
    later = _state(kb), _listing(kb, "kb")

    r = kb.post(f"{SNAPS}/{snap['id']}/restore", json={"into": "kb-copy"})
    assert r.status_code == 200, r.text
    assert (r.json()["name"], r.json()["documents"]) == ("kb-copy", len(CORPUS))
    assert _listing(kb, "kb-copy") == at_snapshot
    assert (_state(kb), _listing(kb, "kb")) == later  # the source is untouched
    hits = kb.post("/v1/collections/kb-copy/search", json={"query": QUERIES[0]})
    assert hits.json()["hits"][0]["id"] in {"d0", "d1"}

    before = [c["name"] for c in kb.get("/v1/collections").json()["data"]]
    for into, status in [("kb-copy", 409), ("KB-COPY", 409), ("../x", 422), ("", 422)]:
        assert_problem(
            kb.post(f"{SNAPS}/{snap['id']}/restore", json={"into": into}), status
        )
    assert_problem(kb.post(f"{SNAPS}/{snap['id']}/restore", json={"name": "x"}))
    assert [c["name"] for c in kb.get("/v1/collections").json()["data"]] == before
    # a restore without a body, or `into` its own name, is the restore in place
    r = kb.post(f"{SNAPS}/{snap['id']}/restore", json={"into": "kb"})
    assert r.status_code == 200 and _listing(kb, "kb") == at_snapshot


def _upload(c, name: str, data: bytes, **params: str):
    return c.post(
        f"/v1/collections/{name}/snapshots/upload",
        content=data,
        params=params,
        headers={"content-type": "application/vnd.sqlite3"},
    )


def test_a_collection_moves_to_another_server_by_uploading_its_snapshot(
    tmp_path, embedder
):
    """Over real HTTP, with the client: download from one server, upload to another."""
    with (
        ThreadServer(_app(tmp_path / "a", embedder)) as one,
        ThreadServer(_app(tmp_path / "b", embedder)) as other,
        NormcalClient(one.url) as a,
        NormcalClient(other.url) as b,
    ):
        a.create_collection("kb")
        a.upsert_documents("kb", CORPUS)
        before = _answers(a)
        data = a.download_snapshot("kb", a.create_snapshot("kb").id)
        file = tmp_path / "kb.sqlite3"
        file.write_bytes(data)

        moved = b.upload_snapshot("kb", file)  # a path, or the bytes
        assert (moved.name, moved.documents) == ("kb", len(CORPUS))
        assert _answers(b) == before
        copy = b.upload_snapshot("kb-2", data)  # under another name
        assert copy.name == "kb-2" and copy.documents == len(CORPUS)
        with pytest.raises(Conflict, match=r"\?replace=true"):
            b.upload_snapshot("kb", data)
        a.upsert_documents("kb", LATER)
        newer = a.download_snapshot("kb", a.create_snapshot("kb").id)
        replaced = b.upload_snapshot("kb-2", newer, replace=True)
        assert replaced.documents == len({d["id"] for d in CORPUS + LATER})
        assert b.get_collection("kb").documents == len(CORPUS)
    with ThreadServer(_app(tmp_path / "b", embedder)) as restarted:
        with NormcalClient(restarted.url) as b:  # a restart serves what was uploaded
            assert _answers(b) == before
            assert sorted(c.name for c in b.list_collections()) == ["kb", "kb-2"]


@pytest.mark.parametrize(
    "damage",
    ["truncated", "not-sqlite", "empty", "bad-calibrator", "extra-trigger", "one-past"],
)
def test_an_upload_that_fails_a_check_is_refused_and_changes_nothing(
    tmp_path, embedder, damage
):
    with TestClient(_app(tmp_path / "a", embedder)) as a:
        assert a.post("/v1/collections", json={"name": "kb"}).status_code == 201
        a.put("/v1/collections/kb/documents", json={"documents": CORPUS})
        snap = a.post(SNAPS).json()
        file = tmp_path / "a" / "snapshots" / "kb" / f"{snap['id']}.sqlite3"
        good = file.read_bytes()
    if damage == "bad-calibrator":
        alter_sqlite(
            file,
            "INSERT INTO calibrators(id, created_at, method, profile)"
            " VALUES ('bad', 1.0, 'platt', '{\"format\": \"nonsense\"}')",
        )
    elif damage == "extra-trigger":  # runs inside every later upsert
        alter_sqlite(
            file,
            "CREATE TRIGGER evil AFTER INSERT ON documents BEGIN "
            "DELETE FROM documents; END",
        )
    data = {
        "truncated": good[: len(good) // 2],
        "not-sqlite": b"not a database\n" * 1000,
        "empty": b"",
        "one-past": good,
    }.get(damage, file.read_bytes() if file.exists() else good)
    limits = Limits(max_snapshot_bytes=len(good) - 1 if damage == "one-past" else 10**9)
    data_dir = tmp_path / "b"
    settings = Settings(data_dir=data_dir, limits=limits)
    with TestClient(create_app(settings, embedder=embedder)) as b:
        assert b.post("/v1/collections", json={"name": "kept"}).status_code == 201
        r = _upload(b, "kb", data)
        if damage == "one-past":
            body = assert_problem(r, 413)
            assert str(len(good) - 1) in body["detail"]
            # chunked, without a length: counted as it streams in
            assert_problem(_upload(b, "kb", iter([good[:4096], good[4096:]])), 413)
        else:
            body = assert_problem(r, 422)
            assert body["detail"].startswith(
                ("the uploaded file is not a usable snapshot", "the snapshot is not")
            )
            assert str(data_dir) not in body["detail"]  # no server path in a problem
        assert [c["name"] for c in b.get("/v1/collections").json()["data"]] == ["kept"]
        assert_problem(b.get("/v1/collections/kb"), 404)
    # nothing received is left behind (the temporary file, its staged copy)
    assert [p.name for p in data_dir.iterdir() if p.name.startswith(".")] == []
    assert not (data_dir / "kb.sqlite3").exists()


def test_an_upload_at_the_size_bound_is_served(tmp_path, embedder):
    with TestClient(_app(tmp_path / "a", embedder)) as a:
        a.post("/v1/collections", json={"name": "kb"})
        a.put("/v1/collections/kb/documents", json={"documents": CORPUS})
        data = a.get(f"{SNAPS}/{a.post(SNAPS).json()['id']}").content
    settings = Settings(
        data_dir=tmp_path / "b", limits=Limits(max_snapshot_bytes=len(data))
    )
    with TestClient(create_app(settings, embedder=embedder)) as b:
        assert _upload(b, "kb", data).status_code == 200
        # streamed, no declared length: the same bound
        assert _upload(b, "kb2", iter([data[:1000], data[1000:]])).status_code == 200


def test_an_upload_is_refused_before_its_body_when_the_name_is_taken(kb):
    """A 409 (or a bad name's 422) needs no byte of the file."""
    before = _state(kb)
    assert_problem(_upload(kb, "kb", b"not even read"), 409)
    assert_problem(_upload(kb, "bad%20name", b"x"), 422)
    assert _state(kb) == before


def test_an_upload_of_other_model_files_is_refused(tmp_path, embedder):
    with TestClient(_app(tmp_path / "a", embedder)) as a:
        a.post("/v1/collections", json={"name": "kb"})
        a.put("/v1/collections/kb/documents", json={"documents": CORPUS})
        data = a.get(f"{SNAPS}/{a.post(SNAPS).json()['id']}").content
    other = HashEmbedder(model_name="tests/another-model")
    with TestClient(_app(tmp_path / "b", other)) as b:
        body = assert_problem(_upload(b, "kb", data), 409)
        assert "tests/another-model" in body["detail"]
        assert b.get("/v1/collections").json()["data"] == []
