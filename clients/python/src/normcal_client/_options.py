"""Retry policy and per-request options (immutable: safe on a shared client)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import httpx

from normcal_client._errors import CollectionUnavailable, error_from_response

RETRY_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long to wait before trying a request again.

    A request is retried when the server answers 429 or 503, or when the connection
    could not be opened (the request never reached the server, so even a POST is
    safe to resend). The wait before retry ``n`` (0-based) is
    ``min(max_backoff, backoff * 2**n)`` plus up to ``jitter`` of it at random; a
    ``Retry-After`` header replaces it, capped at ``max_retry_after``. After
    ``max_attempts`` tries the last error is raised.
    """

    max_attempts: int = 4
    backoff: float = 0.5
    max_backoff: float = 8.0
    max_retry_after: float = 60.0
    jitter: float = 0.1
    retry_statuses: frozenset[int] = RETRY_STATUSES
    retry_connect_errors: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if min(self.backoff, self.max_backoff, self.max_retry_after, self.jitter) < 0:
            raise ValueError("backoff times and jitter must not be negative")

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to sleep after failed attempt ``attempt`` (0-based)."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        base: float = min(self.max_backoff, self.backoff * 2.0**attempt)
        return base * (1.0 + self.jitter * random.random())

    def wait_after_answer(self, attempt: int, response: httpx.Response) -> float | None:
        """Seconds to wait before retrying after ``response``, or None to stop."""
        if attempt + 1 >= self.max_attempts:
            return None
        if response.status_code not in self.retry_statuses:
            return None
        error = error_from_response(response)
        if isinstance(error, CollectionUnavailable) and error.retry_after is None:
            return None
        return self.delay(attempt, error.retry_after)

    def wait_after_failure(
        self, attempt: int, error: httpx.TransportError
    ) -> float | None:
        """Seconds to wait before retrying after a transport error, or None to stop.

        Only errors raised before the request was sent are retried: a read timeout
        may come after the server acted, and a retried POST would act twice.
        """
        if attempt + 1 >= self.max_attempts or not self.retry_connect_errors:
            return None
        if isinstance(
            error, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout
        ):
            return self.delay(attempt, None)
        return None


NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass(frozen=True)
class RequestOptions:
    """What a client applies to each request; see ``NormcalClient.with_options``.

    ``timeout`` ``None`` keeps the timeout of the underlying ``httpx`` client.
    """

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout: float | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def replace(
        self,
        *,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> RequestOptions:
        """A copy with the given options changed (headers are merged)."""
        return RequestOptions(
            retry=retry or self.retry,
            timeout=self.timeout if timeout is None else timeout,
            headers=MappingProxyType({**self.headers, **(headers or {})}),
        )
