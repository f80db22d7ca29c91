"""Fit jobs over HTTP: 202 and a polled job, the same job for every poller, up-front
4xx with no job, a failed fit activates nothing, a restart fails unfinished jobs, and
the queue bound.

Real model, real SQLite, real FAISS; fits are Platt on the five-document corpus. A
gate (a wrapper around the real ``fit_profile`` that waits for an event) holds a fit
mid-way where a test needs a job to stay running.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.services import calibrators as calibrators_service
from app.services.jobs import JOBS_FILE
from app.settings import Limits, Settings
from tests.conftest import assert_problem
from tests.support.corpus import CORPUS, QUERIES

JUDGMENTS = [
    {"query": q, "document_id": doc, "relevance": 1} for doc, q in QUERIES.items()
]
FIT = {"judgments": JUDGMENTS, "method": "platt", "k": 5}
JOBS = "/v1/collections/kb/fit-jobs"
DEADLINE = 300.0  # seconds a job may take on a busy machine


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", limits=Limits(max_queued_fit_jobs=2))


def _app_client(settings: Settings, embedder: Any) -> TestClient:
    return TestClient(create_app(settings, embedder=embedder))


def _load(client: TestClient) -> None:
    assert client.post("/v1/collections", json={"name": "kb"}).status_code == 201
    docs = [{"id": key, "text": text} for key, text in CORPUS.items()]
    r = client.put("/v1/collections/kb/documents", json={"documents": docs})
    assert r.status_code == 200, r.text


@pytest.fixture
def client(settings: Settings, embedder: Any) -> Iterator[TestClient]:
    with _app_client(settings, embedder) as c:
        _load(c)
        yield c


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """While unset, fits wait before fitting (always released at teardown)."""
    release = threading.Event()
    real = calibrators_service.fit_profile

    def gated(*args: Any, **kwargs: Any) -> Any:
        assert release.wait(DEADLINE), "the test never opened the gate"
        return real(*args, **kwargs)

    monkeypatch.setattr(calibrators_service, "fit_profile", gated)
    yield release
    release.set()


def _wait(client: TestClient, job_id: str, until: set[str]) -> dict[str, Any]:
    """Poll the job until its status is in ``until`` (bounded by DEADLINE)."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        r = client.get(f"{JOBS}/{job_id}")
        assert r.status_code == 200, r.text
        job: dict[str, Any] = r.json()
        if job["status"] in until:
            return job
    raise AssertionError(f"job {job_id} never reached {until}: {job}")


def _active(client: TestClient) -> str | None:
    ref = client.get("/v1/collections/kb").json()["calibrator"]
    return ref["id"] if ref["status"] == "fitted" else None


def _job_rows(settings: Settings) -> int:
    """Rows in the job file; none while no job has made it."""
    if not (settings.data_dir / JOBS_FILE).exists():
        return 0
    with sqlite3.connect(settings.data_dir / JOBS_FILE) as conn:
        return int(conn.execute("SELECT count(*) FROM fit_jobs").fetchone()[0])


