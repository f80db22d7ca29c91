"""Observability: Prometheus metrics, the access log, and logging set-up.

Every app owns one :class:`Metrics` with its own ``CollectorRegistry`` (never the
process-global default registry, so several apps in one process do not collide).
Requests are labelled by *route template* (``/v1/collections/{name}/search``), never
by raw path, so hostile or numerous URLs cannot explode label cardinality.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any, ClassVar, Literal

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.routing import Route, compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.collections.term_counts import LOOKUPS
from app.embedding.precision import precision_of
from app.exceptions import StorageUnavailableError

if TYPE_CHECKING:
    from fastapi import FastAPI

    from app.collections.base import Registry
    from app.embedding import Embedder, EmbeddingBatch, InputType
    from app.embedding.cache import CacheStats

logger = logging.getLogger(__name__)
access_logger = logging.getLogger("normcal.access")

UNMATCHED_ROUTE = "<unmatched>"
# Seconds; requests span sub-millisecond reads to multi-second batch upserts.
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
FIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST


class _CollectionCollector(Collector):
    """Index sizes and the calibrator in use, read from the registry at scrape time."""

    def __init__(self) -> None:
        self.registry: Registry[Any] | None = None

    def collect(self) -> Iterator[Metric]:
        documents = GaugeMetricFamily(
            "normcal_collection_documents",
            "Documents stored in SQLite, per collection.",
            labels=["collection"],
        )
        indexed = GaugeMetricFamily(
            "normcal_collection_indexed_vectors",
            "Vectors in the FAISS index, per collection.",
            labels=["collection"],
        )
        calibrator = InfoMetricFamily(
            "normcal_collection_calibrator",
            "Calibrator in use per collection ('default' = shipped profile).",
            labels=["collection"],
        )
        unavailable = GaugeMetricFamily(
            "normcal_collections_unavailable",
            "Collections quarantined at start-up (file could not be opened).",
        )
        registry = self.registry
        try:
            names = registry.names() if registry is not None else []
        except StorageUnavailableError:
            names = []  # Milvus does not answer: no per-collection rows
        unavailable.add_metric([], len(registry.unavailable()) if registry else 0)
        for name in names:
            assert registry is not None
            try:
                collection = registry.get(name)
                n_docs, _, n_vectors = collection.counts()
            except Exception:  # dropped or closed between names() and get()
                continue
            documents.add_metric([name], n_docs)
            indexed.add_metric([name], n_vectors)
            calibrator.add_metric([name], _calibrator_labels(collection.meta))
        yield documents
        yield indexed
        yield calibrator
        yield unavailable


class _TermLookupsCollector(Collector):
    """Milvus document-frequency lookups of query terms (``app.collections.term_counts``)."""

    def collect(self) -> Iterator[Metric]:
        lookups = CounterMetricFamily(
            "normcal_milvus_term_lookups",
            "Query terms whose document frequency searches counted in Milvus "
            "(counted), or left uncounted past NORMCAL_MILVUS_TERM_LOOKUPS "
            "(past_bound), since the process started.",
            labels=["outcome"],
        )
        lookups.add_metric(["counted"], LOOKUPS.counted)
        lookups.add_metric(["past_bound"], LOOKUPS.past_bound)
        yield lookups


# ``(collection, drifting, PSI by feature)`` of each collection with a drift verdict.
DriftSample = tuple[str, bool, dict[str, float]]


class _DriftCollector(Collector):
    """The last drift verdict of each collection, read at scrape time.

    Scraping computes nothing: it reads the verdicts search last cached.
    """

    def __init__(self) -> None:
        self.source: Callable[[], list[DriftSample]] | None = None

    def collect(self) -> Iterator[Metric]:
        drifting = GaugeMetricFamily(
            "normcal_calibrator_drifting",
            "1 when a collection's served queries moved away from those its "
            "calibrator was judged on, 0 when they did not (no row: no verdict yet).",
            labels=["collection"],
        )
        psi = GaugeMetricFamily(
            "normcal_calibrator_drift_psi",
            "Population stability index of each drift feature, served against judged "
            "queries (above 0.25: a shift).",
            labels=["collection", "feature"],
        )
        for name, moved, features in self.source() if self.source else []:
            drifting.add_metric([name], 1.0 if moved else 0.0)
            for feature, value in features.items():
                psi.add_metric([name, feature], value)
        yield drifting
        yield psi


class _CacheCollector(Collector):
    """The embedding cache's counters (:class:`~app.embedding.cache.CacheStats`)."""

    def __init__(self) -> None:
        self.source: Callable[[], CacheStats] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.source is None:
            return
        stats = self.source()
        for name, counts, what in (
            ("hits", stats.hits, "Texts answered from the embedding cache"),
            ("misses", stats.misses, "Texts the embedding cache did not hold"),
        ):
            family = CounterMetricFamily(
                f"normcal_embedding_cache_{name}",
                f"{what}, by input type.",
                labels=["input_type"],
            )
            for input_type, count in sorted(counts.items()):
                family.add_metric([input_type], count)
            yield family
        yield CounterMetricFamily(
            "normcal_embedding_cache_evictions",
            "Entries evicted from the embedding cache to stay within its bounds.",
            value=stats.evictions,
        )
        for name, value, what in (
            ("entries", stats.entries, "Texts held by the embedding cache."),
            ("bytes", stats.bytes, "Bytes the embedding cache counts as held."),
            ("max_entries", stats.max_entries, "NORMCAL_EMBED_CACHE_ENTRIES."),
            ("max_bytes", stats.max_bytes, "NORMCAL_EMBED_CACHE_BYTES."),
        ):
            yield GaugeMetricFamily(
                f"normcal_embedding_cache_{name}", what, value=value
            )


