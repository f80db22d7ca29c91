"""How the guarded Milvus client classifies pymilvus errors (pure logic, a fake client).

The real outage (a ``milvus-lite server`` stopped and restarted under the app) is in
``tests/collections/test_milvus_outage.py``; these are the cases a live engine does not
produce on demand.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pymilvus", reason="pymilvus is not installed")

import grpc
from pymilvus import MilvusException
from pymilvus.exceptions import MilvusUnavailableException, ParamError

from app.collections.milvus_client import Guarded, refused
from app.exceptions import NotFoundError, StorageUnavailableError

URI = "http://127.0.0.1:19530"


class Raw:
    """A client whose calls raise the queued errors, then answer ``"rows"``."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.loaded: list[str] = []

    def get(self, name: str, **kwargs: Any) -> str:
        if self.errors:
            raise self.errors.pop(0)
        return "rows"

    def load_collection(self, name: str) -> None:
        self.loaded.append(name)


@pytest.mark.parametrize(
    "error",
    [ParamError(message="bad"), MilvusException(1, "bad", is_input_error=True)],
)
def test_errors_in_the_request_pass_to_the_caller(error):
    with pytest.raises(MilvusException) as caught:
        Guarded(Raw(error), URI).get("ncd_kb")
    assert caught.value is error


def test_a_missing_collection_is_a_404_of_the_normcal_collection():
    gone = MilvusException(100, "collection not found")
    with pytest.raises(NotFoundError, match="'kb'"):
        Guarded(Raw(gone), URI).for_collection("kb").get("ncd_kb")
    with pytest.raises(StorageUnavailableError):  # no collection to name
        Guarded(Raw(gone), URI).get("ncd_kb")


@pytest.mark.parametrize(
    "error",
    [
        MilvusException(2, "Fail connecting to server"),
        MilvusException(1, "rpc deadline exceeded"),
        MilvusException(65535, "server failure", retriable=True),
    ],
)
def test_failures_of_milvus_are_503_with_retry_after_naming_the_uri(error):
    with pytest.raises(StorageUnavailableError) as caught:
        Guarded(Raw(error), URI).get("ncd_kb")
    assert caught.value.retry_after and caught.value.retry_after > 0
    assert URI in caught.value.detail and error.message in caught.value.detail


def test_a_released_collection_is_loaded_and_the_call_retried_once():
    raw = Raw(MilvusException(101, "collection not loaded"))
    assert Guarded(raw, URI).get("ncd_kb") == "rows"
    assert raw.loaded == ["ncd_kb"]
    again = Raw(*[MilvusException(101, "collection not loaded")] * 2)
    with pytest.raises(StorageUnavailableError):
        Guarded(again, URI).get("ncd_kb")


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
