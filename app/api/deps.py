"""FastAPI dependencies as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Request

from app.services import Service


async def get_service(request: Request) -> Service:
    """The service built by the lifespan.

    ``async`` (as every dependency of the app): FastAPI runs a plain function in a
    worker thread, a hand-off to another thread and back on every request.
    """
    return cast(Service, request.state.service)


ServiceDep = Annotated[Service, Depends(get_service)]
