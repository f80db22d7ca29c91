"""normcal_client against a real server, and its retry rules over a mock transport."""

from __future__ import annotations

import email.utils
import json
import threading

import httpx
import normcal_client
import pytest
from normcal_client import (
    NO_RETRY,
    AsyncNormcalClient,
    CollectionUnavailable,
    Conflict,
    ConnectionFailed,
    Forbidden,
    InsufficientStorage,
    InvalidRequest,
    NormcalClient,
    NormcalError,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    RetryPolicy,
    ServerError,
    ServiceUnavailable,
    Unauthorized,
)

from tests.app.corpus import CORPUS, QUERIES

DOCS = [
    {"id": key, "text": text, "metadata": {"topic": key, "even": i % 2 == 0}}
    for i, (key, text) in enumerate(CORPUS.items())
]


def test_public_names_are_exactly_all():
    public = {n for n in dir(normcal_client) if not n.startswith("_")}
    # ``annotations`` is the __future__ import; ``langchain`` the optional submodule.
    assert public - {"annotations", "langchain"} == set(normcal_client.__all__) - {
        "__version__"
    }
    for name in normcal_client.__all__:
        obj = getattr(normcal_client, name)
        if isinstance(obj, type):
            assert obj.__module__ == "normcal_client", name
    assert "Forbidden" in normcal_client.__all__


# --------------------------------------------------------------------------- mock


def problem(status: int, slug: str = "x", headers: dict[str, str] | None = None):
    body = {"type": f"/problems/{slug}", "title": "T", "status": status, "detail": "d"}
    return httpx.Response(status, json=body, headers=headers)


