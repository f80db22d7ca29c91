"""Calibrator fits as background jobs, recorded in a small SQLite file.

A fit on thousands of judgments takes minutes: a job lets ``POST .../fit-jobs``
answer 202 at once while clients poll it. Each job is one row of ``_jobs.sqlite3``
in the data dir (a name no collection can have), so every poller reads the same
record and a restart finds it: jobs a previous process left queued or running are
marked failed, "interrupted by a restart". None is half-done by then: a fit's only
write, storing (and activating) the calibrator, is one transaction at its very end.

Fits run one at a time (each is CPU-bound and already uses the worker pool), in
asyncio tasks owned by this object; the lifespan cancels them on shutdown.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.collections.store_files import storage_errors
from app.exceptions import (
    InsufficientStorageError,
    NotFoundError,
    OverloadedError,
    StorageUnavailableError,
)
from app.schemas.calibrators import CalibratorInfo
from app.schemas.jobs import FitJob, FitJobError, FitJobProgress
from app.settings import Limits

logger = logging.getLogger(__name__)

JOBS_FILE = "_jobs.sqlite3"  # "_" first: the registry never takes it for a collection
# The steps of a fit, in order; a job's progress is how many are done.
STAGES = ("embedding queries", "retrieving", "fitting", "storing")
# Steps done when a stage starts.
STEP = {stage: done for done, stage in enumerate(STAGES)}
RESTARTED = FitJobError(
    title="Fit interrupted", detail="interrupted by a restart", status=503
)
SHUT_DOWN = FitJobError(
    title="Fit interrupted", detail="interrupted by a shutdown", status=503
)

Progress = Callable[[str], None]  # called with the stage a fit enters
Work = Callable[[Progress], Awaitable[CalibratorInfo]]
# What a failed fit records: the problem the error table gives its error. The HTTP
# layer owns that table and passes its renderer in (``app.api.errors.job_error``).
Describe = Callable[[BaseException], FitJobError]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS fit_jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    collection TEXT NOT NULL,
    status TEXT NOT NULL,
    stage TEXT NOT NULL,
    done INTEGER NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    calibrator TEXT,
    error TEXT
)
"""
_COLUMNS = "id, collection, status, stage, done, created_at, started_at, finished_at"


