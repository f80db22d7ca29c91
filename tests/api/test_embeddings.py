"""``POST /v1/embeddings``: OpenAI's shape, the raw norm, the limits of ``/v1/embed``.

The shape, the limits and the refusals do not depend on what the model makes of a
text: the deterministic fake embeds here. OpenAI's own client against a live server
with the real model is ``tests/client/test_openai.py``.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.settings import Limits, Settings
from tests.conftest import assert_problem
from tests.support.fakes import FAKE_MODEL_ID, FAKE_MODEL_NAME

pytestmark = pytest.mark.fake_embedder

LIMITS = Limits(max_texts_per_request=3, max_text_chars=40)
TEXTS = ["does aspirin prevent heart attacks?", "Paris is the capital of France."]


@pytest.fixture
def client(tmp_path, embedder):
    settings = Settings(data_dir=tmp_path / "data", limits=LIMITS)
    with TestClient(create_app(settings, embedder=embedder)) as c:
        yield c


def _embeddings(client, **body):
    return client.post("/v1/embeddings", json=body)


def test_the_openai_shape_with_the_norm_and_the_same_vectors_as_embed(client):
    r = _embeddings(client, input=TEXTS, model=FAKE_MODEL_NAME)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"object", "data", "model", "usage"}
    assert body["object"] == "list" and body["model"] == FAKE_MODEL_NAME
    ours = client.post("/v1/embed", json={"texts": TEXTS}).json()["data"]
    assert [d["index"] for d in body["data"]] == [0, 1]
    for item, embed in zip(body["data"], ours, strict=True):
        assert set(item) == {"object", "embedding", "index", "norm", "truncated"}
        assert item["object"] == "embedding"
        assert item["embedding"] == embed["embedding"]
        assert item["norm"] == embed["norm"] and item["truncated"] == embed["truncated"]
        assert np.linalg.norm(item["embedding"]) == pytest.approx(1.0, abs=1e-5)
    tokens = sum(e["n_tokens"] for e in ours)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_one_string_input_and_no_model(client):
    r = _embeddings(client, input=TEXTS[0])
    assert r.status_code == 200, r.text
    (item,) = r.json()["data"]
    many = _embeddings(client, input=TEXTS).json()["data"]
    assert item["embedding"] == many[0]["embedding"] and item["index"] == 0


def test_base64_is_the_little_endian_float32_bytes(client):
    floats = _embeddings(client, input=TEXTS).json()["data"]
    r = _embeddings(client, input=TEXTS, encoding_format="base64")
    assert r.status_code == 200, r.text
    for item, plain in zip(r.json()["data"], floats, strict=True):
        decoded = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.float32(plain["embedding"]))
        assert item["norm"] == plain["norm"]


@pytest.mark.parametrize(
    "model", [FAKE_MODEL_NAME, FAKE_MODEL_NAME.rsplit("/", 1)[-1], FAKE_MODEL_ID]
)
def test_the_served_model_by_name_short_name_or_identity(client, model):
    assert _embeddings(client, input="x", model=model).status_code == 200


def test_the_prompt_side_is_normcals_extension(client):
    r = _embeddings(client, input="x", input_type="query")
    assert r.status_code == 200, r.text


# -- limits: the bound is served, one past it is a 422 naming the field ---------------
@pytest.mark.parametrize(
    ("ok", "past", "field"),
    [
        ({"input": ["a"] * 3}, {"input": ["a"] * 4}, "input"),
        ({"input": ["a", "b" * 40]}, {"input": ["a", "b" * 41]}, "input.1"),
        ({"input": "b" * 40}, {"input": "b" * 41}, "input"),
        ({"input": "a", "user": "u" * 256}, {"input": "a", "user": "u" * 257}, "user"),
    ],
    ids=["texts", "characters of a listed text", "characters of one text", "user"],
)
def test_limits_at_the_bound_and_one_past(client, ok, past, field):
    assert _embeddings(client, **ok).status_code == 200
    body = assert_problem(_embeddings(client, **past))
    assert field in body["detail"] or any(
        ".".join(map(str, e["loc"])).endswith(field) for e in body["errors"]
    ), body


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": ["a", "  "]}, "input"),
        ({"input": [1, 2, 3]}, "input"),  # token ids: this model has its own tokenizer
        ({"input": [[1, 2], [3]]}, "input"),
        ({}, "input"),
        ({"input": "a", "model": "text-embedding-3-small"}, "model"),
        ({"input": "a", "dimensions": 256}, "dimensions"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "input_type": "passage"}, "input_type"),
        ({"input": "a", "temperature": 1}, "temperature"),
    ],
)
def test_bad_input_is_a_422_naming_the_field(client, body, field):
    problem = assert_problem(_embeddings(client, **body))
    locs = [".".join(map(str, e["loc"])) for e in problem.get("errors") or []]
    assert field in problem["detail"] or any(field in loc for loc in locs), problem


def test_the_models_own_dimension_is_accepted(client, embedder):
    r = _embeddings(client, input="a", dimensions=embedder.dim)
    assert (
        r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == embedder.dim
    )


def test_another_models_name_is_refused_saying_which_model_serves(client):
    body = assert_problem(
        _embeddings(client, input="a", model="text-embedding-3-small")
    )
    assert body["type"] == "/problems/invalid-request"
    assert FAKE_MODEL_NAME in body["detail"] and FAKE_MODEL_ID in body["detail"]
