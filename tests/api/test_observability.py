"""``/metrics`` in Prometheus format, per-app registries, structured access logs."""

from __future__ import annotations

import io
import json
import logging
import re
import sys

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.api.app import create_app
from app.observability import (
    JsonFormatter,
    TextFormatter,
    configure_logging,
    resolve_log_format,
)
from app.settings import Settings

# What the model makes of a text does not matter here: the deterministic fake.
pytestmark = pytest.mark.fake_embedder


def _samples(client) -> dict[tuple[str, tuple], float]:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def _value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def used(client):
    assert client.post("/v1/collections", json={"name": "kb"}).status_code == 201
    docs = [{"id": f"d{i}", "text": f"text number {i}"} for i in range(3)]
    assert (
        client.put("/v1/collections/kb/documents", json={"documents": docs}).status_code
        == 200
    )
    for _ in range(2):
        assert (
            client.post(
                "/v1/collections/kb/search", json={"query": "number"}
            ).status_code
            == 200
        )
    assert client.get("/v1/collections/nope").status_code == 404
    return client


def test_requests_are_counted_per_route_template(used):
    s = _samples(used)
    search = "/v1/collections/{name}/search"
    assert (
        _value(
            s, "normcal_http_requests_total", method="POST", route=search, status="200"
        )
        == 2
    )
    assert (
        _value(
            s,
            "normcal_http_requests_total",
            method="GET",
            route="/v1/collections/{name}",
            status="404",
        )
        == 1
    )
    assert (
        _value(
            s,
            "normcal_http_request_duration_seconds_count",
            method="POST",
            route=search,
        )
        == 2
    )
    # Raw paths never become labels.
    assert not any("kb" in dict(labels).get("route", "") for _, labels in s)


def test_in_flight_gauge_counts_requests_being_served(used):
    s = _samples(used)
    in_flight = "normcal_http_requests_in_flight"
    # The scrape itself is being served while it renders; finished requests are not.
    assert _value(s, in_flight, method="GET", route="/metrics") == 1
    search = "/v1/collections/{name}/search"
    assert (in_flight, (("method", "POST"), ("route", search))) in s
    assert _value(s, in_flight, method="POST", route=search) == 0


def test_unknown_paths_share_one_label(client):
    for i in range(5):
        client.get(f"/no/such/path/{i}")
    s = _samples(client)
    assert (
        _value(
            s,
            "normcal_http_requests_total",
            method="GET",
            route="<unmatched>",
            status="404",
        )
        == 5
    )


def test_embedding_throughput_index_sizes_and_calibrator(used, app):
    s = _samples(used)
    assert _value(s, "normcal_embedded_texts_total", input_type="document") == 3
    # The query searched twice went through the model once: then the cache had it.
    assert _value(s, "normcal_embedded_texts_total", input_type="query") == 1
    assert _value(s, "normcal_embedding_cache_hits_total", input_type="query") == 1
    assert _value(s, "normcal_embedding_seconds_total", input_type="document") > 0
    assert _value(s, "normcal_collection_documents", collection="kb") == 3
    assert _value(s, "normcal_collection_indexed_vectors", collection="kb") == 3
    assert (
        _value(
            s,
            "normcal_collection_calibrator_info",
            collection="kb",
            calibrator="default",
            method="",
        )
        == 1
    )


def test_active_calibrator_and_fit_durations(used):
    service = used.app_state["service"]  # the lifespan state
    service.context.registry.get("kb").meta["active_calibrator"] = {
        "id": "cal-1",
        "method": "nt",
    }
    assert service.context.metrics is not None
    service.context.metrics.observe_fit(0.3, method="nt")
    s = _samples(used)
    assert (
        _value(
            s,
            "normcal_collection_calibrator_info",
            collection="kb",
            calibrator="cal-1",
            method="nt",
        )
        == 1
    )
    assert _value(s, "normcal_calibrator_fit_duration_seconds_count", method="nt") == 1
    assert _value(
        s, "normcal_calibrator_fit_duration_seconds_sum", method="nt"
    ) == pytest.approx(0.3)


