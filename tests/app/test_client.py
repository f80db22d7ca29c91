"""The Python client: wire contract and retries (MockTransport), then the real app.

Real-app tests run the actual service (bundled model, FAISS, SQLite): the sync client
talks to uvicorn on a loopback port, the async client goes through ``ASGITransport``
with the lifespan running.
"""

from __future__ import annotations

import email.utils
import json
import time

import httpx
import pytest

from app.client import (
    AsyncNormcalClient,
    BadRequest,
    CalibratorInfo,
    Conflict,
    ConnectionFailed,
    NormcalClient,
    NormcalError,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    RateLimited,
    RetryPolicy,
    ServerError,
    Unauthorized,
    ValidationFailed,
    parse_retry_after,
)
from tests.app.corpus import CORPUS, QUERIES
from tests.app.live import ThreadServer

PROBLEM = "application/problem+json"
FAST = RetryPolicy(max_attempts=4, backoff=0.5, max_backoff=8.0, jitter=0.0)


def problem(status: int, slug: str = "x", headers: dict[str, str] | None = None):
    body = {
        "type": f"/problems/{slug}",
        "title": slug.title(),
        "status": status,
        "detail": f"detail of {slug}",
        "instance": "urn:request:abc",
    }
    return httpx.Response(
        status,
        content=json.dumps(body).encode(),
        headers={"content-type": PROBLEM, **(headers or {})},
    )


READY = {"status": "ready", "model": "m", "dim": 384, "collections": 0}


