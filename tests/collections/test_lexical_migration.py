"""Collection files from before the lexical index gain it on first open, and keep it.

A schema-version-2 file (made here by removing a new file's FTS5 table and triggers)
and the old-layout fixture ``tests/fixtures/old_format/kb.sqlite3`` open with today's
code, build their BM25 index from their documents (logging progress), and stay in
step on later replacements and deletions.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
from pathlib import Path

from fastapi.testclient import TestClient

from app.api.app import create_app
from app.collections import lexical, store
from app.collections.store_files import SCHEMA_VERSION
from app.settings import Settings

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "old_format"
DOCS = {
    "violin": "The violin concerto was performed by the city orchestra.",
    "galaxy": "The telescope observed a distant galaxy cluster.",
    "bread": "Sourdough bread needs a lively starter.",
    "tomato": "Tomatoes grow best in full sun.",
    "river": "She was running along the river every morning.",
}


def _fts_integrity(path: Path) -> None:
    """FTS5's own check of the index against the documents (raises if corrupt)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute(
            f"INSERT INTO {lexical.FTS_TABLE}({lexical.FTS_TABLE}) "
            "VALUES('integrity-check')"
        )
        conn.commit()
    finally:
        conn.close()


def _schema_version(path: Path) -> object:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'")
        return row.fetchone()[0]
    finally:
        conn.close()


