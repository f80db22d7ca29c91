"""normcal_client against a real server (the client's own tests, with no server, are
in clients/python/tests)."""

from __future__ import annotations

import threading

import httpx
import pytest
from normcal_client import (
    NO_RETRY,
    AsyncNormcalClient,
    Conflict,
    InvalidRequest,
    NormcalClient,
    NotFound,
    PayloadTooLarge,
    RetryPolicy,
    Unauthorized,
)

from tests.support.corpus import CORPUS, QUERIES

DOCS = [
    {"id": key, "text": text, "metadata": {"topic": key, "even": i % 2 == 0}}
    for i, (key, text) in enumerate(CORPUS.items())
]


@pytest.fixture
def nc(live):
    with NormcalClient(live.url, retry=RetryPolicy(max_attempts=2, backoff=0.1)) as c:
        yield c


def test_real_lifecycle(nc):
    created = nc.create_collection("life", "docs")
    assert created.name == "life" and created.documents == 0
    with pytest.raises(Conflict):
        nc.create_collection("life")
    assert nc.create_collection("life", exist_ok=True).description == "docs"
    assert "life" in [c.name for c in nc.list_collections()]
    counts: list[int] = []
    done = nc.upsert_documents("life", iter(DOCS), batch_size=2, progress=counts.append)
    assert counts == [2, 4, 5] and done.upserted == 5 and done.ids == list(CORPUS)
    assert nc.get_collection("life").documents == 5
    doc = nc.get_document("life", "paris")
    assert doc.text == CORPUS["paris"] and doc.norm > 0
    assert [d.id for d in nc.get_documents("life", ["faiss", "nope", "paris"])] == [
        "faiss",
        "paris",
    ]
    result = nc.search("life", QUERIES["paris"], k=2, include_text=True)
    assert [h.id for h in result.hits][:1] == ["paris"] and len(result.hits) == 2
    assert result.hits[0].text == CORPUS["paris"]
    assert result.hits[0].probability is not None  # the shipped default profile
    filtered = nc.search("life", QUERIES["paris"], k=5, filter={"even": True})
    assert all(h.metadata["even"] is True for h in filtered.hits)
    sure = nc.search("life", QUERIES["paris"], k=5, min_probability=0.999999)
    assert all((h.probability or 0) >= 0.999999 for h in sure.hits)
    batch = nc.search_batch("life", [QUERIES["aspirin"], QUERIES["faiss"]], k=1)
    assert [r.hits[0].id for r in batch] == ["aspirin", "faiss"]
    embedded = nc.embed(["hello world"], "query")
    assert embedded.dim == len(embedded.data[0].embedding)
    nc.delete_document("life", "paris")
    with pytest.raises(NotFound) as caught:
        nc.get_document("life", "paris")
    assert caught.value.instance and caught.value.instance.startswith("urn:request:")
    nc.delete_documents("life", ["faiss", "paris"], missing_ok=True)
    with pytest.raises(NotFound):
        nc.delete_documents("life", ["faiss"])
    nc.delete_collection("life")
    with pytest.raises(NotFound):
        nc.get_collection("life")


def test_real_metadata_updates(nc):
    nc.create_collection("meta")
    nc.upsert_documents("meta", DOCS)
    norm = nc.get_document("meta", "paris").norm
    merged = nc.update_document("meta", "paris", {"even": None, "city": True})
    assert merged.metadata == {"topic": "paris", "city": True}
    assert merged.norm == norm  # not re-embedded
    replaced = nc.update_document("meta", "paris", {"only": 1}, mode="replace")
    assert replaced.metadata == {"only": 1}
    done = nc.update_documents("meta", {"faiss": {"x": 1}, "python": {"x": 2}})
    assert [(d.id, d.metadata["x"]) for d in done] == [("faiss", 1), ("python", 2)]
    with pytest.raises(NotFound):
        nc.update_documents("meta", {"faiss": {"x": 3}, "nope": {}})
    assert nc.get_document("meta", "faiss").metadata["x"] == 1  # all or nothing
    with pytest.raises(InvalidRequest):  # past limits.max_metadata_bytes
        nc.update_document("meta", "faiss", {"big": "x" * 20_000})
    nc.delete_collection("meta")


