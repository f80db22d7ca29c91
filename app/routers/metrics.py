"""``GET /metrics``: Prometheus text exposition (outside ``/v1``)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.deps import ServiceDep
from app.exceptions import NotFoundError
from app.observability import METRICS_CONTENT_TYPE

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}},
)
def read_metrics(service: ServiceDep) -> Response:
    """Prometheus metrics: requests, latency, embedding, index sizes, calibrators."""
    if service.metrics is None:
        raise NotFoundError("endpoint", "/metrics")
    return Response(service.metrics.render(), media_type=METRICS_CONTENT_TYPE)