def _calibrator_labels(meta: dict[str, Any]) -> dict[str, str]:
    active = meta.get("active_calibrator")
    if not active:
        return {"calibrator": "default", "method": ""}
    if isinstance(active, dict):
        return {
            "calibrator": str(active.get("id", "")),
            "method": str(active.get("method", "")),
        }
    return {"calibrator": str(active), "method": ""}


class Metrics:
    """The Prometheus metrics of one app.

    The calibrator code reports fit durations through :meth:`observe_fit`; the
    service reaches this object as ``Service.metrics`` (``None`` when not wired).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "normcal_http_requests",
            "HTTP requests by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "normcal_http_requests_in_flight",
            "HTTP requests being served now, by method and route template "
            "(what a graceful shutdown waits for).",
            ["method", "route"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "normcal_http_request_duration_seconds",
            "HTTP request latency by method and route template.",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.embedded_texts = Counter(
            "normcal_embedded_texts",
            "Texts embedded, by input type.",
            ["input_type"],
            registry=self.registry,
        )
        self.embedding_seconds = Counter(
            "normcal_embedding_seconds",
            "Seconds spent embedding, by input type (texts/seconds = throughput).",
            ["input_type"],
            registry=self.registry,
        )
        self.fit_seconds = Histogram(
            "normcal_calibrator_fit_duration_seconds",
            "Duration of calibrator fits, by chosen method.",
            ["method"],
            buckets=FIT_BUCKETS,
            registry=self.registry,
        )
        self.precision = Info(
            "normcal_embedding_precision",
            "The precision the embedding model runs in, and why.",
            registry=self.registry,
        )
        self._collections = _CollectionCollector()
        self.registry.register(self._collections)
        self._drift = _DriftCollector()
        self.registry.register(self._drift)
        self.registry.register(_TermLookupsCollector())
        self._cache = _CacheCollector()
        self.registry.register(self._cache)

    def watch(self, registry: Registry[Any] | None) -> None:
        """Report index sizes and calibrators of ``registry`` (None: stop)."""
        self._collections.registry = registry

    def watch_drift(self, source: Callable[[], list[DriftSample]] | None) -> None:
        """Report the drift verdicts ``source`` lists at each scrape (None: stop)."""
        self._drift.source = source

    def watch_cache(self, source: Callable[[], CacheStats] | None) -> None:
        """Report the embedding cache's counters ``source`` gives (None: stop)."""
        self._cache.source = source

    def observe_request(
        self, method: str, route: str, status: int, seconds: float
    ) -> None:
        """Count one request and record its latency."""
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def observe_embedding(self, input_type: str, texts: int, seconds: float) -> None:
        """Count embedded texts and the time they took."""
        self.embedded_texts.labels(input_type).inc(texts)
        self.embedding_seconds.labels(input_type).inc(seconds)

    def observe_fit(self, seconds: float, method: str = "auto") -> None:
        """Record one calibrator fit of ``seconds`` that chose ``method``."""
        self.fit_seconds.labels(method).observe(seconds)

    def instrument(self, embedder: Embedder) -> Embedder:
        """Wrap ``embedder`` so every call is counted; report its precision."""
        choice = precision_of(embedder)
        self.precision.info({"precision": choice.precision, "reason": choice.reason})
        return InstrumentedEmbedder(embedder, self)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class InstrumentedEmbedder:
    """An :class:`~app.embedding.Embedder` that reports throughput to :class:`Metrics`."""

    def __init__(self, inner: Embedder, metrics: Metrics) -> None:
        self.inner = inner
        self.metrics = metrics
        self.model_name = inner.model_name
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.max_seq_length = inner.max_seq_length

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        """Embed via the wrapped model and count texts and seconds."""
        started = time.perf_counter()
        batch = self.inner.embed(texts, input_type)
        self.metrics.observe_embedding(
            input_type, len(texts), time.perf_counter() - started
        )
        return batch

    def __getattr__(self, name: str) -> Any:
        # Anything beyond the protocol (e.g. token_counts) comes from the real model.
        return getattr(self.inner, name)


