"""The embedder against sentence-transformers itself: raw norms, unit vectors, tokens."""

from __future__ import annotations

import numpy as np
import pytest

TEXTS = [
    "Aspirin reduces the risk of heart attack.",
    "hello",
    "A rather longer sentence about the calibration of retrieval scores in RAG systems.",
]


@pytest.fixture(scope="module")
def reference_model():
    from sentence_transformers import SentenceTransformer

    from app.settings import default_model_path

    return SentenceTransformer(default_model_path(), device="cpu")


def test_pipeline_of_bundled_model_ends_in_normalize(reference_model):
    from sentence_transformers.models import Normalize

    assert isinstance(list(reference_model)[-1], Normalize)


def test_norm_is_length_before_normalize(embedder, reference_model):
    batch = embedder.embed(TEXTS, "document")
    # Oracle: mean-pool the token embeddings ourselves, as the Pooling module should.
    out = reference_model.encode(TEXTS, output_value=None)
    for i, item in enumerate(out):
        mask = item["attention_mask"].numpy().astype(np.float64)
        tokens = item["token_embeddings"].numpy().astype(np.float64)[: len(mask)]
        pooled = (tokens * mask[:, None]).sum(0) / mask.sum()
        assert batch.norms[i] == pytest.approx(np.linalg.norm(pooled), rel=1e-4)
        assert int(batch.n_tokens[i]) == int(mask.sum())
    # The raw norms are far from 1: the Normalize module really was skipped.
    assert np.all(np.abs(batch.norms - 1.0) > 0.5)


def test_unit_vectors_match_the_normalized_model_output(embedder, reference_model):
    batch = embedder.embed(TEXTS, "query")
    expected = reference_model.encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(np.linalg.norm(batch.vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(batch.vectors, expected, atol=2e-5)
    assert batch.vectors.dtype == np.float32
    assert batch.norms.dtype == np.float64


def test_order_is_preserved_across_length_sorted_batches(embedder):
    texts = [("word " * n).strip() for n in (50, 1, 20, 3, 80, 2)]
    together = embedder.embed(texts, "document")
    one_by_one = [embedder.embed([t], "document") for t in texts]
    for i, single in enumerate(one_by_one):
        assert together.norms[i] == pytest.approx(single.norms[0], rel=1e-4)


def test_truncation_is_reported(embedder):
    batch = embedder.embed(["short", "token " * 400], "document")
    assert batch.truncated.tolist() == [False, True]
    assert int(batch.n_tokens[1]) == embedder.max_seq_length


def test_prompts_change_only_their_side(embedder):
    from app.embedding import SentenceTransformerEmbedder
    from app.settings import default_model_path

    prompted = SentenceTransformerEmbedder(
        default_model_path(), model_name="m", prompts={"query": "query: "}
    )
    plain = embedder.embed(["cats"], "query")
    assert prompted.embed(["cats"], "query").norms[0] != pytest.approx(plain.norms[0])
    assert prompted.embed(["cats"], "document").norms[0] == pytest.approx(
        embedder.embed(["cats"], "document").norms[0]
    )


@pytest.mark.parametrize(
    ("lengths", "max_rows", "max_tokens"),
    [
        ([256] * 40 + [12] * 100, 32, 512),
        ([300, 5, 300, 40, 1, 0, 77], 4, 100),
        ([10] * 7, 3, 10_000),
        ([], 32, 512),
    ],
)
def test_forward_passes_respect_both_bounds(lengths, max_rows, max_tokens):
    from app.embedding.base import forward_passes

    lengths = np.array(lengths, dtype=np.int64)
    passes = forward_passes(lengths, max_rows, max_tokens)
    seen = np.concatenate(passes) if passes else np.zeros(0, np.int64)
    assert sorted(seen.tolist()) == list(range(lengths.size))  # each text once
    assert list(lengths[seen]) == sorted(lengths, reverse=True)  # longest first
    for rows in passes:
        assert 1 <= rows.size <= max_rows
        # Within the budget, unless one text alone is over it.
        assert rows.size == 1 or rows.size * lengths[rows].max() <= max_tokens


def test_passes_of_a_few_long_texts_give_the_same_embeddings(embedder, monkeypatch):
    texts = [("calibrated retrieval " * n).strip() for n in (3, 120, 40, 1, 90, 7)]
    monkeypatch.setattr(embedder, "max_batch_tokens", 16)  # each text alone
    apart = embedder.embed(texts, "document")
    monkeypatch.setattr(embedder, "max_batch_tokens", 1 << 20)  # one pass of six
    together = embedder.embed(texts, "document")
    np.testing.assert_allclose(apart.norms, together.norms, rtol=1e-5)
    np.testing.assert_allclose(apart.vectors, together.vectors, atol=1e-5)
    np.testing.assert_array_equal(apart.n_tokens, together.n_tokens)
