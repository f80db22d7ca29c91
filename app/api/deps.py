"""FastAPI dependencies as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Request

from app.services import Service


def get_service(request: Request) -> Service:
    """The service built by the lifespan."""
    return cast(Service, request.state.service)


ServiceDep = Annotated[Service, Depends(get_service)]