def test_a_job_answers_202_and_ends_with_its_calibrator_activated(client):
    r = client.post(JOBS, json=FIT)
    assert r.status_code == 202, r.text
    job = r.json()
    assert r.headers["location"] == f"{JOBS}/{job['id']}"
    assert job["collection"] == "kb" and job["calibrator"] is None
    assert job["status"] in {"queued", "running", "succeeded"}
    done = _wait(client, job["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded", done["error"]
    assert done["error"] is None
    assert done["progress"]["stage"] == "done"
    assert done["progress"]["fraction"] == 1.0
    assert done["progress"]["done"] == done["progress"]["total"]
    assert done["started_at"] <= done["finished_at"]
    assert done["calibrator"]["active"] is True
    assert _active(client) == done["calibrator"]["id"]
    listed = client.get(JOBS).json()
    assert listed["count"] == 1 and listed["data"][0] == done


def test_progress_names_the_stage_a_held_fit_is_in(client, gate):
    job = client.post(JOBS, json=FIT).json()
    held = _wait(client, job["id"], {"running"})
    deadline = time.monotonic() + DEADLINE
    while held["progress"]["stage"] != "fitting" and time.monotonic() < deadline:
        held = client.get(f"{JOBS}/{job['id']}").json()
    assert held["progress"]["stage"] == "fitting"
    assert 0.0 < held["progress"]["fraction"] < 1.0
    assert _active(client) is None  # nothing is stored before the fit ends
    gate.set()
    assert _wait(client, job["id"], {"succeeded"})["progress"]["fraction"] == 1.0


def test_concurrent_pollers_all_see_the_same_finished_job(client):
    job_id = client.post(JOBS, json=FIT).json()["id"]
    pollers = 4
    start = threading.Barrier(pollers)
    seen: list[dict[str, Any]] = []

    def poll() -> None:
        start.wait(DEADLINE)
        seen.append(_wait(client, job_id, {"succeeded", "failed"}))

    threads = [threading.Thread(target=poll) for _ in range(pollers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    assert len(seen) == pollers
    assert all(job == seen[0] for job in seen)
    assert seen[0]["status"] == "succeeded"


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        (JOBS, {**FIT, "judgments": [], "include_feedback": False}, 422),
        (JOBS, {**FIT, "k": 101}, 422),  # max_k is 100
        (
            JOBS,
            {"judgments": [{"query": "q", "document_id": "nope", "relevance": 1}]},
            422,
        ),
        ("/v1/collections/missing/fit-jobs", FIT, 404),
    ],
)
def test_an_invalid_request_is_refused_before_any_job(
    client, settings, path, body, status
):
    assert_problem(client.post(path, json=body), status)
    assert _job_rows(settings) == 0
    assert client.get(JOBS).json() == {"data": [], "count": 0}


def test_a_fit_that_fails_is_a_failed_job_and_activates_nothing(client):
    first = client.post("/v1/collections/kb/calibrators", json=FIT)
    assert first.status_code == 201, first.text
    # No relevant judgment: the fit itself refuses (after the 202).
    none_relevant = [{**j, "relevance": 0} for j in JUDGMENTS]
    body = {**FIT, "judgments": none_relevant, "include_feedback": False}
    r = client.post(JOBS, json=body)
    assert r.status_code == 202, r.text
    failed = _wait(client, r.json()["id"], {"succeeded", "failed"})
    assert failed["status"] == "failed"
    assert failed["calibrator"] is None
    assert failed["error"]["status"] == 422 and failed["error"]["detail"]
    assert _active(client) == first.json()["id"]
    assert len(client.get("/v1/collections/kb/calibrators").json()["data"]) == 2
    # The synchronous fit runs the same job and answers its error as a problem.
    problem = assert_problem(client.post("/v1/collections/kb/calibrators", json=body))
    assert problem["detail"] == failed["error"]["detail"]


def test_a_restart_fails_the_jobs_left_unfinished(settings, embedder):
    with _app_client(settings, embedder) as first:
        _load(first)
        fitted = first.post("/v1/collections/kb/calibrators", json=FIT).json()["id"]
    with sqlite3.connect(settings.data_dir / JOBS_FILE) as conn:
        for job_id, status in (("was-running", "running"), ("was-queued", "queued")):
            conn.execute(
                "INSERT INTO fit_jobs (id, collection, status, stage, done,"
                " created_at, started_at) VALUES (?, 'kb', ?, 'fitting', 2, ?, ?)",
                (job_id, status, time.time(), time.time()),
            )
    with _app_client(settings, embedder) as again:
        for job_id in ("was-running", "was-queued"):
            job = again.get(f"{JOBS}/{job_id}").json()
            assert job["status"] == "failed"
            assert job["error"]["detail"] == "interrupted by a restart"
            assert job["calibrator"] is None and job["finished_at"] is not None
        assert _active(again) == fitted


def test_an_unknown_job_is_404(client):
    assert_problem(client.get(f"{JOBS}/nope"), 404)
    assert_problem(client.get("/v1/collections/missing/fit-jobs/nope"), 404)


def test_jobs_are_bounded_at_max_queued_fit_jobs(client, settings, gate):
    bound = settings.limits.max_queued_fit_jobs
    accepted = [client.post(JOBS, json=FIT) for _ in range(bound)]
    assert [r.status_code for r in accepted] == [202] * bound
    refused = client.post(JOBS, json=FIT)
    problem = assert_problem(refused, 503)
    assert "max_queued_fit_jobs" in problem["detail"]
    assert refused.headers["retry-after"]
    assert _job_rows(settings) == bound
    gate.set()
    for r in accepted:
        assert _wait(client, r.json()["id"], {"succeeded", "failed"})["status"] == (
            "succeeded"
        )
    assert client.post(JOBS, json=FIT).status_code == 202  # room again
