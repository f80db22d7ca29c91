"""Calibrators of a collection and its feedback.

Calibrators: fit, list, report, diagram, drift, switch, delete, export, import.
Feedback: add, list, delete.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from fastapi.responses import HTMLResponse

from app.api.auth import ADMIN, JUDGE, READ, WRITE
from app.api.deps import ServiceDep
from app.api.errors import PROBLEM_RESPONSES
from app.api.routers.params import CollectionName
from app.schemas.calibrators import (
    CalibratorImport,
    CalibratorInfo,
    CalibratorList,
    CalibratorProfile,
    DriftReport,
    FeedbackDeleted,
    FeedbackPage,
    FeedbackRequest,
    FeedbackResponse,
    FitRequest,
)
from app.ui.report import report_html

router = APIRouter(
    prefix="/collections/{name}", tags=["calibrators"], responses=PROBLEM_RESPONSES
)


@router.post("/calibrators", dependencies=[WRITE], status_code=status.HTTP_201_CREATED)
async def create_calibrator(
    *, name: CollectionName, body: FitRequest, service: ServiceDep
) -> CalibratorInfo:
    """Fit a calibrator from judgments with grouped CV; activates it by default."""
    return await service.calibrators.fit_calibrator(name, body)


@router.get("/calibrators", dependencies=[READ])
def read_calibrators(*, name: CollectionName, service: ServiceDep) -> CalibratorList:
    """List the collection's calibrators, oldest first."""
    data = service.calibrators.list_calibrators(name)
    return CalibratorList(data=data, count=len(data))


@router.get("/calibrators/{calibrator_id}", dependencies=[READ])
def read_calibrator(
    *, name: CollectionName, calibrator_id: str, service: ServiceDep
) -> CalibratorInfo:
    """A calibrator's report: CV metrics of every method, norm lift, abstain rule."""
    return service.calibrators.get_calibrator(name, calibrator_id)


@router.get("/calibrators/{calibrator_id}/drift", dependencies=[READ])
def read_drift(
    *, name: CollectionName, calibrator_id: str, service: ServiceDep
) -> DriftReport:
    """Whether the queries it served lately look like those it was judged on."""
    return service.calibrators.drift_report(name, calibrator_id)


@router.get(
    "/calibrators/{calibrator_id}/reliability.png",
    dependencies=[READ],
    response_class=Response,
    responses={200: {"content": {"image/png": {}}}},
)
async def read_reliability_png(
    *, name: CollectionName, calibrator_id: str, service: ServiceDep
) -> Response:
    """Reliability diagram of the calibrator's held-out probabilities."""
    png = await service.calibrators.reliability_png(name, calibrator_id)
    return Response(png, media_type="image/png")


@router.get(
    "/calibrators/{calibrator_id}/report",
    dependencies=[READ],
    response_class=HTMLResponse,
)
def read_report(
    *, name: CollectionName, calibrator_id: str, service: ServiceDep
) -> HTMLResponse:
    """An HTML page: reliability diagram, metrics per method, norm lift, abstain.

    In a browser with ``NORMCAL_API_KEY`` set, open it through the judging page's
    viewer, ``/ui/collections/{name}/calibrators/{id}/report``, which fetches it
    with the key.
    """
    profile = service.calibrators.profile(name, calibrator_id)
    page = report_html(
        profile,
        png_url="reliability.png",  # relative to .../calibrators/{id}/report
        collection=None if profile.default else name,
        css_url="../../../../../ui/static/report.css",  # /v1/collections/... -> /ui
    )
    return HTMLResponse(page)


@router.post("/calibrators/{calibrator_id}/activate", dependencies=[WRITE])
async def activate_calibrator(
    *, name: CollectionName, calibrator_id: str, service: ServiceDep
) -> CalibratorInfo:
    """Serve this calibrator from now on (an atomic switch)."""
    return await service.calibrators.activate_calibrator(name, calibrator_id)


@router.delete(
    "/calibrators/{calibrator_id}",
    dependencies=[WRITE],
    status_code=status.HTTP_204_NO_CONTENT,
)
async def delete_calibrator(
    *, name: CollectionName, calibrator_id: str, service: ServiceDep
) -> None:
    """Delete a fitted calibrator (409 for the active one and the shipped default)."""
    await service.calibrators.delete_calibrator(name, calibrator_id)


@router.get("/calibrators/{calibrator_id}/export", dependencies=[READ])
def export_calibrator(
    *, name: CollectionName, calibrator_id: str, service: ServiceDep
) -> CalibratorProfile:
    """The calibrator as portable JSON, for ``POST .../calibrators/import``."""
    return service.calibrators.export_calibrator(name, calibrator_id)


@router.post(
    "/calibrators/import", dependencies=[ADMIN], status_code=status.HTTP_201_CREATED
)
async def import_calibrator(
    *, name: CollectionName, body: CalibratorImport, service: ServiceDep
) -> CalibratorInfo:
    """Add an exported calibrator under a new id (422 for another embedding model)."""
    return await service.calibrators.import_calibrator(name, body)


@router.post("/feedback", dependencies=[JUDGE], status_code=status.HTTP_201_CREATED)
def create_feedback(
    *, name: CollectionName, body: FeedbackRequest, service: ServiceDep
) -> FeedbackResponse:
    """Store judgments for the next fit."""
    stored, total = service.calibrators.add_feedback(name, body.judgments)
    return FeedbackResponse(stored=stored, total=total)


@router.get("/feedback", dependencies=[JUDGE])
def read_feedback(
    *,
    name: CollectionName,
    service: ServiceDep,
    limit: Annotated[
        int | None,
        Query(ge=1, description="at most limits.max_page_size; default 100 or that"),
    ] = None,
    cursor: Annotated[
        str | None, Query(description="next_cursor of the previous page")
    ] = None,
) -> FeedbackPage:
    """Stored judgments, oldest first, a page at a time."""
    return service.calibrators.list_feedback(name, limit, cursor)


@router.delete("/feedback", dependencies=[WRITE])
def delete_feedback(
    *,
    name: CollectionName,
    service: ServiceDep,
    query: Annotated[
        str | None, Query(description="only this query's judgments; all if absent")
    ] = None,
) -> FeedbackDeleted:
    """Delete stored judgments; answers how many were deleted."""
    return service.calibrators.delete_feedback(name, query)
