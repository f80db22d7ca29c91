"""The opaque cursor of document listings: the last ``seq`` a page returned.

Documents are listed in ``seq`` order (SQLite ``AUTOINCREMENT``, never reused), so a
cursor is a position that later writes cannot move. It is base64 of ``v1:SEQ`` to
keep clients from building or doing arithmetic on it, and versioned so its form can
change; anything else is refused as a 422, never read as "from the start".
"""

from __future__ import annotations

import base64
import binascii

from app.exceptions import InvalidRequestError

_PREFIX = "v1:"
_MAX_POSITION = 2**63 - 1


def encode_cursor(seq: int) -> str:
    """The cursor that continues after ``seq``."""
    return base64.urlsafe_b64encode(f"{_PREFIX}{seq}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The ``seq`` a cursor continues after (``InvalidRequestError`` if it is not one)."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        text = base64.urlsafe_b64decode(padded.encode("ascii")).decode("ascii")
    except (binascii.Error, UnicodeError, ValueError):
        text = ""
    number = text.removeprefix(_PREFIX)
    # SQLite integers are 64-bit: a larger position is no cursor (a 422, not a 500).
    if (
        not text.startswith(_PREFIX)
        or not number.isdigit()
        or len(number) > 19
        or int(number) > _MAX_POSITION
    ):
        raise InvalidRequestError(
            "cursor is not one this service returned (pass next_cursor unchanged)",
            field="cursor",
        )
    return int(number)
