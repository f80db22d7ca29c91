"""``GET /v1/key``: which key a request was sent with (its name, role, collections).

A client (the judging page, a deployment check) learns what its key may do before
trying: a judge key judges, but fitting needs write.
"""

from __future__ import annotations

from fastapi import APIRouter

from app.api.auth import READ, KeyDep
from app.api.errors import PROBLEM_RESPONSES
from app.schemas.keys import KeyInfo

router = APIRouter(prefix="/key", tags=["auth"], responses=PROBLEM_RESPONSES)


@router.get("", dependencies=[READ])
def read_key(*, key: KeyDep) -> KeyInfo:
    """The key of this request; without auth, everything is open (admin)."""
    assert key.role is not None  # /v1 is never public
    return KeyInfo(
        auth=key.name is not None,
        name=key.name,
        role=key.role.value,
        collections=None if key.collections is None else sorted(key.collections),
    )
