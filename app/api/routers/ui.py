"""The judging page and the report viewer: static files shipped in ``app.ui``.

The HTML, JS and CSS hold no data.

The page reads the collection name from its own URL and fetches everything else from
the ``/v1`` API with the bearer key the user typed into it, so the files can be
public (``public_ui``) while every data call still needs the key.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from app.api.auth import READ
from app.api.errors import PROBLEM_RESPONSES
from app.api.routers.params import CollectionName
from app.exceptions import NotFoundError

_ASSETS = {
    "judge.js": "text/javascript",
    "judge.css": "text/css",
    "report.js": "text/javascript",
    "report.css": "text/css",
}

router = APIRouter(prefix="/ui", include_in_schema=False, responses=PROBLEM_RESPONSES)


def _asset(file: str) -> bytes:
    return resources.files("app.ui").joinpath(file).read_bytes()


@router.get(
    "/collections/{name}/judge", dependencies=[READ], response_class=HTMLResponse
)
def judge_page(name: CollectionName) -> HTMLResponse:  # noqa: ARG001 (read by the JS)
    """The keyboard-first judging page of a collection."""
    return HTMLResponse(_asset("judge.html"), headers={"cache-control": "no-cache"})


@router.get(
    "/collections/{name}/calibrators/{calibrator_id}/report",
    dependencies=[READ],
    response_class=HTMLResponse,
)
def report_page(name: CollectionName, calibrator_id: str) -> HTMLResponse:  # noqa: ARG001
    """A calibrator's report, fetched by the page with the key (the judging page's link).

    ``/v1/.../calibrators/{id}/report`` needs the bearer key when the server sets one,
    which a link cannot send; this page can.
    """
    return HTMLResponse(_asset("report.html"), headers={"cache-control": "no-cache"})


@router.get("/static/{file}", dependencies=[READ])
def static_asset(file: str) -> Response:
    """The page's script and style sheet."""
    media_type = _ASSETS.get(file)
    if media_type is None:
        raise NotFoundError("file", file)
    return Response(
        _asset(file), media_type=media_type, headers={"cache-control": "no-cache"}
    )
