"""OpenAI's own Python client pointed at normcal's ``/v1/embeddings``, unchanged.

A pipeline written for OpenAI's embeddings (``OpenAI(base_url=...)``) takes normcal's
vectors: the same unit vectors ``/v1/embed`` gives, through the client's default
base64 transfer and its float one, with the raw norm kept as an extra field.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from normcal_client import AsyncNormcalClient, NormcalClient

from tests.support.corpus import CORPUS, QUERIES

openai = pytest.importorskip("openai")

TEXTS = list(CORPUS.values())


def test_openai_client_gets_normcals_vectors_and_norms(live, embedder):
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
    with NormcalClient(live.url) as nc:
        ours = nc.embed(TEXTS).data
    # The client asks for base64 unless told otherwise, and decodes it itself.
    for encoding in ({}, {"encoding_format": "float"}):
        answer = client.embeddings.create(
            model=embedder.model_name, input=TEXTS, **encoding
        )
        assert answer.model == embedder.model_name
        assert [d.index for d in answer.data] == list(range(len(TEXTS)))
        for item, mine in zip(answer.data, ours, strict=True):
            np.testing.assert_allclose(item.embedding, mine.embedding, rtol=0, atol=0)
            assert item.model_extra["norm"] == mine.norm
        assert answer.usage.prompt_tokens == sum(e.n_tokens for e in ours)
    one = client.embeddings.create(model=embedder.model_name, input=QUERIES["paris"])
    assert len(one.data) == 1 and len(one.data[0].embedding) == embedder.dim


def test_openai_client_hears_why_another_model_is_refused(live):
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.embeddings.create(model="text-embedding-3-small", input="x")
    # The problem document reaches the caller as the error's body.
    assert "is not served here" in refused.value.body["detail"]


def test_normcal_clients_embeddings_method(live, embedder):
    with NormcalClient(live.url) as nc:
        sync = nc.embeddings(TEXTS[:2], model=embedder.model_name)
        b64 = nc.embeddings(TEXTS[0], encoding_format="base64")

    async def run():
        async with AsyncNormcalClient(live.url) as nc:
            return await nc.embeddings(TEXTS[:2], input_type="query")

    asynced = asyncio.run(run())
    assert [d.embedding for d in sync.data] == [d.embedding for d in asynced.data]
    assert isinstance(b64.data[0].embedding, str)
    assert sync.usage.total_tokens == sync.usage.prompt_tokens > 0