def test_two_apps_in_one_process_do_not_share_metrics(tmp_path, embedder):
    apps = [
        create_app(Settings(data_dir=tmp_path / f"d{i}"), embedder=embedder)
        for i in range(2)
    ]
    with TestClient(apps[0]) as a, TestClient(apps[1]) as b:
        a.get("/healthz")
        a.get("/healthz")
        b.get("/healthz")
        sa, sb = _samples(a), _samples(b)
    key = {"method": "GET", "route": "/healthz", "status": "200"}
    assert _value(sa, "normcal_http_requests_total", **key) == 2
    assert _value(sb, "normcal_http_requests_total", **key) == 1


def test_one_access_log_line_per_request_with_its_id(client, caplog):
    caplog.set_level(logging.INFO, logger="normcal.access")
    r = client.get("/v1/collections", headers={"X-Request-ID": "req-123"})
    lines = [rec for rec in caplog.records if rec.name == "normcal.access"]
    assert len(lines) == 1
    rec = lines[0]
    assert rec.request_id == "req-123" == r.headers["x-request-id"]
    assert (rec.method, rec.route, rec.status) == ("GET", "/v1/collections", 200)
    assert rec.duration_ms >= 0
    entry = json.loads(JsonFormatter().format(rec))
    assert entry["request_id"] == "req-123" and entry["status"] == 200
    assert entry["route"] == "/v1/collections" and entry["logger"] == "normcal.access"


def test_500_logs_the_request_id_of_its_problem(
    tmp_path, embedder, caplog, monkeypatch
):
    from app.services.collections import CollectionsService

    def boom(self):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(CollectionsService, "list_collections", boom)
    caplog.set_level(logging.INFO)
    app = create_app(Settings(data_dir=tmp_path / "d"), embedder=embedder)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/v1/collections", headers={"X-Request-ID": "boom-1"})
    assert r.status_code == 500
    assert r.json()["instance"] == "urn:request:boom-1"
    assert "secret internals" not in r.text
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert any("boom-1" in rec.getMessage() for rec in errors)
    access = [rec for rec in caplog.records if rec.name == "normcal.access"]
    assert [(a.request_id, a.status) for a in access] == [("boom-1", 500)]


def _uvicorn_record() -> logging.LogRecord:
    """A record as uvicorn logs its start: an ANSI ``color_message`` beside the text."""
    record = logging.LogRecord(
        "uvicorn.error", logging.INFO, "", 0, "Started server process [%d]", (42,), None
    )
    record.color_message = "Started server process [\x1b[36m%d\x1b[0m]"
    record.request_id = "req-1"
    return record


def test_log_lines_carry_no_color_message():
    entry = json.loads(JsonFormatter().format(_uvicorn_record()))
    assert entry["msg"] == "Started server process [42]"
    assert entry["request_id"] == "req-1" and "color_message" not in entry
    line = TextFormatter().format(_uvicorn_record())
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO    uvicorn\.error "
        r"Started server process \[42\] request_id=req-1",
        line,
    ), line


def test_a_json_line_never_holds_a_raw_escape():
    record = logging.LogRecord("x", logging.INFO, "", 0, "red \x1b[31mtext", None, None)
    line = JsonFormatter().format(record)
    assert "\x1b" not in line and json.loads(line)["msg"] == "red \x1b[31mtext"


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_auto_log_format_is_text_on_a_terminal_and_json_otherwise():
    assert resolve_log_format("auto", _Stream(tty=True)) == "text"
    assert resolve_log_format("auto", _Stream(tty=False)) == "json"
    for chosen in ("json", "text"):
        assert resolve_log_format(chosen, _Stream(tty=True)) == chosen
        assert resolve_log_format(chosen, _Stream(tty=False)) == chosen


def test_configure_logging_formats_uvicorn_records_too(monkeypatch):
    root, access = logging.getLogger(), logging.getLogger("uvicorn.access")
    saved = root.handlers[:], root.level, access.disabled
    stream = _Stream(tty=False)
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        for log_format, formatter in (("text", TextFormatter), ("json", JsonFormatter)):
            configure_logging("INFO", log_format)
            (handler,) = root.handlers
            assert isinstance(handler.formatter, formatter)
            assert logging.getLogger("uvicorn.error").propagate
            assert not logging.getLogger("uvicorn.error").handlers
    finally:
        root.handlers[:], level, access.disabled = saved
        root.setLevel(level)
