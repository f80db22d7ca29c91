"""The client over a mock transport: typed errors, retries, options, request bodies.

No server and no model: these run wherever the client is installed
(``pip install ./clients/python`` plus pytest).
"""

from __future__ import annotations

import email.utils
import json
import socket

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


def test_public_names_are_exactly_all():
    public = {n for n in dir(normcal_client) if not n.startswith("_")}
    # ``annotations`` is the __future__ import; the others the optional submodules.
    optional = {"annotations", "langchain", "llama_index"}
    assert public - optional == set(normcal_client.__all__) - {"__version__"}
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


def test_clients_share_one_tls_context_built_once(monkeypatch):
    """Building a TLS context reads the CA bundle (~45 ms of CPU); a client built
    per request (a retriever in a web handler) paid it every time, even on http://."""
    import ssl

    from normcal_client._base import default_tls

    built: list[ssl.SSLContext] = []
    real = ssl.create_default_context

    def counted(*args, **kwargs):
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(ssl, "create_default_context", counted)
    default_tls.cache_clear()
    try:
        clients = [NormcalClient("https://example.invalid") for _ in range(3)]
        clients.append(AsyncNormcalClient("http://127.0.0.1:1"))
        assert len(built) == 1 and default_tls() is built[0]
        assert built[0].verify_mode == ssl.CERT_REQUIRED and built[0].check_hostname
        for client in clients[:3]:
            client.close()
    finally:
        default_tls.cache_clear()


def test_with_options_leaves_the_shared_client_alone():
    """Per-call options make a copy; the old client swapped ``self.retry`` in place,
    so a concurrent call on a shared client lost its retries.
    """
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


def test_fit_sends_judged_lists_bare_texts_unjudged():
    answer = {
        "id": "c1", "collection": "ns", "method": "prior", "created_at": 1.0,
        "active": True, "default": False, "reorders_hits": True, "cv": {},
        "norm_lift": {}, "abstain": None, "report": {},
    }  # fmt: skip
    handler = Recorder(httpx.Response(201, json=answer))
    nc, _ = mock(handler)
    lists = [
        {"query": "q", "documents": ["a", {"text": "b", "score": 2.5, "relevance": 1}]}
    ]
    nc.fit_calibrator("ns", [], lists=lists)
    (body,) = (json.loads(r.content) for r in handler.requests)
    assert body["judgments"] == []
    (sent,) = body["lists"]
    assert sent["query"] == "q"
    assert [d["text"] for d in sent["documents"]] == ["a", "b"]
    assert sent["documents"][0].get("relevance") is None
    assert sent["documents"][1]["relevance"] == 1
    assert sent["documents"][1]["score"] == 2.5


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


def test_connection_refused_is_typed():
    with socket.socket() as sock:  # bound, never listening: connecting is refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with NormcalClient(url, retry=NO_RETRY) as c, pytest.raises(ConnectionFailed):
            c.healthz()


# --------------------------------------------------------------------------- refusals


def _refused(call) -> normcal_client.InvalidArgument:
    with pytest.raises(normcal_client.InvalidArgument) as caught:
        call()
    return caught.value


