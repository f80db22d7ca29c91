"""Calibrators of a collection: fit, list, report, diagram, switch; and feedback."""

from __future__ import annotations

from fastapi import APIRouter, Response, status
from fastapi.responses import HTMLResponse

from app.api.deps import ServiceDep
from app.api.errors import PROBLEM_RESPONSES
from app.api.routers.params import CollectionName
from app.api.schemas.calibrators import (
    CalibratorInfo,
    CalibratorList,
    FeedbackRequest,
    FeedbackResponse,
    FitRequest,
)
from app.ops.report import report_html

router = APIRouter(
    prefix="/collections/{name}", tags=["calibrators"], responses=PROBLEM_RESPONSES
)


@router.post("/calibrators", status_code=status.HTTP_201_CREATED)
async def create_calibrator(
    *, name: CollectionName, body: FitRequest, service: ServiceDep
) -> CalibratorInfo:
    """Fit a calibrator from judgments with grouped CV; activates it by default."""
    return await service.fit_calibrator(name, body)


@router.get("/calibrators")
def read_calibrators(*, name: CollectionName, service: ServiceDep) -> CalibratorList:
    """List the collection's calibrators, oldest first."""
    data = service.list_calibrators(name)
    return CalibratorList(data=data, count=len(data))


@router.get("/calibrators/{calibrator_id}")
def read_calibrator(
    *, name: CollectionName, calibrator_id: str, service: ServiceDep
) -> CalibratorInfo:
    """A calibrator's report: CV metrics of every method, norm lift, abstain rule."""
    return service.get_calibrator(name, calibrator_id)


@router.get(
    "/calibrators/{calibrator_id}/reliability.png",
    response_class=Response,
    responses={200: {"content": {"image/png": {}}}},
)
async def read_reliability_png(
    *, name: CollectionName, calibrator_id: str, service: ServiceDep
) -> Response:
    """Reliability diagram of the calibrator's held-out probabilities."""
    png = await service.reliability_png(name, calibrator_id)
    return Response(png, media_type="image/png")


@router.get("/calibrators/{calibrator_id}/report", response_class=HTMLResponse)
def read_report(
    *, name: CollectionName, calibrator_id: str, service: ServiceDep
) -> HTMLResponse:
    """An HTML page: reliability diagram, metrics per method, norm lift, abstain."""
    profile = service.profile(name, calibrator_id)
    page = report_html(
        profile,
        png_url="reliability.png",  # relative to .../calibrators/{id}/report
        collection=None if profile.default else name,
    )
    return HTMLResponse(page)


@router.post("/calibrators/{calibrator_id}/activate")
async def activate_calibrator(
    *, name: CollectionName, calibrator_id: str, service: ServiceDep
) -> CalibratorInfo:
    """Serve this calibrator from now on (an atomic switch)."""
    return await service.activate_calibrator(name, calibrator_id)


@router.post("/feedback", status_code=status.HTTP_201_CREATED)
def create_feedback(
    *, name: CollectionName, body: FeedbackRequest, service: ServiceDep
) -> FeedbackResponse:
    """Store judgments for the next fit."""
    stored, total = service.add_feedback(name, body.judgments)
    return FeedbackResponse(stored=stored, total=total)
