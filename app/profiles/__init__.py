"""Shipped default calibration profiles (one JSON file per embedding model).

The maths of a profile is :mod:`calibration.profile`; this package only finds and
reads the files that ship with the service, so search is calibrated before anyone
has judged anything.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from calibration.profile import Profile

__all__ = ["PROFILES_DIR", "default_profile_path", "load_default_profile"]

PROFILES_DIR = Path(__file__).parent


def default_profile_path(model_name: str) -> Path:
    """Where the shipped default profile of a model lives (``app/profiles/``)."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", model_name.rsplit("/", 1)[-1].lower())
    return PROFILES_DIR / f"{slug}.json"


def load_default_profile(model_name: str) -> Profile | None:
    """The shipped default profile of ``model_name``, if there is one."""
    path = default_profile_path(model_name)
    if not path.exists():
        return None
    profile = Profile.from_json(json.loads(path.read_text(encoding="utf-8")))
    return profile if profile.model == model_name else None