class Recorder:
    """A MockTransport handler answering from a script, recording requests."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def sync_client(handler, **kwargs) -> tuple[NormcalClient, list[float]]:
    sleeps: list[float] = []
    kwargs.setdefault("retry", FAST)
    client = NormcalClient(
        "http://normcal.test",
        transport=httpx.MockTransport(handler),
        sleep=sleeps.append,
        **kwargs,
    )
    return client, sleeps


# ------------------------------------------------------------------ unit: errors


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, BadRequest),
        (401, Unauthorized),
        (404, NotFound),
        (409, Conflict),
        (413, PayloadTooLarge),
        (422, ValidationFailed),
        (500, ServerError),
    ],
)
def test_problem_statuses_map_to_typed_errors(status, cls):
    client, sleeps = sync_client(Recorder(problem(status, "boom")))
    with pytest.raises(cls) as info:
        client.get_collection("kb")
    err = info.value
    assert isinstance(err, NormcalError)
    assert err.status == status and err.type == "/problems/boom"
    assert err.detail == "detail of boom" and err.instance == "urn:request:abc"
    assert "urn:request:abc" in str(err)
    assert sleeps == []  # never retried


def test_non_problem_error_body_is_still_typed():
    client, _ = sync_client(
        Recorder(httpx.Response(502, text="bad gateway from proxy"))
    )
    with pytest.raises(ServerError) as info:
        client.healthz()
    assert info.value.status == 502
    assert info.value.detail == "bad gateway from proxy"


def test_retry_after_parsing():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(30, abs=1.01)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after(past, now=now) == 0.0


def test_retry_policy_validates():
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(backoff=-1)


# ------------------------------------------------------------------ unit: retries


def test_503_is_retried_honouring_retry_after():
    handler = Recorder(
        problem(503, "overloaded", {"Retry-After": "2"}),
        problem(503, "overloaded", {"Retry-After": "1"}),
        httpx.Response(200, json=READY),
    )
    client, sleeps = sync_client(handler)
    assert client.readyz().status == "ready"
    assert sleeps == [2.0, 1.0]
    assert len(handler.requests) == 3


def test_429_backs_off_exponentially_then_raises():
    handler = Recorder(problem(429, "too-many"))
    client, sleeps = sync_client(handler)
    with pytest.raises(RateLimited) as info:
        client.search("kb", "q")
    assert isinstance(info.value, Overloaded)
    assert sleeps == [0.5, 1.0, 2.0]  # max_attempts=4: three waits, four requests
    assert len(handler.requests) == 4
    # every attempt sent the same body
    assert {r.content for r in handler.requests} == {handler.requests[0].content}


def test_backoff_is_capped_and_retry_after_is_bounded():
    policy = RetryPolicy(
        max_attempts=6, backoff=1.0, max_backoff=3.0, max_retry_after=5, jitter=0
    )
    assert [policy.delay(n, None) for n in range(5)] == [1.0, 2.0, 3.0, 3.0, 3.0]
    assert policy.delay(0, 3600.0) == 5.0
    jittery = RetryPolicy(backoff=1.0, jitter=0.5)
    assert all(1.0 <= jittery.delay(0, None) <= 1.5 for _ in range(50))


def test_retry_after_http_date_is_honoured():
    later = email.utils.formatdate(time.time() + 4, usegmt=True)
    handler = Recorder(
        problem(503, "overloaded", {"Retry-After": later}),
        httpx.Response(200, json={"status": "ok"}),
    )
    client, sleeps = sync_client(handler)
    assert client.healthz() == {"status": "ok"}
    assert len(sleeps) == 1 and 2.5 <= sleeps[0] <= 4.0


def test_other_errors_are_not_retried():
    for status in (404, 409, 422, 500):
        handler = Recorder(problem(status))
        client, sleeps = sync_client(handler)
        with pytest.raises(NormcalError):
            client.list_collections()
        assert sleeps == [] and len(handler.requests) == 1


def test_retries_disabled_with_one_attempt():
    handler = Recorder(problem(503, "overloaded", {"Retry-After": "1"}))
    client, sleeps = sync_client(handler, retry=RetryPolicy(max_attempts=1))
    with pytest.raises(Overloaded) as info:
        client.healthz()
    assert info.value.retry_after == 1.0
    assert sleeps == []


def test_connect_errors_are_retried_then_raised():
    handler = Recorder(httpx.ConnectError("refused"))
    client, sleeps = sync_client(handler)
    with pytest.raises(ConnectionFailed) as info:
        client.healthz()
    assert info.value.status is None
    assert len(handler.requests) == 4 and len(sleeps) == 3


def test_read_timeout_is_not_retried():
    # the request may have been processed: resending a POST is not safe
    handler = Recorder(httpx.ReadTimeout("slow"))
    client, sleeps = sync_client(handler)
    with pytest.raises(ConnectionFailed):
        client.upsert_documents("kb", [{"id": "1", "text": "t"}])
    assert len(handler.requests) == 1 and sleeps == []


def test_wait_until_ready_polls_until_200():
    handler = Recorder(
        httpx.ConnectError("refused"),
        problem(503, "starting"),
        httpx.Response(200, json=READY),
    )
    client, sleeps = sync_client(handler)
    assert client.wait_until_ready(timeout=30, interval=0.25).dim == 384
    assert sleeps == [0.25, 0.25]


@pytest.mark.anyio
async def test_async_client_retries_with_async_sleep():
    handler = Recorder(
        problem(503, "overloaded", {"Retry-After": "3"}),
        problem(429, "too-many"),
        httpx.Response(200, json=READY),
    )
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async with AsyncNormcalClient(
        "http://normcal.test",
        transport=httpx.MockTransport(handler),
        retry=FAST,
        sleep=sleep,
    ) as client:
        assert (await client.readyz()).collections == 0
    assert sleeps == [3.0, 1.0]  # Retry-After, then backoff * 2**1


# ------------------------------------------------------------------ unit: wire shapes


def test_requests_carry_auth_and_quote_path_segments():
    handler = Recorder(httpx.Response(204))
    client, _ = sync_client(handler, api_key="s3cret")
    client.delete_document("kb", "a/b c?d")
    request = handler.requests[0]
    assert request.headers["authorization"] == "Bearer s3cret"
    assert request.url.raw_path == b"/v1/collections/kb/documents/a%2Fb%20c%3Fd"


def test_search_sends_only_given_options():
    hit = {"id": "1", "score": 0.5, "probability": None, "norm": 4.0, "n_tokens": 3}
    result = {"query": {"norm": 3.0, "n_tokens": 5, "truncated": False}, "hits": [hit]}
    handler = Recorder(
        httpx.Response(200, json=result),
        httpx.Response(200, json={"results": [result, result]}),
    )
    client, _ = sync_client(handler)
    one = client.search("kb", "q", k=3, min_probability=0.2)
    assert one.hits[0].probability is None and one.abstain is None
    assert json.loads(handler.requests[0].content) == {
        "query": "q",
        "k": 3,
        "include_text": False,
        "min_probability": 0.2,
    }
    batch = client.search_batch("kb", ["a", "b"], target_precision=0.9)
    assert len(batch) == 2
    assert json.loads(handler.requests[1].content)["queries"] == ["a", "b"]


def test_calibrator_methods_follow_the_contract():
    """The lead's calibrator endpoints, as specified (checked on the wire)."""
    info = {
        "id": "cal-1",
        "method": "platt",
        "cv": {"nll": 0.3},
        "norm_lift": {"delta_nll": 0.01},
    }

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/reliability.png"):
            return httpx.Response(
                200, content=b"\x89PNG...", headers={"content-type": "image/png"}
            )
        if path.endswith("/report"):
            return httpx.Response(200, text="<html>report</html>")
        if path.endswith("/feedback"):
            return httpx.Response(202, json={"accepted": 1})
        if path.endswith("/calibrators") and request.method == "GET":
            return httpx.Response(200, json={"data": [info], "count": 1})
        return httpx.Response(201 if request.method == "POST" else 200, json=info)

    seen: list[httpx.Request] = []

    def recording(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    client, _ = sync_client(recording)
    judgments = [{"query": "q", "document_id": "d", "relevance": 1}]
    fitted = client.fit_calibrator("kb", judgments, method="platt", abstain_target=None)
    assert isinstance(fitted, CalibratorInfo) and fitted.id == "cal-1"
    assert fitted.model_extra == {"cv": {"nll": 0.3}, "norm_lift": {"delta_nll": 0.01}}
    assert json.loads(seen[0].content) == {
        "judgments": judgments,
        "method": "platt",
        "k": 20,
        "abstain_target": None,
        "activate": True,
    }
    assert [c.id for c in client.list_calibrators("kb")] == ["cal-1"]
    assert client.get_calibrator("kb", "cal-1").method == "platt"
    assert client.activate_calibrator("kb", "cal-1").id == "cal-1"
    assert client.reliability_png("kb", "cal-1").startswith(b"\x89PNG")
    assert "report" in client.calibrator_report("kb", "cal-1")
    assert client.feedback("kb", judgments) == {"accepted": 1}
    assert [(r.method, r.url.path) for r in seen] == [
        ("POST", "/v1/collections/kb/calibrators"),
        ("GET", "/v1/collections/kb/calibrators"),
        ("GET", "/v1/collections/kb/calibrators/cal-1"),
        ("POST", "/v1/collections/kb/calibrators/cal-1/activate"),
        ("GET", "/v1/collections/kb/calibrators/cal-1/reliability.png"),
        ("GET", "/v1/collections/kb/calibrators/cal-1/report"),
        ("POST", "/v1/collections/kb/feedback"),
    ]


def test_embed_rejects_a_bare_string():
    client, _ = sync_client(Recorder(httpx.Response(200, json={})))
    with pytest.raises(TypeError):
        client.embed("not a list")


# ------------------------------------------------------------------ the real service


DOCS = [
    {"id": key, "text": text, "metadata": {"topic": key, "even": i % 2 == 0}}
    for i, (key, text) in enumerate(CORPUS.items())
]


@pytest.fixture(scope="module")
def live(tmp_path_factory, embedder):
    from app.api.app import create_app
    from app.settings import Settings

    settings = Settings(data_dir=tmp_path_factory.mktemp("client-data"))
    with ThreadServer(create_app(settings, embedder=embedder)) as server:
        yield server


@pytest.fixture
def nc(live):
    with NormcalClient(live.url, retry=RetryPolicy(max_attempts=2, backoff=0.1)) as c:
        yield c


def test_real_lifecycle(nc):
    ready = nc.readyz()
    assert ready.status == "ready" and ready.dim == 384
    assert nc.healthz() == {"status": "ok"}

    info = nc.create_collection("lifecycle", "client test")
    assert info.name == "lifecycle" and info.documents == 0 and info.dim == 384
    with pytest.raises(Conflict) as conflict:
        nc.create_collection("lifecycle")
    assert conflict.value.status == 409 and conflict.value.instance
    assert nc.create_collection("lifecycle", exist_ok=True).name == "lifecycle"
    assert "lifecycle" in [c.name for c in nc.list_collections()]

    ack = nc.upsert_documents("lifecycle", DOCS, batch_size=2)
    assert ack.upserted == 5 and ack.ids == list(CORPUS) and ack.truncated == []
    assert nc.get_collection("lifecycle").documents == 5

    doc = nc.get_document("lifecycle", "paris")
    assert doc.text == CORPUS["paris"] and doc.metadata["topic"] == "paris"
    assert doc.norm > 0 and doc.n_tokens > 3

    result = nc.search("lifecycle", "What is the capital of France?", k=3)
    assert result.hits[0].id == "paris" and len(result.hits) == 3
    assert result.hits[0].score >= result.hits[1].score
    assert result.hits[0].text is None and result.query.norm > 0
    with_text = nc.search("lifecycle", "capital of France", k=1, include_text=True)
    assert with_text.hits[0].text == CORPUS["paris"]
    filtered = nc.search("lifecycle", "capital of France", k=5, filter={"even": True})
    assert filtered.hits and all(h.metadata["even"] is True for h in filtered.hits)

    batch = nc.search_batch(
        "lifecycle",
        ["Does aspirin prevent heart attacks?", "vector search library"],
        k=2,
    )
    assert [r.hits[0].id for r in batch] == ["aspirin", "faiss"]

    nc.delete_document("lifecycle", "paris")
    with pytest.raises(NotFound):
        nc.get_document("lifecycle", "paris")
    nc.delete_collection("lifecycle")
    with pytest.raises(NotFound) as missing:
        nc.get_collection("lifecycle")
    assert missing.value.type == "/problems/not-found"


def test_real_embed(nc):
    out = nc.embed(["hello world", "a much longer sentence about norms"], "query")
    assert out.dim == 384 and len(out.data) == 2
    assert all(abs(sum(x * x for x in e.embedding) - 1) < 1e-3 for e in out.data)
    assert all(e.norm > 0 and not e.truncated for e in out.data)


def test_real_validation_errors_are_typed(nc):
    nc.create_collection("errs", exist_ok=True)
    with pytest.raises(ValidationFailed) as info:
        nc.search("errs", "q", k=0)
    assert info.value.status == 422 and info.value.errors
    with pytest.raises(ValidationFailed):
        nc.upsert_documents("errs", [{"id": "1", "text": "   "}])
    with pytest.raises(ValidationFailed):
        nc.create_collection("no spaces allowed")
    with pytest.raises(NotFound):
        nc.search("does-not-exist", "q")


def test_real_connection_refused_is_typed():
    from tests.app.server import refused_port

    with refused_port() as port:
        client = NormcalClient(
            f"http://127.0.0.1:{port}",
            retry=RetryPolicy(max_attempts=2, backoff=0.01),
        )
        with pytest.raises(ConnectionFailed):
            client.healthz()


def test_real_auth(tmp_path, embedder):
    """With NORMCAL_API_KEY set the key is required."""
    from app.api.app import create_app
    from app.settings import Settings

    settings = Settings(data_dir=tmp_path / "auth", api_key="s3cret")
    with ThreadServer(create_app(settings, embedder=embedder)) as server:
        with NormcalClient(server.url, retry=RetryPolicy(max_attempts=1)) as anon:
            with pytest.raises(Unauthorized) as info:
                anon.list_collections()
            assert info.value.status == 401
        with NormcalClient(server.url, api_key="s3cret") as authed:
            assert authed.list_collections() == []
        with NormcalClient(server.url, api_key="wrong") as wrong:
            with pytest.raises(Unauthorized):
                wrong.list_collections()


@pytest.mark.anyio
async def test_async_client_against_the_app(app):
    from asgi_lifespan import LifespanManager

    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with AsyncNormcalClient("http://normcal", transport=transport) as nc:
            assert (await nc.wait_until_ready(timeout=10)).dim == 384
            await nc.create_collection("akb")
            with pytest.raises(Conflict):
                await nc.create_collection("akb")
            await nc.create_collection("akb", exist_ok=True)
            ack = await nc.upsert_documents("akb", DOCS)
            assert ack.upserted == 5
            result = await nc.search(
                "akb", "Does aspirin prevent heart attacks?", k=2, include_text=True
            )
            assert result.hits[0].id == "aspirin"
            assert result.hits[0].text == CORPUS["aspirin"]
            batch = await nc.search_batch("akb", ["France capital", "photosynthesis"])
            assert [r.hits[0].id for r in batch] == ["paris", "photosynthesis"]
            assert (await nc.get_document("akb", "faiss")).id == "faiss"
            emb = await nc.embed(["x y z"])
            assert emb.dim == 384
            assert [c.name for c in await nc.list_collections()] == ["akb"]
            assert (await nc.get_collection("akb")).documents == 5
            await nc.delete_document("akb", "faiss")
            with pytest.raises(NotFound):
                await nc.get_document("akb", "faiss")
            with pytest.raises(ValidationFailed):
                await nc.search("akb", "q", k=0)
            await nc.delete_collection("akb")
            assert await nc.list_collections() == []


@pytest.mark.anyio
async def test_real_payload_too_large_is_typed(tmp_path, embedder):
    from asgi_lifespan import LifespanManager

    from app.api.app import create_app
    from app.settings import Limits, Settings

    settings = Settings(data_dir=tmp_path / "d", limits=Limits(max_body_bytes=2048))
    app = create_app(settings, embedder=embedder)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with AsyncNormcalClient("http://normcal", transport=transport) as nc:
            await nc.create_collection("big")
            with pytest.raises(PayloadTooLarge) as info:
                await nc.upsert_documents("big", [{"id": "1", "text": "x" * 5000}])
            assert info.value.status == 413
            # split into small requests, the same documents fit
            docs = [{"id": str(i), "text": "y" * 500} for i in range(6)]
            ack = await nc.upsert_documents("big", docs, batch_size=2)
            assert ack.upserted == 6 and (await nc.get_collection("big")).documents == 6


def test_real_calibrator_endpoints(live, nc):
    """The calibrator methods against the real endpoints."""
    nc.create_collection("cal", exist_ok=True)
    nc.upsert_documents("cal", DOCS)
    judgments = [
        {"query": q, "document_id": d, "relevance": int(d == key)}
        for key, q in QUERIES.items()
        for d in CORPUS
    ]
    info = nc.fit_calibrator("cal", judgments, method="platt", k=5)
    assert info.id and info.method
    assert info.id in [c.id for c in nc.list_calibrators("cal")]
    assert nc.get_calibrator("cal", info.id).id == info.id
    assert nc.activate_calibrator("cal", info.id).id == info.id
    assert nc.reliability_png("cal", info.id).startswith(b"\x89PNG")
    assert "<html" in nc.calibrator_report("cal", info.id).lower()
    result = nc.search("cal", QUERIES["paris"], k=3)
    assert all(h.probability is not None for h in result.hits)
    assert result.calibrator is not None and result.calibrator.id == info.id
