"""``GET /metrics``: Prometheus text exposition (outside ``/v1``).

Its labels name every collection and calibrator, so when the server has an API key
the scrape must send it too (``Authorization: Bearer``), unless the operator sets
``NORMCAL_PUBLIC_METRICS=true``; see :mod:`app.api.auth`.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from app.api.auth import READ_EVERY_COLLECTION, bearer_scheme
from app.api.deps import ServiceDep
from app.observability import METRICS_CONTENT_TYPE

router = APIRouter(tags=["metrics"], dependencies=[Depends(bearer_scheme)])


@router.get(
    "/metrics",
    dependencies=[READ_EVERY_COLLECTION],
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}},
)
def read_metrics(service: ServiceDep) -> Response:
    """Prometheus metrics: requests, latency, embedding, index sizes, calibrators."""
    return Response(service.system.render_metrics(), media_type=METRICS_CONTENT_TYPE)
