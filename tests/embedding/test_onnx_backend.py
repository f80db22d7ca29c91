"""The ONNX Runtime backend returns what the torch backend returns (real model, real graph).

The graph is exported once per module (torch's exporter, a few seconds to a minute);
every test compares against the session's torch embedder.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.api.lifespan import load_embedder
from app.cli.main import main as cli_main
from app.embedding.identity import IDENTITY_PREFIX, model_identity
from app.embedding.onnx_backend import (
    OnnxEmbedder,
    PipelineConfig,
    UnsupportedModelError,
)
from app.embedding.onnx_export import (
    GRAPH,
    MANIFEST,
    OnnxExportError,
    ensure_onnx,
    valid_export,
)
from app.settings import Settings, default_model_path
from tests.support.server import ServerProcess, source_env

pytestmark = pytest.mark.slow

WORDS = (
    "the calibration of retrieval scores aspirin reduces heart attack risk in "
    "patients with type 2 diabetes Über naïve café 東京 😀 , . ; - ( ) 42 x-ray "
    "immunohistochemistry"
).split()


def mixed_texts(n: int, seed: int = 0) -> list[str]:
    """Short queries to texts far past 256 tokens, with edge cases up front."""
    rng = np.random.default_rng(seed)
    edge = ["", " ", "  padded query  ", "hello", "\tTabs?\n", "a " * 300]
    lengths = rng.integers(1, 450, size=n - len(edge))
    return edge + [" ".join(rng.choice(WORDS, size=int(k))) for k in lengths]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A graph of the bundled model, exported once for the module by the CLI."""
    out = tmp_path_factory.mktemp("onnx")
    assert cli_main(["export-onnx", "--out", str(out)]) == 0
    assert valid_export(out, model_identity(default_model_path())) is None
    return out


@pytest.fixture(scope="module")
def onnx_embedder(exported):
    settings = Settings(
        embedding_backend="onnx", onnx_path=exported, data_dir=exported / "unused"
    )
    model = load_embedder(settings)
    assert isinstance(model, OnnxEmbedder)
    return model


def test_sessions_do_not_spin_and_take_the_one_thread_setting(onnx_embedder):
    options = onnx_embedder._session.get_session_options()
    for pool in ("intra_op", "inter_op"):
        assert options.get_session_config_entry(f"session.{pool}.allow_spinning") == "0"
    assert options.intra_op_num_threads == Settings().embed_threads == 1
    assert onnx_embedder.precision_choice.precision == "fp32"


def test_equivalent_to_torch_on_mixed_lengths(real_embedder, onnx_embedder):
    texts = mixed_texts(100)
    for input_type in ("document", "query"):
        ref = real_embedder.embed(texts, input_type)
        got = onnx_embedder.embed(texts, input_type)
        assert ref.truncated.sum() >= 10 and (~ref.truncated).sum() >= 10
        np.testing.assert_array_equal(got.n_tokens, ref.n_tokens)
        np.testing.assert_array_equal(got.truncated, ref.truncated)
        rel = np.abs(got.norms - ref.norms) / ref.norms
        assert rel.max() <= 0.005
        assert np.sum(got.vectors * ref.vectors, axis=1).min() >= 0.9999
        assert got.vectors.dtype == np.float32 and got.norms.dtype == np.float64
    assert onnx_embedder.model_id == real_embedder.model_id
    assert onnx_embedder.dim == real_embedder.dim
    assert onnx_embedder.max_seq_length == real_embedder.max_seq_length
    assert len(onnx_embedder.embed([], "query")) == 0


