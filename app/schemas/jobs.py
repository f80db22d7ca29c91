"""Schemas of the fit job resource (``POST .../fit-jobs`` answers 202 with one)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.schemas.calibrators import CalibratorInfo
from app.schemas.common import ListEnvelope

FitJobStatus = Literal["queued", "running", "succeeded", "failed"]


class FitJobProgress(BaseModel):
    """How far a fit got: ``done`` of ``total`` steps, the current one named."""

    stage: str = Field(
        description="queued, embedding queries, retrieving, fitting, storing or done"
    )
    done: int
    total: int
    fraction: float = Field(ge=0.0, le=1.0, description="done / total")


class FitJobError(BaseModel):
    """Why a job failed: the problem the synchronous fit would have answered."""

    title: str
    detail: str
    status: int = Field(description="the HTTP status of that problem")


class FitJob(BaseModel):
    """A calibrator fit running in the background."""

    id: str
    collection: str
    status: FitJobStatus
    progress: FitJobProgress
    created_at: float = Field(description="Unix time the job was accepted")
    started_at: float | None = Field(description="Unix time the fit started")
    finished_at: float | None = Field(description="Unix time it succeeded or failed")
    calibrator: CalibratorInfo | None = Field(
        description="the fitted calibrator once the job succeeded"
    )
    error: FitJobError | None = Field(description="why the job failed")


class FitJobList(ListEnvelope):
    """A collection's fit jobs, newest first (finished ones are pruned)."""

    data: list[FitJob]