@pytest.mark.parametrize(
    ("call", "loc", "says"),
    [
        # the two: a document without text, a k the server's types refuse
        (
            lambda nc: nc.upsert_documents("kb", [{"id": "1"}]),
            ["documents", "0", "text"],
            "Field required",
        ),
        (lambda nc: nc.search("kb", "q", k="2"), ["k"], "valid integer"),
        (lambda nc: nc.search("kb", "q", k=True), ["k"], "valid integer"),
        (lambda nc: nc.search("kb", "q", include_text=1), ["include_text"], "boolean"),
        (lambda nc: nc.search("kb", "q", mode="semantic"), ["mode"], "'dense'"),
        (lambda nc: nc.search("kb", "q", filter=[1]), ["filter"], "JSON object"),
        (lambda nc: nc.search("kb", vector=["x"]), ["vector"], "list of numbers"),
        (lambda nc: nc.embed("one string"), ["texts"], "not one value"),
        (lambda nc: nc.get_documents("kb", "abc"), ["ids"], "not one value"),
        (lambda nc: nc.get_documents("kb", ["a"], batch_size=0), ["batch_size"], "1"),
        (
            lambda nc: nc.upsert_documents("kb", [{"id": 1, "text": "a"}]),
            ["documents", "0", "id"],
            "valid string",
        ),
        (
            lambda nc: nc.upsert_documents("kb", [{"id": "1", "txt": "a"}]),
            ["documents", "0", "text"],
            "Field required",
        ),
        (
            lambda nc: nc.upsert_documents("kb", ["just text"]),
            ["documents", "0"],
            "mapping",
        ),
        (
            lambda nc: nc.fit_calibrator(
                "kb", [{"query": "q", "document_id": "d", "relevance": "1"}]
            ),
            ["judgments", "0", "relevance"],
            "valid integer",
        ),
        (lambda nc: nc.update_document("kb", "d", 5), ["metadata"], "JSON object"),
        (lambda nc: nc.count_documents("kb", "topic"), ["filter"], "JSON object"),
        (lambda nc: nc.query_documents("kb", limit="10"), ["limit"], "valid integer"),
        (lambda nc: nc.restore_snapshot("kb", "s", into=3), ["into"], "valid string"),
        (lambda nc: nc.upload_snapshot("kb", 42), ["data"], "bytes"),
        (lambda nc: nc.set_query_log("kb", enabled="yes"), ["enabled"], "boolean"),
        (lambda nc: nc.add_judging_queries("kb", "q"), ["queries"], "not one value"),
    ],
)
def test_a_call_the_server_would_refuse_is_refused_here_naming_the_field(
    call, loc, says
):
    recorder = Recorder()  # no answer: nothing may be sent
    nc, _ = mock(recorder)
    error = _refused(lambda: call(nc))
    assert recorder.requests == []
    assert [str(p) for p in error.errors[0]["loc"]] == loc
    assert says in error.errors[0]["msg"]
    assert error.detail.startswith(".".join(loc) + ": ")
    # one family for every refusal: the server's and the client's
    assert isinstance(error, InvalidRequest) and isinstance(error, NormcalError)
    assert isinstance(error, ValueError) and isinstance(error, TypeError)
    assert error.status == 0 and error.type == "/problems/validation-error"


@pytest.mark.anyio
async def test_the_async_client_refuses_alike():
    recorder = Recorder()
    nc = AsyncNormcalClient(
        "http://normcal.test", transport=httpx.MockTransport(recorder)
    )
    async with nc:
        with pytest.raises(
            normcal_client.InvalidArgument, match=r"^Invalid argument \(not sent\): k: "
        ):
            await nc.search("kb", "q", k="2")
        with pytest.raises(normcal_client.InvalidArgument, match=r"documents\.0\.text"):
            await nc.upsert_documents("kb", [{"id": "1"}])
    assert recorder.requests == []


def test_numpy_like_vectors_and_mappings_are_accepted_as_the_server_takes_them():
    recorder = Recorder(
        httpx.Response(200, json={"upserted": 1, "ids": ["1"], "truncated": []})
    )
    nc, _ = mock(recorder)

    class Floaty:  # numpy scalars convert to float
        def __float__(self) -> float:
            return 0.5

    nc.upsert_documents(
        "kb", [{"id": "1", "text": "t", "vector": (1, 2.5, Floaty()), "metadata": {}}]
    )
    sent = json.loads(recorder.requests[0].content)
    assert sent["documents"][0]["vector"] == [1.0, 2.5, 0.5]


def test_a_bad_document_is_named_by_its_place_in_the_call_and_its_batch_not_sent():
    """Batches are atomic: one is checked whole before it is sent."""
    done = {"upserted": 2, "ids": ["1", "2"], "truncated": []}
    recorder = Recorder(httpx.Response(200, json=done))
    nc, _ = mock(recorder)
    docs = [{"id": "1", "text": "a"}, {"id": "2", "text": "b"}]
    docs += [{"id": "3", "text": "c"}, {"id": "4", "text": None}]
    error = _refused(lambda: nc.upsert_documents("kb", docs, batch_size=2))
    assert error.errors[0]["loc"] == ["documents", 3, "text"]
    assert len(recorder.requests) == 1  # the first batch; not the one holding it
