"""The LangChain retriever against the real service (in-process), plus wire checks."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from app.client import AsyncNormcalClient, NormcalClient, SearchResult
from tests.app.live import ThreadServer

langchain_core = pytest.importorskip("langchain_core")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.retrievers import BaseRetriever  # noqa: E402

from app.integrations.langchain import (  # noqa: E402
    NormcalRetriever,
    documents_from_result,
)
from tests.app.corpus import CORPUS  # noqa: E402

DOCS = [
    {"id": key, "text": text, "metadata": {"topic": key, "source": f"{key}.txt"}}
    for key, text in CORPUS.items()
]


def test_service_and_client_do_not_import_langchain():
    code = (
        "import sys, app.api.app, app.client, app.integrations, app.ops.cli; "
        "assert 'langchain_core' not in sys.modules, 'langchain imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.fixture(scope="module")
def live(tmp_path_factory, embedder):
    from app.api.app import create_app
    from app.settings import Settings

    settings = Settings(data_dir=tmp_path_factory.mktemp("lc-data"))
    with ThreadServer(create_app(settings, embedder=embedder)) as server:
        with NormcalClient(server.url) as nc:
            nc.create_collection("kb")
            nc.upsert_documents("kb", DOCS)
        yield server


def test_retriever_returns_documents_with_normcal_metadata(live):
    retriever = NormcalRetriever(collection="kb", base_url=live.url, k=3)
    assert isinstance(retriever, BaseRetriever)
    docs = retriever.invoke("What is the capital of France?")
    assert len(docs) == 3 and all(isinstance(d, Document) for d in docs)
    top = docs[0]
    assert top.id == "paris" and top.page_content == CORPUS["paris"]
    meta = top.metadata
    assert meta["id"] == "paris" and meta["source"] == "paris.txt"
    assert meta["rank"] == 0 and [d.metadata["rank"] for d in docs] == [0, 1, 2]
    assert 0 < meta["score"] <= 1 and meta["norm"] > 0 and meta["n_tokens"] > 3
    for key in ("probability", "confidence", "calibrator"):
        assert key in meta  # None until a calibrator applies, numbers after
    scores = [d.metadata["score"] for d in docs]
    assert scores == sorted(scores, reverse=True)


def test_retriever_matches_the_service_answer(live):
    """Whatever the service decides (probabilities, filters, abstain), the
    retriever returns exactly that, as Documents."""
    with NormcalClient(live.url) as nc:
        for kwargs in (
            {"min_probability": 0.5},
            {"target_precision": 0.8},
            {"min_probability": 0.0, "target_precision": 0.0},
        ):
            retriever = NormcalRetriever(collection="kb", client=nc, k=5, **kwargs)
            for query in ("Does aspirin prevent heart attacks?", "zxqv blorp"):
                docs = retriever.invoke(query)
                result = nc.search("kb", query, k=5, include_text=True, **kwargs)
                assert docs == documents_from_result(result)
                if result.abstain:
                    assert docs == []
                floor = kwargs.get("min_probability")
                for doc in docs:
                    p = doc.metadata["probability"]
                    if p is not None and floor is not None:
                        assert p >= floor


def test_retriever_filter_passes_through(live):
    # An off-topic query under a filter: the service abstains, so look past that.
    retriever = NormcalRetriever(
        collection="kb",
        base_url=live.url,
        k=5,
        filter={"topic": "faiss"},
        honour_abstain=False,
    )
    docs = retriever.invoke("capital of France")
    assert [d.id for d in docs] == ["faiss"]


@pytest.mark.anyio
async def test_async_retriever_through_asgi(app):
    from asgi_lifespan import LifespanManager

    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with AsyncNormcalClient("http://normcal", transport=transport) as anc:
            await anc.create_collection("akb")
            await anc.upsert_documents("akb", DOCS)
            retriever = NormcalRetriever(collection="akb", async_client=anc, k=2)
            docs = await retriever.ainvoke("Does aspirin prevent heart attacks?")
    assert len(docs) == 2 and docs[0].id == "aspirin"
    assert docs[0].page_content == CORPUS["aspirin"]
    assert docs[0].metadata["topic"] == "aspirin" and docs[0].metadata["norm"] > 0


@pytest.mark.anyio
async def test_async_retriever_with_own_client(live):
    retriever = NormcalRetriever(collection="kb", base_url=live.url, k=1)
    docs = await retriever.ainvoke("plants and sunlight")
    assert [d.id for d in docs] == ["photosynthesis"]


# ---------------------------------------------- calibrated answers (wire-level)


def _result(abstain, probabilities, confidence=0.4):
    hits = [
        {
            "id": f"d{i}",
            "score": 0.9 - i / 10,
            "probability": p,
            "norm": 4.0,
            "n_tokens": 7,
            "metadata": {"probability": "doc's own", "lang": "en"},
            "text": f"text {i}",
        }
        for i, p in enumerate(probabilities)
    ]
    return {
        "query": {"norm": 3.5, "n_tokens": 6, "truncated": False},
        "hits": hits,
        "confidence": confidence,
        "abstain": abstain,
        "calibrator": {"id": "cal-7", "method": "nt-list", "default": False},
    }


def _mock_retriever(answer, **kwargs):
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=answer)

    client = NormcalClient("http://mock", transport=httpx.MockTransport(handler))
    return NormcalRetriever(collection="kb", client=client, **kwargs), seen


def test_abstain_returns_nothing():
    retriever, seen = _mock_retriever(_result(True, [0.2, 0.1]), min_probability=0.05)
    assert retriever.invoke("anything") == []
    body = json.loads(seen[0].content)
    assert body == {
        "query": "anything",
        "k": 4,
        "include_text": True,
        "min_probability": 0.05,
    }


def test_abstain_can_be_ignored():
    retriever, _ = _mock_retriever(_result(True, [0.2]), honour_abstain=False)
    assert [d.id for d in retriever.invoke("q")] == ["d0"]


def test_calibrated_hits_carry_probability_and_win_name_clashes():
    retriever, seen = _mock_retriever(
        _result(False, [0.91, 0.55]), target_precision=0.7, k=2
    )
    docs = retriever.invoke("q")
    assert [d.metadata["probability"] for d in docs] == [0.91, 0.55]
    assert docs[0].metadata["lang"] == "en"  # the document's own metadata stays
    assert docs[0].metadata["confidence"] == 0.4
    assert docs[0].metadata["calibrator"] == "cal-7"
    assert json.loads(seen[0].content)["target_precision"] == 0.7


def test_documents_from_result_empty_hits():
    result = SearchResult.model_validate(_result(False, []))
    assert documents_from_result(result) == []


def test_probability_bounds_are_validated():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        NormcalRetriever(collection="kb", min_probability=1.5)