def test_real_validation_errors_are_typed(nc):
    nc.create_collection("val", exist_ok=True)
    with pytest.raises(InvalidRequest) as caught:
        nc.search("val", "q", k=0)
    assert caught.value.status == 422 and caught.value.errors
    with pytest.raises(InvalidRequest):
        nc.create_collection("no spaces allowed")
    with pytest.raises(TypeError):
        nc.embed("one string")  # type: ignore[arg-type]


def test_real_calibrators_and_feedback(nc):
    nc.create_collection("cal", exist_ok=True)
    nc.upsert_documents("cal", DOCS)
    before = nc.search("cal", QUERIES["paris"], k=3).calibrator
    assert before is not None and before.next_step is not None
    assert before.next_step.url == "/ui/collections/cal/judge"
    no_reference = nc.calibrator_drift("cal", str(before.id))
    assert no_reference.status == "no-reference" and no_reference.next_step
    judgments = [
        {"query": q, "document_id": d, "relevance": int(d == key)}
        for key, q in QUERIES.items()
        for d in CORPUS
    ]
    info = nc.fit_calibrator("cal", judgments, method="platt", k=5, allow_reorder=False)
    assert info.active and info.collection == "cal" and not info.reorders_hits
    assert info.id in [c.id for c in nc.list_calibrators("cal")]
    assert nc.get_calibrator("cal", info.id).cv
    assert nc.activate_calibrator("cal", info.id).id == info.id
    assert nc.reliability_png("cal", info.id).startswith(b"\x89PNG")
    assert "<html" in nc.calibrator_report("cal", info.id).lower()
    result = nc.search("cal", QUERIES["paris"], k=3)
    assert result.calibrator is not None and result.calibrator.id == info.id
    assert result.calibrator.next_step is None and result.calibrator.drift is None
    drift = nc.calibrator_drift("cal", info.id)
    assert drift.status == "insufficient-data" and drift.n_queries == 1
    assert drift.needed == drift.min_queries - 1
    stored = nc.feedback("cal", judgments[:3])
    assert stored.stored == 3 and stored.total >= 3


def test_real_calibrator_and_feedback_management(nc):
    """Delete, switch back to the default, export/import, list and delete feedback."""
    for name in ("mgmt", "mgmt-copy"):
        nc.create_collection(name, exist_ok=True)
        nc.upsert_documents(name, DOCS)
    judgments = [
        {"query": q, "document_id": key, "relevance": 1} for key, q in QUERIES.items()
    ]
    default = next(c for c in nc.list_calibrators("mgmt") if c.default)
    fitted = nc.fit_calibrator("mgmt", judgments, method="platt", k=5)
    with pytest.raises(Conflict):
        nc.delete_calibrator("mgmt", fitted.id)  # the active one
    assert nc.activate_calibrator("mgmt", default.id).default
    profile = nc.export_calibrator("mgmt", fitted.id)
    assert profile.id == fitted.id and profile.model_dump()["report"]
    copy = nc.import_calibrator("mgmt-copy", profile, activate=True)
    assert copy.active and copy.id != fitted.id
    with pytest.raises(InvalidRequest):
        nc.import_calibrator("mgmt-copy", {**profile.model_dump(), "model": "other"})
    nc.delete_calibrator("mgmt", fitted.id)
    with pytest.raises(NotFound):
        nc.get_calibrator("mgmt", fitted.id)

    nc.feedback("mgmt", judgments)
    first = nc.list_feedback("mgmt", limit=3)
    assert first.count == 3 and first.next_cursor is not None
    rest = nc.list_feedback("mgmt", cursor=first.next_cursor)
    assert [j.query for j in [*first.data, *rest.data]] == list(QUERIES.values())
    assert nc.delete_feedback("mgmt", query=QUERIES["paris"]).deleted == 1
    assert nc.delete_feedback("mgmt").deleted == len(QUERIES) - 1
    assert nc.list_feedback("mgmt").data == []


