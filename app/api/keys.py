"""The API keys a server accepts: ``NORMCAL_API_KEY`` and ``NORMCAL_API_KEYS_FILE``.

The keys file is a JSON list of ``{"name", "key" or "key_sha256", "role",
"collections"?}``. It is configuration, but it is decoded as untrusted data: a
size cap, an entry cap, name and key rules, no unknown or repeated fields, no two
entries with one name or one key. A bad file refuses start-up with one line
(:class:`KeysFileError`); a bad file on :meth:`Keyring.reload` (SIGHUP) keeps the
keys in use and logs why. No message or log line ever holds a key: errors name the
entry and the rule, never the value.

Only SHA-256 digests of the keys are kept in memory. A presented bearer token is
hashed and compared with every digest in constant time (``hmac.compare_digest``,
no early exit), so the time taken says nothing about which key, or how much of one,
matched.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from app.schemas.common import COLLECTION_NAME_PATTERN
from app.schemas.keys import Role

logger = logging.getLogger(__name__)

KEYS_FILE_MAX_BYTES = 1 << 20  # 1 MiB
MAX_KEYS = 1000  # entries of the file
MAX_KEY_COLLECTIONS = 1000  # collections of one entry
KEY_MIN_CHARS = 16
KEY_MAX_CHARS = 256
KEY_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
KEY_PATTERN = r"^[\x21-\x7e]+$"  # printable ASCII without spaces: an HTTP header's
SHA256_PATTERN = r"^[0-9a-fA-F]{64}$"
ENV_KEY_NAME = "NORMCAL_API_KEY"
_SHOWN_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")  # a field name, not a key
_SHOWN_NAME = re.compile(KEY_NAME_PATTERN.strip("^$"))


class KeysFileError(Exception):
    """The keys file cannot be used: one line naming the entry and the rule."""


@dataclass(frozen=True)
class Identity:
    """Who a request is: a key's name, role and collections.

    ``role`` is ``None`` for an anonymous request on a public path; ``collections``
    ``None`` means every collection.
    """

    name: str | None
    role: Role | None
    collections: frozenset[str] | None = None

    def sees(self, collection: str) -> bool:
        """Whether this key may see and touch ``collection``."""
        return self.collections is None or collection in self.collections


OPEN = Identity(name=None, role=Role.ADMIN)  # no key set: everything is open
ANONYMOUS = Identity(name=None, role=None, collections=frozenset())


class KeyEntry(BaseModel):
    """One entry of the keys file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=KEY_NAME_PATTERN)
    key: str | None = Field(
        None, min_length=KEY_MIN_CHARS, max_length=KEY_MAX_CHARS, pattern=KEY_PATTERN
    )
    key_sha256: str | None = Field(None, pattern=SHA256_PATTERN)
    role: Role
    collections: (
        Annotated[
            list[Annotated[str, Field(pattern=COLLECTION_NAME_PATTERN)]],
            Field(min_length=1, max_length=MAX_KEY_COLLECTIONS),
        ]
        | None
    ) = None

    @model_validator(mode="after")
    def _one_key(self) -> KeyEntry:
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError("give exactly one of key and key_sha256")
        return self

    def digest(self) -> bytes:
        """The SHA-256 of the key."""
        if self.key_sha256 is not None:
            return bytes.fromhex(self.key_sha256)
        assert self.key is not None
        return hashlib.sha256(self.key.encode()).digest()


_ENTRIES = TypeAdapter(
    Annotated[list[KeyEntry], Field(max_length=MAX_KEYS)],
)


@dataclass(frozen=True)
class ApiKey:
    """A key as the server keeps it: its digest and who it is."""

    digest: bytes
    identity: Identity