class Recorder:
    """Answers in turn; remembers requests."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


OK = httpx.Response(200, json={"status": "ok"})


def mock(handler, **kwargs):
    sleeps: list[float] = []
    kwargs.setdefault("retry", RetryPolicy(jitter=0.0))
    nc = NormcalClient(
        "http://normcal.test",
        transport=httpx.MockTransport(handler),
        sleep=sleeps.append,
        **kwargs,
    )
    return nc, sleeps


@pytest.mark.parametrize(
    ("status", "slug", "cls"),
    [
        (400, "malformed-json", InvalidRequest),
        (401, "unauthorized", Unauthorized),
        (403, "forbidden", Forbidden),
        (404, "not-found", NotFound),
        (409, "conflict", Conflict),
        (413, "payload-too-large", PayloadTooLarge),
        (422, "validation-error", InvalidRequest),
        (503, "overloaded", Overloaded),
        (503, "collection-unavailable", CollectionUnavailable),
        (503, "other", ServiceUnavailable),
        (507, "insufficient-storage", InsufficientStorage),
        (500, "internal-error", ServerError),
    ],
)
def test_problem_answers_are_typed(status, slug, cls):
    nc, _ = mock(Recorder(problem(status, slug)), retry=NO_RETRY)
    with pytest.raises(cls) as caught:
        nc.healthz()
    error = caught.value
    assert type(error) is cls and isinstance(error, NormcalError)
    assert (error.status, error.type, error.title, error.detail) == (
        status,
        f"/problems/{slug}",
        "T",
        "d",
    )


def test_a_non_problem_answer_is_still_typed():
    nc, _ = mock(Recorder(httpx.Response(502, text="<html>bad gateway</html>")))
    with pytest.raises(ServerError) as caught:
        nc.healthz()
    assert caught.value.status == 502 and "bad gateway" in caught.value.detail


def test_503_is_retried_honouring_numeric_retry_after():
    handler = Recorder(problem(503, "overloaded", {"Retry-After": "2"}), OK)
    nc, sleeps = mock(handler)
    assert nc.healthz().status == "ok"
    assert sleeps == [2.0] and len(handler.requests) == 2


def test_retry_after_http_date_is_honoured():
    when = email.utils.format_datetime(
        email.utils.localtime().replace(microsecond=0), usegmt=False
    )
    handler = Recorder(problem(429, "rate", {"Retry-After": when}), OK)
    nc, sleeps = mock(handler)
    nc.healthz()
    assert len(sleeps) == 1 and 0.0 <= sleeps[0] <= 1.0
    assert normcal_client.parse_retry_after(
        "Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0
    ) == pytest.approx(10.0)


def test_429_backs_off_exponentially_then_raises():
    handler = Recorder(*[problem(429)] * 4)
    nc, sleeps = mock(handler)
    with pytest.raises(Overloaded):
        nc.healthz()
    assert sleeps == [0.5, 1.0, 2.0] and len(handler.requests) == 4


def test_collection_unavailable_is_retried_only_with_retry_after():
    nc, sleeps = mock(Recorder(problem(503, "collection-unavailable")))
    with pytest.raises(CollectionUnavailable):
        nc.healthz()
    assert sleeps == []
    headers = {"Retry-After": "1"}
    nc, sleeps = mock(Recorder(problem(503, "collection-unavailable", headers), OK))
    nc.healthz()
    assert sleeps == [1.0]


def test_connect_errors_are_retried_read_timeouts_are_not():
    handler = Recorder(httpx.ConnectError("refused"), OK)
    nc, _ = mock(handler)
    nc.healthz()
    assert len(handler.requests) == 2
    handler = Recorder(httpx.ReadTimeout("slow"))
    nc, _ = mock(handler)
    with pytest.raises(ConnectionFailed):
        nc.healthz()
    assert len(handler.requests) == 1


def test_with_options_leaves_the_shared_client_alone():
    """Per-call options make a copy; the old client swapped ``self.retry`` in place,
    so a concurrent call on a shared client lost its retries."""
    policy = RetryPolicy(jitter=0.0)
    seen: list[RetryPolicy] = []
    nc: NormcalClient

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(nc.options.retry)  # what another thread would use right now
        if request.url.path == "/readyz":
            return httpx.Response(
                200, json={"status": "ready", "model": "m", "dim": 1, "collections": 0}
            )
        return OK

    nc, _ = mock(handler, retry=policy, timeout=30.0)
    nc.wait_until_ready()
    fast = nc.with_options(retry=NO_RETRY, timeout=1.0, headers={"X-Trace": "t"})
    fast.healthz()
    assert seen == [policy, policy] and nc.options.retry is policy
    assert fast.options.retry is NO_RETRY and nc.options.timeout is None
    handler_503 = Recorder(problem(503), problem(503), OK)
    shared, sleeps = mock(handler_503)
    with pytest.raises(ServiceUnavailable):
        shared.with_options(retry=NO_RETRY).healthz()
    shared.healthz()  # still retries
    assert len(sleeps) == 1
    fast.close()  # a copy does not own the pool
    assert nc.healthz().status == "ok"


def test_requests_carry_auth_accept_and_quoted_paths():
    handler = Recorder(httpx.Response(204))
    nc, _ = mock(handler, api_key="sekret")
    nc.delete_document("kb", "a/b c?")
    request = handler.requests[0]
    assert request.headers["authorization"] == "Bearer sekret"
    assert "application/problem+json" in request.headers["accept"]
    assert request.url.raw_path == b"/v1/collections/kb/documents/a%2Fb%20c%3F"


def test_fit_sends_only_given_options_and_every_server_field():
    answer = {
        "id": "c1", "collection": "kb", "method": "platt", "created_at": 1.0,
        "active": True, "default": False, "reorders_hits": True, "cv": {},
        "norm_lift": {}, "abstain": None, "report": {},
    }  # fmt: skip
    handler = Recorder(*[httpx.Response(201, json=answer)] * 2)
    nc, _ = mock(handler)
    nc.fit_calibrator("kb", [{"query": "q", "document_id": "d", "relevance": 2}])
    nc.fit_calibrator(
        "kb",
        [],
        method="nt",
        k=5,
        abstain_target=False,
        abstain_delta=0.05,
        activate=False,
        include_feedback=False,
        allow_reorder=True,
    )
    first, second = (json.loads(r.content) for r in handler.requests)
    assert first == {"judgments": [{"query": "q", "document_id": "d", "relevance": 2}]}
    assert second == {
        "judgments": [], "method": "nt", "k": 5, "abstain_target": None,
        "abstain_delta": 0.05, "activate": False, "include_feedback": False,
        "allow_reorder": True,
    }  # fmt: skip


def test_retry_after_values_parse():
    parse = normcal_client.parse_retry_after
    assert parse("3") == 3.0 and parse(" 0.5 ") == 0.5
    assert parse(None) is None and parse("soon") is None
    past = email.utils.formatdate(1_000_000.0, usegmt=True)
    assert parse(past, now=1_000_030.0) == 0.0  # a date gone by: no wait


def test_retry_policy_validates():
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    for field in ("backoff", "max_backoff", "max_retry_after", "jitter"):
        with pytest.raises(ValueError, match="negative"):
            RetryPolicy(**{field: -1})


def test_backoff_is_capped_and_retry_after_is_bounded():
    policy = RetryPolicy(backoff=1.0, max_backoff=3.0, max_retry_after=5, jitter=0)
    assert [policy.delay(n, None) for n in range(5)] == [1.0, 2.0, 3.0, 3.0, 3.0]
    assert policy.delay(0, 3600.0) == 5.0  # a server asking for an hour gets 5 s
    jittery = RetryPolicy(backoff=1.0, jitter=0.5)
    assert all(1.0 <= jittery.delay(0, None) <= 1.5 for _ in range(50))


def test_a_retried_request_resends_the_same_body():
    handler = Recorder(*[problem(429)] * 4)
    nc, sleeps = mock(handler)
    with pytest.raises(Overloaded):
        nc.search("kb", "q", k=3)
    assert len(sleeps) == 3 and len(handler.requests) == 4
    assert {r.content for r in handler.requests} == {handler.requests[0].content}


@pytest.mark.parametrize("status", [400, 404, 409, 413, 422, 500])
def test_other_errors_are_not_retried(status):
    handler = Recorder(problem(status))
    nc, sleeps = mock(handler)
    with pytest.raises(NormcalError):
        nc.list_collections()
    assert sleeps == [] and len(handler.requests) == 1


def test_one_attempt_raises_with_the_servers_retry_after():
    handler = Recorder(problem(503, "overloaded", {"Retry-After": "1"}))
    nc, sleeps = mock(handler, retry=NO_RETRY)
    with pytest.raises(Overloaded) as caught:
        nc.healthz()
    assert caught.value.retry_after == 1.0 and sleeps == []


def test_connect_errors_exhaust_the_attempts_then_raise():
    handler = Recorder(*[httpx.ConnectError("refused")] * 4)
    nc, sleeps = mock(handler)
    with pytest.raises(ConnectionFailed) as caught:
        nc.healthz()
    assert caught.value.status == 0 and caught.value.response is None  # no answer
    assert len(handler.requests) == 4 and len(sleeps) == 3


def test_wait_until_ready_polls_until_200():
    ready = {"status": "ready", "model": "m", "dim": 384, "collections": 0}
    handler = Recorder(
        httpx.ConnectError("refused"),
        problem(503, "starting"),
        httpx.Response(200, json=ready),
    )
    nc, sleeps = mock(handler)
    assert nc.wait_until_ready(timeout=30, interval=0.25).dim == 384
    assert sleeps == [0.25, 0.25]


@pytest.mark.anyio
async def test_async_client_retries_with_its_async_sleep():
    ready = {"status": "ready", "model": "m", "dim": 384, "collections": 0}
    handler = Recorder(
        problem(503, "overloaded", {"Retry-After": "3"}),
        problem(429, "too-many"),
        httpx.Response(200, json=ready),
    )
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async with AsyncNormcalClient(
        "http://normcal.test",
        transport=httpx.MockTransport(handler),
        retry=RetryPolicy(jitter=0.0),
        sleep=sleep,
    ) as anc:
        assert (await anc.readyz()).collections == 0
    assert sleeps == [3.0, 1.0]  # Retry-After, then backoff * 2**1


def test_search_sends_only_given_options():
    hit = {"id": "1", "score": 0.5, "bm25": 0.0, "probability": None, "norm": 4.0}
    hit |= {"n_tokens": 3, "metadata": {}}
    query = {"norm": 3.0, "n_tokens": 5, "truncated": False}
    result = {"query": query, "mode": "dense", "hits": [hit]}
    handler = Recorder(
        httpx.Response(200, json=result),
        httpx.Response(200, json={"results": [result, result]}),
        httpx.Response(200, json=result | {"mode": "hybrid"}),
    )
    nc, _ = mock(handler)
    one = nc.search("kb", "q", k=3, min_probability=0.2)
    assert one.hits[0].probability is None and one.abstain is None
    assert json.loads(handler.requests[0].content) == {
        "query": "q",
        "k": 3,
        "include_text": False,
        "min_probability": 0.2,
    }
    assert len(nc.search_batch("kb", ["a", "b"], target_precision=0.9)) == 2
    assert json.loads(handler.requests[1].content) == {
        "queries": ["a", "b"],
        "include_text": False,
        "target_precision": 0.9,
    }
    hybrid = nc.search("kb", "q", mode="hybrid", candidates=50)
    assert hybrid.mode == "hybrid"
    assert json.loads(handler.requests[2].content) == {
        "query": "q",
        "mode": "hybrid",
        "candidates": 50,
        "include_text": False,
    }


# --------------------------------------------------------------------------- real


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


def test_real_connection_refused_is_typed():
    from tests.app.server import refused_port

    with refused_port() as port:
        url = f"http://127.0.0.1:{port}"
        with NormcalClient(url, retry=NO_RETRY) as c, pytest.raises(ConnectionFailed):
            c.healthz()


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
    from tests.app.live import ThreadServer

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
