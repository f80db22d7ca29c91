"""API key roles, and ``GET /v1/key``'s answer (which key a request was sent with)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args

from pydantic import BaseModel, Field


class Role(StrEnum):
    """What a key may do; each role may do everything of the roles before it.

    *read*: search, get, list, export, reports; *judge*: feedback and the judging
    loop; *write*: documents, fits and activation; *admin*: everything (collections,
    snapshots and restores, imports, query-log settings).
    """

    READ = "read"
    JUDGE = "judge"
    WRITE = "write"
    ADMIN = "admin"

    def allows(self, needed: Role) -> bool:
        """Whether a key with this role may do what ``needed`` allows."""
        ranks = {role: rank for rank, role in enumerate(Role)}
        return ranks[self] >= ranks[needed]


RoleName = Literal["read", "judge", "write", "admin"]  # inline in OpenAPI, for clients
assert get_args(RoleName) == tuple(Role)


class KeyInfo(BaseModel):
    """The key this request was sent with: its name, role and collections."""

    auth: bool = Field(
        description="false when the server sets no key (everything is open: admin)"
    )
    name: str | None = Field(
        description="the key's name in NORMCAL_API_KEYS_FILE, NORMCAL_API_KEY for "
        "that key, null without auth"
    )
    role: RoleName
    collections: list[str] | None = Field(
        description="the only collections the key sees; null: every collection"
    )