def _no_repeated_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused if it names a field twice (which one would count?)."""
    names = Counter(name for name, _ in pairs)
    for name, count in names.items():
        if count > 1:
            raise ValueError(f"{_field(name)} appears twice in one object")
    return dict(pairs)


def _field(name: object) -> str:
    """A field name as an error shows it: a key pasted as a field name is not shown."""
    text = str(name)
    return f"field {text}" if _SHOWN_FIELD.fullmatch(text) else "a field"


# What a pattern means, said in place of the pattern itself.
_PATTERN_RULES = {
    "name": "letters, digits, '.', '_' and '-', at most 64, first a letter or digit",
    "key": "printable ASCII without spaces (it is sent in an HTTP header)",
    "key_sha256": "64 hex digits (the key's SHA-256, as sha256sum prints it)",
    "collections": "a collection name (letters, digits, '_' and '-', at most 64)",
}


def _problem(raw: list[Any], error: dict[str, Any]) -> str:
    """``entry 3 ('annotator'), field role: <rule>`` for one validation error."""
    loc = tuple(error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    if not loc:
        return f"the list: {message}"
    where = f"entry {int(loc[0]) + 1}"
    entry = raw[int(loc[0])]
    name = entry.get("name") if isinstance(entry, dict) else None
    if isinstance(name, str) and _SHOWN_NAME.fullmatch(name):
        where += f" ({name!r})"
    if len(loc) > 1:
        where += f", {_field(loc[1])}" + (f"[{loc[2]}]" if len(loc) > 2 else "")
    if error["type"] == "extra_forbidden":
        message = (
            "unknown (only name, key, key_sha256, role and collections; a typo "
            "must not silently change what a key may do)"
        )
    elif error["type"] == "string_pattern_mismatch":
        message = f"must be {_PATTERN_RULES.get(str(loc[1]), 'valid')}"
    return f"{where}: {message}"


def parse_keys(data: bytes) -> list[KeyEntry]:
    """The entries of a keys file's bytes, or a :class:`KeysFileError`."""
    if len(data) > KEYS_FILE_MAX_BYTES:
        raise KeysFileError(f"larger than {KEYS_FILE_MAX_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise KeysFileError("not UTF-8 text") from None
    try:
        raw = json.loads(text, object_pairs_hook=_no_repeated_fields)
    except json.JSONDecodeError as error:
        raise KeysFileError(
            f"not JSON: {error.msg} at line {error.lineno} column {error.colno}"
        ) from None
    except (ValueError, RecursionError) as error:
        raise KeysFileError(f"not usable JSON: {error}") from None
    if not isinstance(raw, list):
        raise KeysFileError(
            'must be a JSON list of keys, [{"name": ..., "key": ..., "role": ...}]'
        )
    try:
        entries = _ENTRIES.validate_python(raw)
    except ValidationError as error:
        problems = error.errors(include_input=False, include_url=False)
        line = _problem(raw, dict(problems[0]))
        if len(problems) > 1:
            line += f" (and {len(problems) - 1} more)"
        raise KeysFileError(line) from None
    names = Counter(entry.name for entry in entries)
    for name, count in names.items():
        if count > 1:
            raise KeysFileError(f"the name {name!r} is given to {count} entries")
    digests: dict[bytes, str] = {}
    for entry in entries:
        other = digests.setdefault(entry.digest(), entry.name)
        if other != entry.name:
            raise KeysFileError(
                f"entries {other!r} and {entry.name!r} hold the same key"
            )
    return entries


def read_keys_file(path: Path) -> list[KeyEntry]:
    """The entries of the keys file at ``path`` (read at most one byte past the cap)."""
    try:
        with path.open("rb") as file:
            data = file.read(KEYS_FILE_MAX_BYTES + 1)
    except OSError as error:
        raise KeysFileError(f"cannot be read ({error.strerror})") from None
    return parse_keys(data)


def _api_key(entry: KeyEntry) -> ApiKey:
    collections = None if entry.collections is None else frozenset(entry.collections)
    return ApiKey(entry.digest(), Identity(entry.name, entry.role, collections))


def bearer_token(header: bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header, else ``None``."""
    if header is None:
        return None
    scheme, _, token = header.partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    return token.strip() or None


class Keyring:
    """The keys a server accepts, and who each one is.

    ``api_key`` (``NORMCAL_API_KEY``) is one admin key for every collection, named
    ``NORMCAL_API_KEY``; ``path`` (``NORMCAL_API_KEYS_FILE``) lists more, and
    :meth:`reload` re-reads it. With both, both are accepted (the file may not
    repeat the environment's key). With neither, :attr:`enabled` is false and
    everything is open.
    """

    def __init__(self, *, api_key: SecretStr | None, path: Path | None) -> None:
        self.path = path
        self._fixed: tuple[ApiKey, ...] = ()
        if api_key is not None:
            digest = hashlib.sha256(api_key.get_secret_value().encode()).digest()
            identity = Identity(ENV_KEY_NAME, Role.ADMIN)
            self._fixed = (ApiKey(digest, identity),)
        self._keys = self._load()

    @property
    def enabled(self) -> bool:
        """Whether requests need a key."""
        return bool(self._fixed) or self.path is not None

    def _load(self) -> tuple[ApiKey, ...]:
        """The fixed key and the file's (a :class:`KeysFileError` if it is bad)."""
        if self.path is None:
            return self._fixed
        entries = read_keys_file(self.path)
        fixed = {key.digest for key in self._fixed}
        for entry in entries:
            if entry.digest() in fixed:
                raise KeysFileError(
                    f"entry {entry.name!r} holds the key of {ENV_KEY_NAME}: give "
                    "each key one entry"
                )
        if any(entry.key is not None for entry in entries):
            self._warn_if_readable(self.path)
        if not entries and not self._fixed:
            logger.warning(
                "%s lists no key: every request but the public paths gets a 401",
                self.path,
            )
        return self._fixed + tuple(_api_key(entry) for entry in entries)

    @staticmethod
    def _warn_if_readable(path: Path) -> None:
        try:
            mode = path.stat().st_mode & 0o777
        except OSError:
            return
        if mode & 0o077:
            logger.warning(
                "%s holds plain keys and is readable by others (mode %o): chmod 600 "
                "it, or list key_sha256 instead of key",
                path,
                mode,
            )

    def authenticate(self, header: bytes | None) -> Identity | None:
        """The identity of an ``Authorization`` header's key; ``None`` if none matches.

        Every key is compared (constant time each, no early exit).
        """
        token = bearer_token(header)
        if token is None:
            return None
        digest = hashlib.sha256(token).digest()
        found = None
        for key in self._keys:  # one read of the tuple: a reload swaps it whole
            if hmac.compare_digest(digest, key.digest):
                found = key.identity
        return found

    def reload(self) -> bool:
        """Re-read the keys file; on any error keep the keys in use and log why."""
        if self.path is None:
            logger.warning("SIGHUP: no NORMCAL_API_KEYS_FILE to reload")
            return False
        try:
            keys = self._load()
        except KeysFileError as error:
            logger.error(
                "kept the api keys in use: %s: %s (fix it and send SIGHUP again)",
                self.path,
                error,
            )
            return False
        before = {key.identity.name for key in self._keys}
        self._keys = keys
        after = {key.identity.name for key in keys}
        logger.info(
            "api keys reloaded: %s; added %s; removed %s",
            self.summary(),
            ", ".join(sorted(n for n in after - before if n)) or "none",
            ", ".join(sorted(n for n in before - after if n)) or "none",
        )
        return True

    def summary(self) -> str:
        """How many keys of each role (no names, no keys)."""
        if not self.enabled:
            return "none set: every request is served without a key"
        roles = Counter(key.identity.role for key in self._keys)
        counts = ", ".join(f"{roles[r]} {r}" for r in Role if roles[r])
        return f"{len(self._keys)} ({counts or 'no key'})"