class RouteTemplates:
    """Map a request path to its route's full template, e.g. ``/v1/embed``.

    Built lazily from the app's OpenAPI paths and plain routes (``/docs``), so it
    needs no router internals. A path no template matches is ``<unmatched>``; the
    label set is bounded by the routes whatever clients send.

    Rendering the OpenAPI schema costs ~0.2 s an app. Apps that have the same routes
    (every app ``create_app`` builds) pass the same ``shared_as`` and build the
    templates once per process.
    """

    _shared: ClassVar[dict[str, list[tuple[str, re.Pattern[str]]]]] = {}

    def __init__(self, app: FastAPI, *, shared_as: str | None = None) -> None:
        self._app = app
        self._shared_as = shared_as
        self._compiled: list[tuple[str, re.Pattern[str]]] | None = None

    def _build(self) -> list[tuple[str, re.Pattern[str]]]:
        templates = list(self._app.openapi().get("paths", {}))
        templates += [r.path for r in self._app.routes if isinstance(r, Route)]
        return [(t, compile_path(t)[0]) for t in dict.fromkeys(templates)]

    def _templates(self) -> list[tuple[str, re.Pattern[str]]]:
        if self._shared_as is None:
            return self._build()
        compiled = self._shared.get(self._shared_as)
        if compiled is None:
            compiled = self._shared[self._shared_as] = self._build()
        return compiled

    def __call__(self, scope: Scope) -> str:
        """The template of the route that served ``scope``."""
        if self._compiled is None:
            self._compiled = self._templates()
        path = scope.get("path", "")
        for template, regex in self._compiled:
            if regex.match(path):
                return template
        return UNMATCHED_ROUTE


class AccessLogMiddleware:
    """One structured access-log line and one metrics observation per request.

    Sits inside :class:`~app.api.middleware.RequestIdMiddleware`, so the request id is
    known; a request that ends in an unhandled exception is logged as status 500
    before the exception travels on to the 500 handler.
    """

    def __init__(
        self, app: ASGIApp, *, metrics: Metrics, templates: RouteTemplates
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.templates = templates

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one ASGI connection."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        route = self.templates(scope)
        method = str(scope.get("method", ""))

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            with self.metrics.in_flight.labels(method, route).track_inprogress():
                await self.app(scope, receive, send_and_record)
        finally:
            seconds = time.perf_counter() - started
            self.metrics.observe_request(method, route, status, seconds)
            state = scope.get("state", {})
            fields = {
                "request_id": state.get("request_id"),
                "method": method,
                "route": route,
                "path": scope.get("path", ""),
                "status": status,
                "duration_ms": round(seconds * 1000, 2),
            }
            if state.get("key_name"):  # the key's name (never the key)
                fields["key"] = state["key_name"]
            access_logger.info("request", extra=fields)


# Attributes every LogRecord has; anything else came in through ``extra=``.
# uvicorn adds ``color_message`` (its message with ANSI colours) to some records:
# a terminal's concern, never a field of a log line.
_RECORD_FIELDS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "color_message",
}

LogFormat = Literal["auto", "json", "text"]


def _extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields ``record`` received through ``extra=`` (request id, status, ...)."""
    return {
        key: value
        for key, value in record.__dict__.items()
        if key not in _RECORD_FIELDS and not key.startswith("_")
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and ``extra`` fields.

    ``json.dumps`` escapes control characters, so a line never holds a raw ANSI
    escape whatever a message contains.
    """

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as JSON."""
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **_extra_fields(record),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``time level logger message key=value ...``: a log for a person at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as one readable line (and its traceback, if any)."""
        line = super().format(record)
        fields = " ".join(f"{k}={v}" for k, v in _extra_fields(record).items())
        if not fields:
            return line
        head, newline, rest = line.partition("\n")
        return f"{head} {fields}{newline}{rest}"


def resolve_log_format(log_format: LogFormat, stream: IO[str]) -> LogFormat:
    """``auto`` is ``text`` when ``stream`` is a terminal and ``json`` otherwise."""
    if log_format != "auto":
        return log_format
    isatty = getattr(stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


def configure_logging(level: str = "INFO", log_format: LogFormat = "auto") -> None:
    """Send every log record, uvicorn's included, to stderr in ``log_format``."""
    handler = logging.StreamHandler(sys.stderr)
    chosen = resolve_log_format(log_format, sys.stderr)
    handler.setFormatter(JsonFormatter() if chosen == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's own access log would duplicate ours, without the request id.
    logging.getLogger("uvicorn.access").disabled = True
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # Libraries' warnings.warn(...) and transformers' own handler ("[transformers]
    # `loss_type=None` ...") are log records in this format too, never bare lines.
    logging.captureWarnings(True)
    _adopt_transformers_logging()


def _adopt_transformers_logging() -> None:
    """Transformers logs through a stderr handler of its own: route it to the root's.

    Its library logger is configured once, on first use, with that handler and no
    propagation; configuring it now (transformers' API) and then taking the handler
    away leaves its records to ours. Absent in the torch-free image: nothing to do.
    """
    try:
        from transformers.utils import logging as transformers_logging
    except ImportError:
        return

    transformers_logging.disable_default_handler()
    transformers_logging.enable_propagation()