def test_real_judging_loop(nc):
    nc.create_collection("judge", exist_ok=True)
    nc.upsert_documents("judge", DOCS)
    assert nc.query_log("judge").enabled is False
    assert nc.set_query_log("judge", enabled=True, retention=10).retention == 10
    nc.search("judge", QUERIES["paris"], k=3)
    assert nc.query_log("judge").entries == 1
    assert nc.add_judging_queries("judge", [QUERIES["aspirin"]]).added == 1
    first = nc.next_to_judge("judge", k=2)
    assert first.source == "uploaded" and first.query == QUERIES["aspirin"]
    assert len(first.hits) == 2 and first.progress.judged_queries == 0
    nc.skip_query("judge", QUERIES["aspirin"])
    then = nc.next_to_judge("judge")
    assert then.source == "log" and then.query == QUERIES["paris"]
    assert then.progress.skipped == 1
    with pytest.raises(NotFound):
        nc.skip_query("judge", "never searched")


def test_shared_client_across_threads(nc):
    """One client, many threads, each with its own per-call options."""
    nc.create_collection("threads", exist_ok=True)
    nc.upsert_documents("threads", DOCS)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            client = nc.with_options(retry=NO_RETRY) if i % 2 else nc
            hit = client.search("threads", QUERIES["faiss"], k=1).hits[0]
            assert hit.id == "faiss"
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and nc.options.retry.max_attempts == 2


def test_real_search_modes_and_stemmer(nc):
    created = nc.create_collection("modes", stemmer="none")
    assert created.stemmer == "none" and created.lexical_indexed == 0
    assert nc.create_collection("porter", exist_ok=True).stemmer == "porter"
    nc.upsert_documents("modes", DOCS)
    info = nc.get_collection("modes")
    assert info.documents == info.lexical_indexed == info.indexed == len(DOCS)
    dense = nc.search("modes", QUERIES["paris"], k=3)
    assert dense.mode == "dense" and dense.hits[0].id == "paris"
    lexical = nc.search("modes", "capital", k=3, mode="lexical")
    assert lexical.mode == "lexical" and [h.id for h in lexical.hits] == ["paris"]
    assert lexical.hits[0].bm25 > 0
    hybrid = nc.search_batch("modes", ["capital"], k=3, mode="hybrid", candidates=4)
    assert hybrid[0].mode == "hybrid" and len(hybrid[0].hits) == 3
    assert all(h.probability is not None for h in hybrid[0].hits)
    with pytest.raises(InvalidRequest):
        nc.search("modes", "capital", k=5, candidates=4)
    nc.delete_collection("modes")


@pytest.mark.anyio
def test_real_fit_jobs(nc):
    nc.create_collection("jobs", exist_ok=True)
    nc.upsert_documents("jobs", DOCS)
    judgments = [
        {"query": q, "document_id": key, "relevance": 1} for key, q in QUERIES.items()
    ]
    started = nc.start_fit("jobs", judgments, method="platt", k=5)
    assert started.collection == "jobs" and started.status in {
        "queued",
        "running",
        "succeeded",
    }
    job = nc.wait_fit_job("jobs", started.id, timeout=300, poll_interval=0.05)
    assert job.status == "succeeded" and job.error is None
    assert job.calibrator is not None and job.calibrator.active
    assert job.progress.fraction == 1.0
    assert nc.get_fit_job("jobs", started.id) == job
    assert [j.id for j in nc.list_fit_jobs("jobs")] == [started.id]
    with pytest.raises(InvalidRequest):
        nc.start_fit("jobs", [{"query": "q", "document_id": "nope", "relevance": 1}])
    with pytest.raises(NotFound):
        nc.get_fit_job("jobs", "nope")


