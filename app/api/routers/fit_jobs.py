"""Fit jobs: a calibrator fit that answers 202 at once and is polled for its result."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.api.auth import READ, WRITE
from app.api.deps import ServiceDep
from app.api.errors import PROBLEM_RESPONSES
from app.api.routers.params import CollectionName
from app.schemas.calibrators import FitRequest
from app.schemas.jobs import FitJob, FitJobList

router = APIRouter(
    prefix="/collections/{name}/fit-jobs",
    tags=["calibrators"],
    responses=PROBLEM_RESPONSES,
)


@router.post("", dependencies=[WRITE], status_code=status.HTTP_202_ACCEPTED)
async def create_fit_job(
    *, name: CollectionName, body: FitRequest, service: ServiceDep, response: Response
) -> FitJob:
    """Start a fit (checked first: a bad request is a 4xx and starts nothing).

    Poll the job at ``Location``; on success it holds the calibrator, stored and
    (by default) activated in one step at the end.
    """
    job = await service.calibrators.start_fit(name, body)
    response.headers["Location"] = f"/v1/collections/{name}/fit-jobs/{job.id}"
    return job


@router.get("", dependencies=[READ])
def read_fit_jobs(*, name: CollectionName, service: ServiceDep) -> FitJobList:
    """The collection's fit jobs, newest first (old finished ones are pruned)."""
    data = service.calibrators.list_fit_jobs(name)
    return FitJobList(data=data, count=len(data))


@router.get("/{job_id}", dependencies=[READ])
def read_fit_job(*, name: CollectionName, job_id: str, service: ServiceDep) -> FitJob:
    """One fit job: status, progress, and the calibrator or the error."""
    return service.calibrators.get_fit_job(name, job_id)
