"""``/docs`` (Swagger UI) and ``/redoc`` with their scripts served by this service.

FastAPI's own pages load Swagger UI and ReDoc from a public CDN, so on an offline
network (the usual place for a sidecar) they stay blank. The same pages here point
at copies shipped in the ``fastapi-offline`` package (MIT; it vendors the current
``swagger-ui-dist`` and ``redoc`` builds) and served under ``/docs/static/``: the
browser fetches nothing from outside the service.

Their pages carry a Content-Security-Policy of their own (``docs_csp``): the vendored
scripts need inline styles, ``data:`` images and a ``blob:`` worker, and Swagger UI's
one inline script (its configuration) is allowed by its hash, nothing else inline.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import FileResponse, HTMLResponse

from app.api.auth import READ
from app.api.middleware import docs_csp
from app.exceptions import NotFoundError

STATIC_PREFIX = "/docs/static"
_STATIC_DIR = Path(fastapi_offline.__file__).parent / "static"
_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
_TITLE = "normcal"
_OPENAPI_URL = "/openapi.json"
_OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"

router = APIRouter(include_in_schema=False)


def _static(request: Request, file: str) -> str:
    """The asset's URL below the app's root path (behind a proxy prefix too)."""
    return f"{request.scope.get('root_path', '')}{STATIC_PREFIX}/{file}"


def _with_csp(page: HTMLResponse) -> HTMLResponse:
    page.headers["content-security-policy"] = docs_csp(bytes(page.body))
    return page


@router.get("/docs", dependencies=[READ])
def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI on this service's OpenAPI document."""
    root = request.scope.get("root_path", "")
    return _with_csp(
        get_swagger_ui_html(
            openapi_url=root + _OPENAPI_URL,
            title=f"{_TITLE} - Swagger UI",
            oauth2_redirect_url=root + _OAUTH2_REDIRECT_URL,
            swagger_js_url=_static(request, "swagger-ui-bundle.js"),
            swagger_css_url=_static(request, "swagger-ui.css"),
            swagger_favicon_url=_static(request, "favicon.png"),
        )
    )


@router.get(_OAUTH2_REDIRECT_URL, dependencies=[READ])
def swagger_ui_redirect() -> HTMLResponse:
    """Swagger UI's OAuth2 redirect page (no external assets)."""
    return _with_csp(get_swagger_ui_oauth2_redirect_html())


@router.get("/redoc", dependencies=[READ])
def redoc(request: Request) -> HTMLResponse:
    """ReDoc on this service's OpenAPI document (no web fonts: they are remote)."""
    return _with_csp(
        get_redoc_html(
            openapi_url=request.scope.get("root_path", "") + _OPENAPI_URL,
            title=f"{_TITLE} - ReDoc",
            redoc_js_url=_static(request, "redoc.standalone.js"),
            redoc_favicon_url=_static(request, "favicon.png"),
            with_google_fonts=False,
        )
    )


@router.get(STATIC_PREFIX + "/{file}", dependencies=[READ])
def static_asset(file: str) -> FileResponse:
    """One of the vendored Swagger UI / ReDoc files (a fixed list, nothing else)."""
    media_type = _ASSETS.get(file)
    if media_type is None:
        raise NotFoundError("file", file)
    return FileResponse(_STATIC_DIR / file, media_type=media_type)