def test_corrupt_cache_is_rebuilt(tmp_path, exported):
    model_path = default_model_path()
    model_id = model_identity(model_path)
    cache = tmp_path / "onnx" / model_id.removeprefix(IDENTITY_PREFIX)
    shutil.copytree(exported, cache)
    assert ensure_onnx(model_path, tmp_path) == cache / GRAPH  # valid: reused
    size = (cache / GRAPH).stat().st_size
    with (cache / GRAPH).open("r+b") as handle:
        handle.truncate(size // 2)
    assert "sha256" in (valid_export(cache, model_id) or "")
    assert ensure_onnx(model_path, tmp_path) == cache / GRAPH
    assert valid_export(cache, model_id) is None
    assert (cache / GRAPH).stat().st_size > size // 2


def test_stale_manifest_is_not_trusted(tmp_path, exported):
    """Another model's or exporter's graph: refused (and a bad NORMCAL_ONNX_PATH too)."""
    model_id = model_identity(default_model_path())
    stale = tmp_path / "stale"
    shutil.copytree(exported, stale)
    manifest = json.loads((stale / MANIFEST).read_text())
    for key, value in (("model_id", "sha256:0000"), ("onnxruntime", "0.1")):
        (stale / MANIFEST).write_text(json.dumps({**manifest, key: value}))
        assert key in (valid_export(stale, model_id) or "")
    (stale / MANIFEST).write_text("{not json")
    assert "unreadable" in (valid_export(stale, model_id) or "")
    assert valid_export(exported, model_id) is None


def test_no_exporter_and_no_graph_is_a_clear_error(tmp_path, monkeypatch):
    import app.embedding.onnx_export as onnx_export

    real = onnx_export._version
    monkeypatch.setattr(
        onnx_export, "_version", lambda name: None if name == "torch" else real(name)
    )
    with pytest.raises(OnnxExportError, match="NORMCAL_ONNX_PATH"):
        ensure_onnx(default_model_path(), tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {
                "pooling_mode_mean_tokens": False,
                "pooling_mode_weightedmean_tokens": True,
            },
            "exactly one",
        ),
        ({"pooling_mode_max_tokens": True}, "exactly one"),
        (
            {"pooling_mode_mean_tokens": False, "pooling_mode_lasttoken": True},
            "exactly one",
        ),
    ],
)
def test_unsupported_pooling_is_refused(tmp_path, change, message):
    model = tmp_path / "model"
    shutil.copytree(default_model_path(), model)
    config = model / "1_Pooling" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **change}))
    with pytest.raises(UnsupportedModelError, match=message):
        PipelineConfig.read(model)


