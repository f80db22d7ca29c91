"""What a collection file must be: the exact schema, typed meta, integrity (no model)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from app.cli.main import EXIT_INPUT, main
from app.collections.checks import (
    check_file,
    check_meta,
    expected_schema,
    normalise_sql,
    read_schema,
    schema_differences,
)
from app.collections.registry import CollectionRegistry
from app.collections.store_files import SCHEMA_VERSION, UnusableStoreError, build_store
from tests.collections.conftest import DIM, new_docs
from tests.conftest import alter_sqlite

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "old_format"
META = {"name": "kb", "model": "m", "dim": DIM, "created_at": 1.0}


@pytest.fixture
def built(tmp_path: Path) -> Path:
    """A collection file this code made, with a few documents."""
    registry = CollectionRegistry(
        tmp_path / "data",
        model_name="m",
        dim=DIM,
        synchronous="OFF",
        load_calibrator=dict,
    )
    registry.load()
    registry.create("kb").upsert(new_docs(["a", "b", "c"]))
    registry.close()
    return tmp_path / "data" / "kb.sqlite3"


def _differences(path: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return schema_differences(
            read_schema(conn), expected_schema("current", "porter")
        )
    finally:
        conn.close()


def test_a_file_this_code_made_passes_and_old_versions_pass(built, tmp_path):
    assert check_file(built)["name"] == "kb"
    assert _differences(built) == []
    old = tmp_path / "old.sqlite3"  # version 1, from an older normcal
    shutil.copy(FIXTURE / "kb.sqlite3", old)
    assert check_file(old)["dim"] == 384


@pytest.mark.parametrize(
    ("statements", "problem"),
    [
        (
            ["ALTER TABLE documents DROP COLUMN updated_at"],
            "table 'documents' lacks column 'updated_at'",
        ),
        (
            ["ALTER TABLE documents ADD COLUMN extra TEXT"],
            "table 'documents' has an extra column 'extra'",
        ),
        (["CREATE INDEX by_text ON documents(text)"], "extra index 'by_text'"),
        (
            ["CREATE VIEW everything AS SELECT * FROM documents"],
            "extra view 'everything'",
        ),
        (
            [
                "CREATE TRIGGER eat AFTER INSERT ON documents BEGIN "
                "DELETE FROM documents WHERE seq = new.seq; END"
            ],
            "extra trigger 'eat'",
        ),
        (["DROP INDEX query_log_last_seen"], "missing index 'query_log_last_seen'"),
        (
            [
                "DROP TRIGGER documents_fts_ai",
                "CREATE TRIGGER documents_fts_ai AFTER INSERT ON documents BEGIN "
                "DELETE FROM documents WHERE seq = new.seq; END",
            ],
            "trigger 'documents_fts_ai' is defined differently",
        ),
        (["CREATE TABLE notes (x TEXT)"], "extra table 'notes'"),
    ],
    ids=[
        "missing-column",
        "extra-column",
        "extra-index",
        "extra-view",
        "extra-trigger",
        "missing-index",
        "replaced-trigger",
        "extra-table",
    ],
)
def test_any_schema_difference_is_named_and_refused(built, statements, problem):
    alter_sqlite(built, *statements)
    assert problem in _differences(built)
    with pytest.raises(UnusableStoreError, match="schema differs") as refused:
        check_file(built)
    assert problem in str(refused.value)


def test_comments_and_spacing_do_not_count_but_quoted_text_does():
    assert normalise_sql("CREATE TABLE t (  -- note\n a INT /* x */ )") == (
        "CREATE TABLE t ( a INT )"
    )
    assert normalise_sql("SELECT '--  a'") == "SELECT '--  a'"
    assert normalise_sql("SELECT 'a  b'") != normalise_sql("SELECT 'a b'")


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        (
            {"query_log": {"enabled": "yes please", "retention": -4}},
            "meta 'query_log.enabled'",
        ),
        (
            {"query_log": {"enabled": True, "retention": -4}},
            "meta 'query_log.retention'",
        ),
        ({"surprise": 1}, "meta 'surprise': not a key normcal writes"),
        ({"dim": True}, "meta 'dim'"),
        ({"dim": 0}, "meta 'dim'"),
        ({"created_at": "yesterday"}, "meta 'created_at'"),
        ({"stemmer": "snowball"}, "meta 'stemmer'"),
        ({"index_type": "ivf"}, "meta 'index_type'"),
        ({"schema_version": SCHEMA_VERSION + 1}, "written by a newer normcal"),
        ({"active_calibrator": 5}, "meta 'active_calibrator'"),
    ],
)
def test_meta_is_decoded_by_its_typed_model(extra, problem):
    with pytest.raises(UnusableStoreError, match=problem):
        check_meta({**META, **extra})


def test_meta_the_server_writes_is_accepted():
    meta = {
        **META,
        "description": "d",
        "model_id": "sha256:x",
        "index_type": "hnsw",
        "stemmer": "none",
        "schema_version": SCHEMA_VERSION,
        "active_calibrator": "abc",
        "query_log": {"enabled": True, "retention": 10},
    }
    assert check_meta(meta).query_log is not None
    with pytest.raises(UnusableStoreError, match="meta lacks dim"):
        check_meta({k: v for k, v in META.items() if k != "dim"})


def test_bad_meta_values_and_documents_are_refused_in_the_file(built):
    alter_sqlite(built, "UPDATE meta SET value = 'not json' WHERE key = 'model'")
    with pytest.raises(UnusableStoreError, match="meta 'model' is not JSON"):
        check_file(built)
    alter_sqlite(
        built,
        "UPDATE meta SET value = '\"m\"' WHERE key = 'model'",
        "UPDATE documents SET vector = x'00' WHERE id = 'b'",
    )
    with pytest.raises(UnusableStoreError, match="document 'b'"):
        check_file(built)


def test_start_up_quarantines_a_file_that_fails_the_checks(built):
    good = built.with_name("good.sqlite3")
    build_store(good, {**META, "name": "good"}, synchronous="OFF")
    alter_sqlite(
        built,
        "CREATE TRIGGER eat AFTER INSERT ON documents BEGIN "
        "DELETE FROM documents WHERE seq = new.seq; END",
    )
    before = built.read_bytes()
    registry = CollectionRegistry(
        built.parent, model_name="m", dim=DIM, synchronous="OFF", load_calibrator=dict
    )
    registry.load()
    try:
        assert registry.names() == ["good"]
        (broken,) = registry.unavailable()
        assert broken.name == "kb" and "extra trigger 'eat'" in broken.reason
    finally:
        registry.close()
    assert built.read_bytes() == before  # quarantined files are never modified


def test_offline_restore_of_a_crafted_snapshot_exits_3_and_changes_nothing(
    built, tmp_path, capsys
):
    snapshot = tmp_path / "crafted.sqlite3"
    shutil.copy(built, snapshot)
    alter_sqlite(
        snapshot,
        "CREATE TRIGGER eat AFTER INSERT ON documents BEGIN "
        "DELETE FROM documents WHERE seq = new.seq; END",
    )
    data = built.parent
    before = built.read_bytes()
    argv = ["restore", str(snapshot), "--collection", "kb", "--data-dir", str(data)]
    assert main(argv) == EXIT_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "schema differs: extra trigger 'eat'" in err, err
    assert built.read_bytes() == before
    assert not list(data.glob(".kb.creating-*"))  # the checked copy is gone
