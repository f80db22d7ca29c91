"""One owner per data dir: the lock, in one process (real subprocesses: tests/faults)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.cli.main import EXIT_BUSY, main
from app.collections.ownership import (
    LOCK_FILE,
    DataDirBusyError,
    lock_data_dir,
)
from app.collections.registry import restore_offline
from app.collections.store_files import build_store
from tests.collections.conftest import DIM


def test_the_lock_is_exclusive_names_its_holder_and_is_released(tmp_path):
    data = tmp_path / "fresh" / "data"  # created by the lock, 0700
    with lock_data_dir(data, "serve") as lock:
        assert (data / LOCK_FILE).read_text() == f"{os.getpid()} normcal serve\n"
        assert oct(data.stat().st_mode & 0o777) == "0o700"
        with pytest.raises(DataDirBusyError) as busy:
            lock_data_dir(data, "serve")  # another open file: flock refuses it too
        assert busy.value.holder == f"pid {os.getpid()} (normcal serve)"
        assert str(busy.value) == (
            f"data dir {data} is in use by pid {os.getpid()} (normcal serve)"
        )
    assert lock.path == data / LOCK_FILE
    lock_data_dir(data, "restore").release()  # free again once released


def test_offline_restore_is_refused_while_the_dir_is_owned(tmp_path, capsys):
    data = tmp_path / "data"
    snapshot = tmp_path / "kb-backup.sqlite3"
    meta = {"name": "kb", "model": "m", "dim": DIM, "created_at": 1.0}
    build_store(snapshot, meta, synchronous="OFF")
    with lock_data_dir(data, "serve"):
        with pytest.raises(DataDirBusyError):
            restore_offline(data, "kb", snapshot)
        argv = ["restore", str(snapshot), "--collection", "kb", "--data-dir", str(data)]
        assert main(argv) == EXIT_BUSY
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"pid {os.getpid()}" in err
        assert "POST /v1/collections/kb/snapshots/{id}/restore" in err
        assert sorted(p.name for p in data.iterdir()) == [LOCK_FILE]
    assert main(argv) == 0  # the owner is gone
    assert (data / "kb.sqlite3").is_file()


def test_a_lock_file_left_by_a_dead_holder_does_not_hold(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    (data / LOCK_FILE).write_text("999999 normcal serve\n")  # its holder is gone
    with lock_data_dir(data, "serve"):
        assert (data / LOCK_FILE).read_text() == f"{os.getpid()} normcal serve\n"