def test_extra_module_is_refused(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(default_model_path(), model)
    modules = json.loads((model / "modules.json").read_text())
    modules.insert(
        2,
        {
            "idx": 2,
            "name": "2",
            "path": "2_Dense",
            "type": "sentence_transformers.models.Dense",
        },
    )
    (model / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(UnsupportedModelError, match="Dense"):
        PipelineConfig.read(model)


def _search(model, tmp_path, name: str) -> list[dict]:
    """Ingest a small corpus through HTTP and run searches with the default profile."""
    docs = [
        {"id": f"d{i}", "text": t}
        for i, t in enumerate(
            [
                *mixed_texts(40, seed=1)[2:],  # the API refuses blank texts
                "Aspirin lowers the risk of a second heart attack.",
                "Vitamin D supplements and bone density in older adults.",
            ]
        )
    ]
    queries = ["aspirin heart attack", "vitamin D bone", "calibration of scores"]
    settings = Settings(data_dir=tmp_path / name)
    with TestClient(create_app(settings, embedder=model)) as client:
        assert client.post("/v1/collections", json={"name": "c"}).status_code == 201
        r = client.put("/v1/collections/c/documents", json={"documents": docs})
        assert r.status_code == 200, r.text
        out = []
        for q in queries:
            body = client.post(
                "/v1/collections/c/search", json={"query": q, "k": 5}
            ).json()
            assert body["calibrator"]["default"] is True
            out.append(body)
        return out


def test_default_profile_gives_the_same_probabilities(
    tmp_path, real_embedder, onnx_embedder
):
    torch_results = _search(real_embedder, tmp_path, "torch")
    onnx_results = _search(onnx_embedder, tmp_path, "onnx")
    for ref, got in zip(torch_results, onnx_results, strict=True):
        assert [h["id"] for h in got["hits"]] == [h["id"] for h in ref["hits"]]
        np.testing.assert_allclose(
            [h["probability"] for h in got["hits"]],
            [h["probability"] for h in ref["hits"]],
            atol=1e-3,
        )
        assert got["confidence"] == pytest.approx(ref["confidence"], abs=1e-3)


@pytest.mark.server
def test_service_boots_with_the_onnx_backend(tmp_path, exported, real_embedder):
    env = source_env(NORMCAL_EMBEDDING_BACKEND="onnx", NORMCAL_ONNX_PATH=str(exported))
    server = ServerProcess(tmp_path / "data", env=env).start()
    try:
        r = httpx.post(
            f"{server.url}/v1/embed",
            json={"texts": ["aspirin and heart attack"], "input_type": "query"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        got = r.json()
    finally:
        server.stop()
    ref = real_embedder.embed(["aspirin and heart attack"], "query")
    item = got["data"][0]
    assert item["n_tokens"] == int(ref.n_tokens[0])
    assert item["norm"] == pytest.approx(float(ref.norms[0]), rel=1e-4)


def test_onnx_path_imports_no_torch(exported):
    """With a pre-exported graph, embedding loads no torch, transformers or
    sentence-transformers: a runtime image can leave them out."""
    code = (
        "import sys\n"
        "from app.api.lifespan import load_embedder\n"
        "from app.settings import Settings\n"
        f"s = Settings(embedding_backend='onnx', onnx_path={str(exported)!r})\n"
        "batch = load_embedder(s).embed(['aspirin'], 'query')\n"
        "assert batch.norms[0] > 0\n"
        "heavy = ('torch', 'transformers', 'sentence_transformers')\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env=source_env(),
        timeout=300,
    )
    assert out.stdout.strip() == ""


TORCH_SIDE = ("torch", "transformers", "sentence_transformers", "onnx")


def torch_free_env(tmp_path, **extra: str) -> dict[str, str]:
    """A child environment where the torch side cannot be imported, as in the
    torch-free image: a ``sitecustomize`` puts a finder first on ``sys.meta_path``
    that refuses those modules (and so their submodules), so a stray import fails
    the child loudly and an optional one sees them absent."""
    site = tmp_path / "torch-free-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "class Blocker:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.partition('.')[0] in {TORCH_SIDE!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Blocker())\n",
        encoding="utf-8",
    )
    env = source_env(**extra)
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    return env


@pytest.mark.server
def test_service_serves_search_without_the_torch_side(tmp_path, exported):
    """storage=local + backend=onnx boots, ingests and searches with calibrated
    probabilities while torch, transformers, sentence-transformers and onnx are
    unimportable: what the runtime-onnx image runs."""
    env = torch_free_env(
        tmp_path,
        NORMCAL_EMBEDDING_BACKEND="onnx",
        NORMCAL_ONNX_PATH=str(exported),
        NORMCAL_STORAGE="local",
    )
    server = ServerProcess(tmp_path / "data", env=env).start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            created = client.post("/v1/collections", json={"name": "c"})
            assert created.status_code in (200, 201), created.text
            docs = [{"id": "a", "text": "cats sleep in warm places"}]
            put = client.put("/v1/collections/c/documents", json={"documents": docs})
            assert put.status_code == 200, put.text
            found = client.post(
                "/v1/collections/c/search", json={"query": "where do cats sleep"}
            )
    finally:
        server.stop()
    assert found.status_code == 200, found.text
    hit = found.json()["hits"][0]
    assert hit["id"] == "a"
    assert 0.0 <= hit["probability"] <= 1.0


def test_export_onnx_fails_in_one_line_without_torch(tmp_path):
    """Where the torch side is missing, the exporter says so and names the image
    that has it, in one line, instead of a traceback."""
    out = subprocess.run(
        [sys.executable, "-m", "app.cli", "export-onnx", "--out", "graph"],
        capture_output=True,
        text=True,
        env=torch_free_env(tmp_path),
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("normcal: exporting to ONNX needs torch, ")
    assert "default normcal image" in out.stderr
    assert not (tmp_path / "graph").exists()


def test_torch_backend_names_what_is_missing_without_torch(tmp_path):
    code = (
        "from app.api.lifespan import load_embedder\n"
        "from app.embedding.base import MissingDependencyError\n"
        "from app.settings import Settings\n"
        "try:\n"
        "    load_embedder(Settings(embedding_backend='torch'))\n"
        "except MissingDependencyError as error:\n"
        "    print(error)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env=torch_free_env(tmp_path),
        timeout=300,
    )
    assert out.stdout.startswith(
        "NORMCAL_EMBEDDING_BACKEND=torch needs torch, transformers, "
        "sentence_transformers, not installed here"
    ), out.stdout
