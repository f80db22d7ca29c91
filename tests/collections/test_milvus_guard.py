"""How the guarded Milvus client classifies pymilvus errors (pure logic, a fake client).

The error shapes are the ones the supported servers sent (recorded with pymilvus
3.0.2 against milvus-lite 3.2.2 and the engine of milvus-lite 2.5.1), so the table
is checked per version without the servers. Real engines are in
``tests/collections/test_milvus_bounded.py`` (timeouts, a released collection) and
``tests/collections/test_milvus_outage.py`` (a stopped server).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("pymilvus", reason="pymilvus is not installed")

import grpc
from pymilvus import MilvusException
from pymilvus.exceptions import MilvusUnavailableException, ParamError

from app.collections.milvus_client import (
    LOADS_AT_ONCE,
    CallOptions,
    Guarded,
    Reloads,
    refused,
)
from app.exceptions import (
    BackendUnsupportedError,
    InvalidRequestError,
    NormcalError,
    NotFoundError,
    StorageUnavailableError,
)

URI = "http://127.0.0.1:19530"
LITE3, ENGINE = "milvus-lite 3.2.2", "milvus-lite 2.5.1 (the C++ engine)"

# (server, code, compatible_code, message) as recorded, and what normcal answers
RECORDED: list[tuple[str, int, int, str, type[NormcalError]]] = [
    (
        LITE3,
        6,
        6,
        "field access: expected string key or non-negative integer index at column 11",
        InvalidRequestError,
    ),
    (LITE3, 100, 4, "collection 'nope' does not exist", NotFoundError),
    (
        LITE3,
        1,
        0,
        "matmul: Input operand 1 has a mismatch in its core dimension 0",
        StorageUnavailableError,
    ),
    (
        ENGINE,
        1100,
        0,
        "Invalid expr: metadata[ ==: invalid parameter",
        InvalidRequestError,
    ),
    (
        ENGINE,
        1100,
        0,
        'Invalid expr: text_match(id, "x"): invalid parameter',
        InvalidRequestError,
    ),
    (
        ENGINE,
        1100,
        0,
        "limit should be in range [1, 16384], but got 16385: invalid parameter",
        InvalidRequestError,
    ),
    (ENGINE, 100, 0, "collection not found", NotFoundError),
    (ENGINE, 100, 0, "Can not find nope's schema: collection not found", NotFoundError),
    (
        ENGINE,
        65535,
        0,
        "invalid index type: HNSW, local mode only support FLAT IVF_FLAT AUTOINDEX: ",
        BackendUnsupportedError,
    ),
    (
        ENGINE,
        2000,
        0,
        " => vector dimension mismatch, expected vector size(byte) 8, actual 12: "
        "segcore error",
        StorageUnavailableError,
    ),
    # a server's code 6 is not Lite 3.x's IllegalArgument: Milvus failing, a 503
    ("Milvus 2.5.x", 6, 1, "cross cluster routing", StorageUnavailableError),
    ("Milvus 2.5.x", 65535, 1, "unexpected", StorageUnavailableError),
]


class Raw:
    """A client whose calls raise the queued errors, then answer ``"rows"``.

    ``load_collection`` waits for ``release`` (set by default), so a test can hold
    a background load under way.
    """

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.loaded: list[str] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.release = threading.Event()
        self.release.set()

    def _answer(self, method: str, kwargs: dict[str, Any]) -> str:
        self.calls.append((method, kwargs))
        if self.errors:
            raise self.errors.pop(0)
        return "rows"

    def get(self, name: str, **kwargs: Any) -> str:
        return self._answer("get", kwargs)

    def upsert(self, name: str, rows: Any, **kwargs: Any) -> str:
        return self._answer("upsert", kwargs)

    def close(self, **kwargs: Any) -> str:
        return self._answer("close", kwargs)

    def load_collection(self, name: str, **kwargs: Any) -> None:
        self.release.wait()
        self.loaded.append(name)


def guarded(raw: Raw) -> Guarded:
    return Guarded(raw, URI, options=CallOptions(timeout=2.5, consistency="Bounded"))


@pytest.mark.parametrize(
    ("server", "code", "legacy", "message", "answer"),
    RECORDED,
    ids=[f"{r[0]}-{r[1]}-{i}" for i, r in enumerate(RECORDED)],
)
def test_each_recorded_error_shape_gets_its_answer(
    server, code, legacy, message, answer
):
    error = MilvusException(code, message, legacy)
    with pytest.raises(answer) as caught:
        guarded(Raw(error)).for_collection("kb").get("ncd_kb")
    assert caught.value.__cause__ is error
    if answer is StorageUnavailableError:
        assert caught.value.retry_after and caught.value.retry_after > 0
    if answer in (InvalidRequestError, BackendUnsupportedError):  # names Milvus's code
        assert f"Milvus error {code}" in caught.value.detail
    assert URI not in caught.value.detail and "ncd_kb" not in caught.value.detail
    if answer is InvalidRequestError:  # Milvus quotes normcal's expression
        assert message not in caught.value.detail


def test_pymilvus_refusing_a_request_is_a_422():
    with pytest.raises(InvalidRequestError):
        guarded(Raw(ParamError(message="bad"))).get("ncd_kb")


def test_is_input_error_alone_is_not_trusted():
    """Only recent servers set it: an unknown code is an outage whatever it says."""
    error = MilvusException(9999, "bad", is_input_error=True)
    with pytest.raises(StorageUnavailableError):
        guarded(Raw(error)).get("ncd_kb")


def test_a_missing_collection_is_a_404_of_the_normcal_collection():
    gone = MilvusException(100, "collection not found")
    with pytest.raises(NotFoundError, match="'kb'"):
        guarded(Raw(gone)).for_collection("kb").get("ncd_kb")
    with pytest.raises(StorageUnavailableError):  # no collection to name
        guarded(Raw(gone)).get("ncd_kb")


@pytest.mark.parametrize(
    "error",
    [
        MilvusException(2, "Fail connecting to server"),
        MilvusException(1, "rpc deadline exceeded"),
        MilvusException(65535, "server failure", retriable=True),
    ],
)
def test_failures_of_milvus_are_503_with_retry_after_naming_no_uri(error, caplog):
    with pytest.raises(StorageUnavailableError) as caught:
        guarded(Raw(error)).get("ncd_kb")
    assert caught.value.retry_after and caught.value.retry_after > 0
    assert f"Milvus error {error.code}" in caught.value.detail
    assert error.message not in caught.value.detail
    assert URI not in caught.value.detail and "ncd_kb" not in caught.value.detail
    assert URI in caplog.text and error.message in caplog.text  # the operator's log


def test_a_released_collection_is_a_503_and_one_background_load():
    released = MilvusException(101, "collection not loaded", 101)
    raw = Raw(released, released, released)
    raw.release.clear()  # the first load stays under way
    client = guarded(raw)
    for each in (client, client.for_collection("kb")):  # one set of loads for both
        with pytest.raises(StorageUnavailableError, match="being loaded") as caught:
            each.get("ncd_kb")
        assert caught.value.retry_after and caught.value.retry_after > 0
    raw.release.set()
    client.reloads.wait()
    assert raw.loaded == ["ncd_kb"]  # one load, not one per request
    with pytest.raises(StorageUnavailableError):  # still released: a new load
        client.get("ncd_kb")
    client.reloads.wait()
    assert raw.loaded == ["ncd_kb", "ncd_kb"]
    assert client.get("ncd_kb") == "rows"


def test_background_loads_run_a_few_at_a_time_and_stay_pending_until_done():
    """A restarted Milvus with many collections is loaded LOADS_AT_ONCE at a time;
    readiness sees every one pending until its load succeeded; a failed one is
    started again by ``retry``."""
    running: set[str] = set()
    most = 0
    lock, release = threading.Lock(), threading.Event()
    fail = {"c5"}

    def load(milvus: str) -> None:
        nonlocal most
        with lock:
            running.add(milvus)
            most = max(most, len(running))
        release.wait(60)
        with lock:
            running.discard(milvus)
        if milvus in fail:
            raise MilvusException(65535, "load failed")

    reloads = Reloads()
    names = [f"c{i}" for i in range(LOADS_AT_ONCE + 2)]
    ended = [reloads.start(load, name) for name in names]
    assert reloads.start(load, "c0") is ended[0]  # one load per collection
    assert reloads.pending() == sorted(names)
    release.set()
    for event in ended:
        assert event.wait(60)
    assert most <= LOADS_AT_ONCE
    assert reloads.pending() == ["c5"]  # failed: still pending
    fail.clear()
    reloads.retry()
    reloads.wait()
    assert reloads.pending() == []


def test_every_call_is_bounded_and_reads_use_the_consistency_level():
    raw = Raw()
    client = guarded(raw)
    client.get("ncd_kb")
    client.upsert("ncd_kb", [])
    client.get("ncd_kb", timeout=9.0)  # the caller's own value wins
    client.close()
    assert raw.calls == [
        ("get", {"timeout": 2.5, "consistency_level": "Bounded"}),
        ("upsert", {"timeout": 2.5}),
        ("get", {"timeout": 9.0, "consistency_level": "Bounded"}),
        ("close", {}),
    ]


@pytest.mark.parametrize(
    ("error", "is_refusal"),
    [
        (MilvusException(1100, "invalid parameter"), True),
        (MilvusException(65535, "invalid index type: HNSW"), True),  # Lite 2.5.1
        (MilvusException(65535, "server failure", retriable=True), False),
        (MilvusException(8, "rate limit exceeded"), False),
        (MilvusException(99, "service state"), False),
        (MilvusException(100, "collection not found"), True),
        (MilvusException(grpc.StatusCode.DEADLINE_EXCEEDED, "timed out"), False),
        (MilvusUnavailableException(message="cannot connect"), False),
    ],
)
def test_a_create_step_refused_by_the_server_is_told_from_an_outage(error, is_refusal):
    """A refusal at create is a 422 naming the feature; the rest stays a 503."""
    assert refused(error) is is_refusal