@pytest.mark.anyio
async def test_async_fit_jobs(live):
    async with AsyncNormcalClient(live.url) as anc:
        await anc.create_collection("ajobs", exist_ok=True)
        await anc.upsert_documents("ajobs", DOCS)
        judgments = [
            {"query": q, "document_id": key, "relevance": 0}
            for key, q in QUERIES.items()
        ]
        started = await anc.start_fit(
            "ajobs", judgments, method="platt", k=5, include_feedback=False
        )
        job = await anc.wait_fit_job("ajobs", started.id, 300, 0.05)
        assert job.status == "failed" and job.calibrator is None
        assert job.error is not None and job.error.status == 422
        assert (await anc.list_fit_jobs("ajobs"))[0] == job


@pytest.mark.anyio
async def test_async_client_against_the_live_server(live):
    async with AsyncNormcalClient(live.url) as anc:
        await anc.wait_until_ready(timeout=30)
        await anc.create_collection("async", exist_ok=True)
        await anc.upsert_documents("async", DOCS, batch_size=3)
        result = await anc.search("async", QUERIES["python"], k=1)
        assert result.hits[0].id == "python"
        lexical = await anc.search("async", "typing", k=3, mode="lexical")
        assert [h.id for h in lexical.hits] == ["python"] and lexical.hits[0].bm25 > 0
        info = await anc.create_collection("async-plain", stemmer="none")
        assert info.stemmer == "none"
        assert [
            r.hits[0].id
            for r in await anc.search_batch("async", [QUERIES["paris"]], k=1)
        ] == ["paris"]
        with pytest.raises(NotFound):
            await anc.get_document("async", "missing")
        await anc.delete_documents("async", ["python", "missing"], missing_ok=True)
        assert (await anc.get_collection("async")).documents == 4


def test_real_embed_returns_unit_vectors_and_raw_norms(nc):
    out = nc.embed(["hello world", "a much longer sentence about norms"], "query")
    assert out.dim == 384 and len(out.data) == 2
    assert all(abs(sum(x * x for x in e.embedding) - 1) < 1e-3 for e in out.data)
    assert all(e.norm > 0 and not e.truncated for e in out.data)


def test_real_bad_documents_and_missing_collections_are_typed(nc):
    nc.create_collection("bad", exist_ok=True)
    with pytest.raises(InvalidRequest) as caught:
        nc.upsert_documents("bad", [{"id": "1", "text": "   "}])
    assert caught.value.status == 422
    assert nc.get_collection("bad").documents == 0  # and nothing was stored
    with pytest.raises(NotFound):
        nc.search("does-not-exist", "q")


def test_real_auth(tmp_path, embedder):
    """With NORMCAL_API_KEY set, no key and a wrong key are 401; the key works."""
    from app.api.app import create_app
    from app.settings import Settings
    from tests.support.live import ThreadServer

    settings = Settings(data_dir=tmp_path / "auth", api_key="s3cret")
    with ThreadServer(create_app(settings, embedder=embedder)) as server:
        for key in (None, "wrong"):
            with NormcalClient(server.url, api_key=key, retry=NO_RETRY) as other:
                with pytest.raises(Unauthorized) as caught:
                    other.list_collections()
                assert caught.value.status == 401
                # /readyz is public but hides the count: the model must accept that
                assert other.readyz().collections is None
        with NormcalClient(server.url, api_key="s3cret") as authed:
            assert authed.list_collections() == []
            assert authed.readyz().collections == 0


