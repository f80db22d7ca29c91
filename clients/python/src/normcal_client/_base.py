"""What the blocking and the async client share: options, requests, small helpers.

``_async_client.py`` holds :class:`AsyncNormcalClient`; ``_sync_client.py``, the
blocking :class:`NormcalClient`, is generated from it by ``scripts/unasync.py``.
"""

from __future__ import annotations

import copy
import functools
import os
import ssl
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Self, TypeVar

import httpx

from normcal_client import _endpoints as ep
from normcal_client._errors import error_from_response
from normcal_client._options import RequestOptions, RetryPolicy
from normcal_client._version import __version__

R = TypeVar("R")
# How a client waits between attempts: ``time.sleep``, or ``asyncio.sleep``.
Sleep = Callable[[float], None]
AsyncSleep = Callable[[float], Awaitable[None]]

DEFAULT_URL = "http://127.0.0.1:8000"
PROBLEM_MEDIA_TYPE = "application/problem+json"


@functools.cache
def default_tls() -> ssl.SSLContext:
    """The TLS context every client uses, built once a process.

    It is httpx's default (its CA bundle, or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` as
    set when the first client is built). Building one reads the CA bundle: ~45 ms
    of CPU that every client paid before, also on plain ``http://``.
    """
    return httpx.create_ssl_context()


class ClientBase:
    """What both clients share: options, request building, ``with_options``."""

    _options: RequestOptions
    _owns_http: bool

    def _setup(
        self, api_key: str | None, retry: RetryPolicy | None, owns_http: bool
    ) -> dict[str, str]:
        self._options = RequestOptions(retry=retry or RetryPolicy())
        self._owns_http = owns_http
        headers = {"User-Agent": f"normcal-client/{__version__}"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        return headers

    @property
    def options(self) -> RequestOptions:
        """The options this client applies to every request."""
        return self._options

    def with_options(
        self,
        *,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Self:
        """A client with other options that shares this one's connection pool.

        The original is not changed, so a client shared between threads or tasks
        can be specialised per call: ``nc.with_options(retry=NO_RETRY).search(...)``.
        The copy does not own the pool: closing it is a no-op.
        """
        clone = copy.copy(self)
        clone._options = self._options.replace(
            retry=retry, timeout=timeout, headers=headers
        )
        clone._owns_http = False
        return clone

    def _request(
        self, http: httpx.Client | httpx.AsyncClient, call: ep.Call[Any]
    ) -> httpx.Request:
        headers = {"Accept": f"{call.endpoint.accept}, {PROBLEM_MEDIA_TYPE}"}
        if call.endpoint.sends is not None:
            headers["Content-Type"] = call.endpoint.sends
        timeout = self._options.timeout
        return http.build_request(
            call.endpoint.method,
            call.path,
            json=call.json,
            content=call.content,
            headers={**headers, **self._options.headers},
            timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
        )

    def _retry(self, call: ep.Call[Any]) -> RetryPolicy:
        return call.retry or self._options.retry


def finish(call: ep.Call[R], response: httpx.Response) -> R:
    """The parsed answer, or the problem it carries raised as a typed error."""
    if not response.is_success:
        raise error_from_response(response)
    return call.parse(response)


def atomic_paths(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """``(partial, final)``: write to ``partial``, then ``os.replace`` it over ``final``.

    An export that fails half-way leaves no truncated file under the final name.
    """
    final = Path(path)
    return final.with_name(final.name + ".part"), final


def env_url() -> str:
    """``$NORMCAL_URL``, or the default URL."""
    return os.environ.get("NORMCAL_URL") or DEFAULT_URL


def env_key() -> str | None:
    """``$NORMCAL_API_KEY``, or None when it is unset or empty."""
    return os.environ.get("NORMCAL_API_KEY") or None