def _make_version_2(path: Path) -> None:
    """What schema version 2 wrote: no FTS table, no triggers, no stemmer key (and
    no query log flag, which version 4 added)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("ALTER TABLE query_log DROP COLUMN truncated")
        t = lexical.FTS_TABLE
        for trigger in (f"{t}_ai", f"{t}_ad", f"{t}_au"):
            conn.execute(f"DROP TRIGGER {trigger}")
        conn.execute(f"DROP TABLE {t}")
        conn.execute("DROP TABLE rerank_log")  # version 4's
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
        conn.execute("DELETE FROM meta WHERE key = 'stemmer'")
        conn.commit()
        left = conn.execute(
            "SELECT name FROM sqlite_master WHERE name LIKE ?", (f"{t}%",)
        ).fetchall()
        assert left == []
    finally:
        conn.close()


def _lexical_ids(client: TestClient, name: str, query: str) -> list[str]:
    r = client.post(
        f"/v1/collections/{name}/search",
        json={"query": query, "mode": "lexical", "k": 10},
    )
    assert r.status_code == 200, r.text
    return [h["id"] for h in r.json()["hits"]]


def _in_step(client: TestClient, name: str) -> dict:
    info = client.get(f"/v1/collections/{name}").json()
    assert info["documents"] == info["lexical_indexed"] == info["indexed"], info
    return info


def _replace_and_delete_keep_the_index(
    client: TestClient, name: str, doc_id: str, gone: str, path: Path
) -> None:
    """Replace ``doc_id`` by a text with a new word, delete ``gone``: still in step."""
    before = _in_step(client, name)["documents"]
    r = client.put(
        f"/v1/collections/{name}/documents",
        json={"documents": [{"id": doc_id, "text": "A quokka smiles on Rottnest."}]},
    )
    assert r.status_code == 200, r.text
    assert client.delete(f"/v1/collections/{name}/documents/{gone}").is_success
    assert _in_step(client, name)["documents"] == before - 1
    assert _lexical_ids(client, name, "quokka") == [doc_id]
    assert gone not in _lexical_ids(client, name, DOCS.get(gone, gone))
    _fts_integrity(path)


def test_a_version_2_file_gains_its_lexical_index(
    tmp_path, embedder, caplog, monkeypatch
):
    settings = Settings(data_dir=tmp_path / "data")
    with TestClient(create_app(settings, embedder=embedder)) as c:
        c.post("/v1/collections", json={"name": "old"})
        docs = [{"id": k, "text": v} for k, v in DOCS.items()]
        assert c.put(
            "/v1/collections/old/documents", json={"documents": docs}
        ).is_success
    path = settings.data_dir / "old.sqlite3"
    _make_version_2(path)

    monkeypatch.setattr(store, "_LEXICAL_BATCH", 2)  # several progress lines
    caplog.set_level(logging.INFO, logger="app.collections.store")
    with TestClient(create_app(settings, embedder=embedder)) as c:
        info = _in_step(c, "old")
        assert info["documents"] == len(DOCS) and info["stemmer"] == "porter"
        messages = [r.getMessage() for r in caplog.records]
        assert any("building the lexical index" in m for m in messages), messages
        progress = [m for m in messages if f"of {len(DOCS)} documents" in m]
        assert len(progress) == 3 and progress[-1].endswith("5 of 5 documents")
        assert any("built the lexical index" in m for m in messages)
        assert _lexical_ids(c, "old", "orchestra") == ["violin"]
        assert _lexical_ids(c, "old", "run") == ["river"]  # porter, the default
        r = c.post(
            "/v1/collections/old/search", json={"query": "galaxy", "mode": "hybrid"}
        )
        assert r.status_code == 200 and r.json()["hits"][0]["id"] == "galaxy"
        _fts_integrity(path)
        _replace_and_delete_keep_the_index(c, "old", "galaxy", "bread", path)
    assert _schema_version(path) == str(SCHEMA_VERSION)

    # Built once: the next open finds it and logs no rebuild.
    caplog.clear()
    with TestClient(create_app(settings, embedder=embedder)) as c:
        _in_step(c, "old")
        assert _lexical_ids(c, "old", "quokka") == ["galaxy"]
    assert not any("building" in r.getMessage() for r in caplog.records)


def test_a_version_2_file_keeps_its_recorded_stemmer(tmp_path, embedder):
    """A rebuild honours a stemmer already recorded in meta."""
    settings = Settings(data_dir=tmp_path / "data")
    with TestClient(create_app(settings, embedder=embedder)) as c:
        c.post("/v1/collections", json={"name": "plain", "stemmer": "none"})
        docs = [{"id": "river", "text": DOCS["river"]}]
        c.put("/v1/collections/plain/documents", json={"documents": docs})
    path = settings.data_dir / "plain.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE query_log DROP COLUMN truncated")  # added in 4
    t = lexical.FTS_TABLE
    for trigger in (f"{t}_ai", f"{t}_ad", f"{t}_au"):
        conn.execute(f"DROP TRIGGER {trigger}")
    conn.execute(f"DROP TABLE {t}")
    conn.execute("DROP TABLE rerank_log")  # version 4's
    conn.commit()
    conn.close()
    with TestClient(create_app(settings, embedder=embedder)) as c:
        assert _in_step(c, "plain")["stemmer"] == "none"
        assert _lexical_ids(c, "plain", "run") == []
        assert _lexical_ids(c, "plain", "running") == ["river"]


def test_the_old_fixture_gains_its_lexical_index(tmp_path, embedder, caplog):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    path = data / "kb.sqlite3"
    shutil.copy(FIXTURE / "kb.sqlite3", path)  # never touch the fixture
    caplog.set_level(logging.INFO, logger="app.collections.store")
    with TestClient(create_app(Settings(data_dir=data), embedder=embedder)) as c:
        info = _in_step(c, "kb")
        assert info["documents"] == 6 and info["stemmer"] == "porter"
        messages = [r.getMessage() for r in caplog.records]
        assert any("building the lexical index" in m for m in messages), messages
        assert any("6 of 6 documents" in m for m in messages), messages
        assert _lexical_ids(c, "kb", "France") == ["paris"]
        # The old stored (Platt) calibrator ranks hybrid pools too.
        r = c.post(
            "/v1/collections/kb/search",
            json={"query": "What is the capital of France?", "mode": "hybrid"},
        )
        assert r.status_code == 200, r.text
        assert r.json()["hits"][0]["id"] == "paris"
        assert all(h["probability"] is not None for h in r.json()["hits"])
        _fts_integrity(path)
        _replace_and_delete_keep_the_index(c, "kb", "paris", "python", path)
    assert _schema_version(path) == str(SCHEMA_VERSION)