def test_real_roles(tmp_path, embedder):
    """A key whose role is too low raises Forbidden naming the role it needs."""
    import json

    from normcal_client import Forbidden

    from app.api.app import create_app
    from app.settings import Settings
    from tests.support.live import ThreadServer

    keys = tmp_path / "keys.json"
    reader, admin = "reader-0123456789abcdef", "admin-0123456789abcdef"
    keys.write_text(
        json.dumps(
            [
                {"name": "reader", "key": reader, "role": "read"},
                {"name": "ops", "key": admin, "role": "admin"},
            ]
        )
    )
    settings = Settings(data_dir=tmp_path / "roles", api_keys_file=keys)
    with ThreadServer(create_app(settings, embedder=embedder)) as server:
        with NormcalClient(server.url, api_key=admin) as ops:
            ops.create_collection("kb")
            assert ops.key().role == "admin"
        with NormcalClient(server.url, api_key=reader, retry=NO_RETRY) as nc:
            me = nc.key()
            assert (me.name, me.role, me.collections, me.auth) == (
                "reader",
                "read",
                None,
                True,
            )
            assert nc.search("kb", "anything").hits == []
            with pytest.raises(Forbidden) as caught:
                nc.upsert_documents("kb", [{"id": "1", "text": "x"}])
            assert caught.value.status == 403
            assert caught.value.required_role == "write"
            assert "has the read role" in caught.value.detail
            with pytest.raises(Forbidden) as caught:
                nc.delete_collection("kb")
            assert caught.value.required_role == "admin"


@pytest.mark.anyio
async def test_async_client_through_asgi(app):
    """The async client on an in-process ASGI transport, lifespan running."""
    from asgi_lifespan import LifespanManager

    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with AsyncNormcalClient("http://normcal", transport=transport) as anc:
            assert (await anc.wait_until_ready(timeout=10)).dim == 384
            await anc.create_collection("akb")
            with pytest.raises(Conflict):
                await anc.create_collection("akb")
            await anc.create_collection("akb", exist_ok=True)
            assert (await anc.upsert_documents("akb", DOCS)).upserted == 5
            result = await anc.search("akb", QUERIES["aspirin"], k=2, include_text=True)
            assert result.hits[0].id == "aspirin"
            assert result.hits[0].text == CORPUS["aspirin"]
            assert (await anc.get_document("akb", "faiss")).id == "faiss"
            assert (await anc.embed(["x y z"])).dim == 384
            assert [c.name for c in await anc.list_collections()] == ["akb"]
            await anc.delete_document("akb", "faiss")
            with pytest.raises(NotFound):
                await anc.get_document("akb", "faiss")
            with pytest.raises(InvalidRequest):
                await anc.search("akb", "q", k=0)
            await anc.feedback(
                "akb", [{"query": "q", "document_id": "paris", "relevance": 1}]
            )
            page = await anc.list_feedback("akb", limit=1)
            assert [j.document_id for j in page.data] == ["paris"]
            assert (await anc.delete_feedback("akb", query="q")).deleted == 1
            default = (await anc.list_calibrators("akb"))[0]
            profile = await anc.export_calibrator("akb", default.id)
            copy = await anc.import_calibrator("akb", profile)
            assert not copy.active and not copy.default
            await anc.delete_calibrator("akb", copy.id)
            await anc.delete_collection("akb")
            assert await anc.list_collections() == []


@pytest.mark.anyio
async def test_real_payload_too_large_is_typed(tmp_path, embedder):
    """A body past max_body_bytes is a typed 413; smaller batches of it fit."""
    from asgi_lifespan import LifespanManager

    from app.api.app import create_app
    from app.settings import Limits, Settings

    settings = Settings(data_dir=tmp_path / "d", limits=Limits(max_body_bytes=2048))
    app = create_app(settings, embedder=embedder)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with AsyncNormcalClient("http://normcal", transport=transport) as anc:
            await anc.create_collection("big")
            with pytest.raises(PayloadTooLarge) as caught:
                await anc.upsert_documents("big", [{"id": "1", "text": "x" * 5000}])
            assert caught.value.status == 413
            docs = [{"id": str(i), "text": "y" * 500} for i in range(6)]
            ack = await anc.upsert_documents("big", docs, batch_size=2)
            assert (
                ack.upserted == 6 and (await anc.get_collection("big")).documents == 6
            )