class FitJobs:
    """The fit jobs of every collection: their records and their running tasks."""

    def __init__(self, path: Path, limits: Limits, describe: Describe) -> None:
        self._path = path
        self._limits = limits
        self._describe = describe
        self._conn: sqlite3.Connection | None = None
        self._problem: str | None = None  # why the file could not be opened
        self._lock = threading.Lock()  # one connection, read from request threads
        self._tasks: dict[str, asyncio.Task[CalibratorInfo]] = {}
        self._turn: asyncio.Lock | None = None  # made in the loop that runs the jobs

    # -- records ------------------------------------------------------------------------
    def open(self) -> None:
        """Fail what a previous process left unfinished, if it left a job file.

        Called at start-up. The file itself is made by the first job, so a service
        that never fits leaves nothing in the data dir. An unusable file is logged,
        reported by :meth:`problem` (``/readyz``), and every use answers 503.
        """
        if self.problem() is not None:
            logger.warning("fit jobs are unavailable: %s", self._problem)

    def problem(self) -> str | None:
        """Why fit jobs cannot be recorded (the file is damaged), or None.

        Tries to open an existing file that is not open yet, so a file repaired or
        removed by the operator is noticed without a restart.
        """
        with self._lock:
            if self._conn is not None or not self._path.exists():
                return None
            try:
                self._db()
            except (StorageUnavailableError, InsufficientStorageError):
                return self._problem
            return None

    def _db(self) -> sqlite3.Connection:
        """The connection, opened (checked, with the restart recovery) on first use.

        A full disk is a 507; any other failure a 503 whose detail names no path
        (the log has the file and SQLite's words).
        """
        if self._conn is not None:
            return self._conn
        conn: sqlite3.Connection | None = None
        try:
            with storage_errors():
                # The local registry makes the data dir; with Milvus storage only
                # this file lives there (fit jobs are per process). Made 0600: its
                # -wal and -shm files get the same mode.
                self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.close(os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600))
                conn = sqlite3.connect(self._path, check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                check = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
                if check != "ok":
                    raise sqlite3.DatabaseError(f"damaged: {check}")
                with conn:
                    conn.execute(_SCHEMA)
                    failed = conn.execute(
                        "UPDATE fit_jobs SET status = 'failed', finished_at = ?,"
                        " error = ? WHERE status IN ('queued', 'running')",
                        (time.time(), RESTARTED.model_dump_json()),
                    ).rowcount
        except InsufficientStorageError:
            if conn is not None:
                conn.close()
            raise
        except (sqlite3.Error, OSError) as error:
            if conn is not None:
                conn.close()
            # Once, not at every readiness probe that tries it again.
            log = logger.error if self._problem is None else logger.debug
            log("the fit job file %s cannot be used: %s", self._path, error)
            self._problem = (
                f"the fit job file ({JOBS_FILE} in the data dir) cannot be used: "
                "see the server log; move it away to start afresh"
            )
            raise StorageUnavailableError(self._problem) from error
        if failed:
            logger.warning("%d fit job(s) were interrupted by a restart", failed)
        self._conn, self._problem = conn, None
        return conn

    @contextmanager
    def _file(self) -> Iterator[sqlite3.Connection]:
        """The open connection under the lock; SQLite's failures as problems."""
        with self._lock:
            conn = self._db()
            try:
                with storage_errors():
                    yield conn
            except sqlite3.Error as error:
                logger.error("the fit job file %s failed: %s", self._path, error)
                raise StorageUnavailableError(
                    f"the fit job file ({JOBS_FILE} in the data dir) failed: see the "
                    "server log"
                ) from error

    def _write(self, sql: str, params: tuple[Any, ...]) -> None:
        with self._file() as conn, conn:
            conn.execute(sql, params)

    def get(self, collection: str, job_id: str) -> FitJob:
        """One job of ``collection`` (404 for an unknown id)."""
        rows = self._read(" WHERE id = ? AND collection = ?", (job_id, collection))
        if not rows:
            raise NotFoundError("fit job", job_id)
        return _job(rows[0])

    def list(self, collection: str) -> list[FitJob]:
        """The jobs of ``collection``, newest first (at most all that are kept)."""
        bound = self._limits.max_finished_fit_jobs + self._limits.max_queued_fit_jobs
        rows = self._read(
            " WHERE collection = ? ORDER BY seq DESC LIMIT ?", (collection, bound)
        )
        return [_job(row) for row in rows]

    def _read(self, where: str, params: tuple[Any, ...]) -> Sequence[Any]:
        """Rows of jobs; none before the first job made the file (reads make none)."""
        if self._conn is None and not self._path.exists():
            return []
        with self._file() as conn:
            return conn.execute(
                f"SELECT {_COLUMNS}, calibrator, error FROM fit_jobs{where}", params
            ).fetchall()

    # -- running ------------------------------------------------------------------------
    def submit(self, collection: str, work: Work) -> FitJob:
        """Record a queued job and start it (503 past ``max_queued_fit_jobs``)."""
        limit = self._limits.max_queued_fit_jobs
        if len(self._tasks) >= limit:
            raise OverloadedError(
                f"{len(self._tasks)} fit jobs are queued or running, the limit "
                "(limits.max_queued_fit_jobs); retry when one has finished",
                retry_after=5,
            )
        job_id = uuid.uuid4().hex[:16]
        self._write(
            "INSERT INTO fit_jobs (id, collection, status, stage, done, created_at)"
            " VALUES (?, ?, 'queued', 'queued', 0, ?)",
            (job_id, collection, time.time()),
        )
        task = asyncio.create_task(self._run(job_id, work), name=f"fit-job-{job_id}")
        self._tasks[job_id] = task
        task.add_done_callback(lambda t: self._forget(job_id, t))
        return self.get(collection, job_id)

    async def wait(self, job_id: str) -> CalibratorInfo:
        """The calibrator of a job started here, or its error raised as it was.

        Shielded: a caller that goes away (a closed connection) leaves the job running.
        """
        task = self._tasks.get(job_id)
        if task is None:
            raise NotFoundError("running fit job", job_id)
        return await asyncio.shield(task)

    async def _run(self, job_id: str, work: Work) -> CalibratorInfo:
        if self._turn is None:
            self._turn = asyncio.Lock()
        try:
            async with self._turn:
                self._write(
                    "UPDATE fit_jobs SET status = 'running', started_at = ? WHERE id = ?",
                    (time.time(), job_id),
                )
                info = await work(lambda stage: self._progress(job_id, stage))
        except asyncio.CancelledError:
            self._finish(job_id, "failed", error=SHUT_DOWN)
            raise
        except Exception as error:
            self._finish(job_id, "failed", error=self._describe(error))
            raise
        self._finish(job_id, "succeeded", calibrator=info)
        return info

    def _progress(self, job_id: str, stage: str) -> None:
        self._write(
            "UPDATE fit_jobs SET stage = ?, done = ? WHERE id = ?",
            (stage, STEP[stage], job_id),
        )

    def _finish(
        self,
        job_id: str,
        status: str,
        *,
        calibrator: CalibratorInfo | None = None,
        error: FitJobError | None = None,
    ) -> None:
        """Record the outcome, then prune finished jobs beyond the kept number."""
        done = len(STAGES) if calibrator is not None else None
        self._write(
            "UPDATE fit_jobs SET status = ?, finished_at = ?, calibrator = ?,"
            " error = ?, stage = CASE WHEN ? IS NULL THEN stage ELSE 'done' END,"
            " done = COALESCE(?, done) WHERE id = ?",
            (
                status,
                time.time(),
                None if calibrator is None else calibrator.model_dump_json(),
                None if error is None else error.model_dump_json(),
                done,
                done,
                job_id,
            ),
        )
        self._write(
            "DELETE FROM fit_jobs WHERE status IN ('succeeded', 'failed') AND seq NOT"
            " IN (SELECT seq FROM fit_jobs WHERE status IN ('succeeded', 'failed')"
            " ORDER BY seq DESC LIMIT ?)",
            (self._limits.max_finished_fit_jobs,),
        )

    def _forget(self, job_id: str, task: asyncio.Task[CalibratorInfo]) -> None:
        self._tasks.pop(job_id, None)
        if not task.cancelled():
            task.exception()  # recorded in the row; not "never retrieved"

    async def close(self) -> None:
        """Cancel the jobs (each is recorded as failed), then close the file."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _job(row: tuple[Any, ...]) -> FitJob:
    job_id, collection, status, stage, done, created, started, finished = row[:8]
    calibrator, error = row[8:]
    total = len(STAGES)
    return FitJob(
        id=job_id,
        collection=collection,
        status=status,
        progress=FitJobProgress(
            stage=stage, done=done, total=total, fraction=done / total
        ),
        created_at=created,
        started_at=started,
        finished_at=finished,
        calibrator=None
        if calibrator is None
        else CalibratorInfo.model_validate(json.loads(calibrator)),
        error=None if error is None else FitJobError.model_validate(json.loads(error)),
    )
