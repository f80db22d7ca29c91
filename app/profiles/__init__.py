"""Shipped default calibration profiles (one JSON file per embedding model).

The maths of a profile is :mod:`calibration.profile`; this package only finds and
reads the files that ship with the service, so search is calibrated before anyone
has judged anything. A profile's maps are fitted to one model's cosines and norms,
so each file records, beside the model's name, the identity of the model files it
was fitted on (``model_id``, see :mod:`app.embedding.identity`) and applies only to
a model of that identity. Any other model — another name, the same name over other
files — gets the **model-agnostic** default (``_agnostic.json``): a prior over
evidence that means the same for every model (list position, lexical evidence, query
length), validated leave-one-model-out (``docs/calibration.md``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibration.profile import Profile

__all__ = [
    "AGNOSTIC_PROFILE",
    "PROFILES_DIR",
    "DefaultProfile",
    "ShippedProfile",
    "agnostic_profile",
    "default_profile_path",
    "external_profile_path",
    "load_default_profile",
    "load_external_profile",
    "shipped_profiles",
]

PROFILES_DIR = Path(__file__).parent
AGNOSTIC_PROFILE = PROFILES_DIR / "_agnostic.json"
"""The model-agnostic default (no model slug starts with ``_``)."""
AGNOSTIC_MODEL = "any"
"""The ``model`` the model-agnostic profile file records."""
EXTERNAL_DIR = PROFILES_DIR / "external"
"""Defaults for candidate lists of other retrievers (``POST /v1/rerank``)."""


@dataclass(frozen=True)
class ShippedProfile:
    """What a shipped profile file says about itself (``GET /version`` lists these)."""

    name: str
    format: int
    model: str
    model_id: str | None

    @classmethod
    def of(cls, data: dict[str, Any]) -> ShippedProfile:
        """The header of a profile file's JSON."""
        model_id = data.get("model_id")
        return cls(
            name=str(data["id"]),
            format=int(data["format"]),
            model=str(data["model"]),
            model_id=None if model_id is None else str(model_id),
        )

    def problem(self, model_name: str, model_id: str) -> str | None:
        """Why this profile does not apply to the serving model (None when it does)."""
        if self.model != model_name:
            return f"the shipped profile {self.name!r} is for model {self.model!r}"
        if self.model_id != model_id:
            return (
                f"the shipped profile {self.name!r} was fitted for model files of "
                f"identity {self.model_id!r}; the files served as {model_name!r} "
                f"have identity {model_id!r} (see GET /version)"
            )
        return None


def default_profile_path(model_name: str) -> Path:
    """Where the shipped default profile of a model lives (``app/profiles/``)."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", model_name.rsplit("/", 1)[-1].lower())
    return PROFILES_DIR / f"{slug}.json"


def external_profile_path(model_name: str) -> Path:
    """Where the shipped default for external candidate lists of a model lives."""
    return EXTERNAL_DIR / default_profile_path(model_name).name


def load_external_profile(model_name: str, model_id: str) -> Profile | str:
    """The shipped default for external candidate lists of the serving model.

    Fitted on candidate lists of simulated retrievers (``scripts/
    fit_rerank_profile.py``), for the files it records only; otherwise the reason
    there is none (rerank then falls back to the search default).
    """
    path = external_profile_path(model_name)
    if not path.exists():
        return f"no profile for external lists ships for model {model_name!r}"
    data = _read(path)
    problem = ShippedProfile.of(data).problem(model_name, model_id)
    return Profile.from_json(data) if problem is None else problem


def shipped_profiles() -> list[ShippedProfile]:
    """Every profile that ships with the service, by file name (external lists' last)."""
    paths = [*sorted(PROFILES_DIR.glob("*.json")), *sorted(EXTERNAL_DIR.glob("*.json"))]
    return [ShippedProfile.of(_read(path)) for path in paths]


@dataclass(frozen=True)
class DefaultProfile:
    """The default profile a server uses, and why it is not the model's own."""

    profile: Profile
    agnostic_because: str | None = None


def load_default_profile(model_name: str, model_id: str) -> DefaultProfile | str:
    """The shipped default profile of the serving model, or why there is none.

    ``model_id`` is the identity of the files served as ``model_name``: the model's
    own profile is used only when both match what it was fitted for; otherwise the
    model-agnostic one, bound to this model (``agnostic_because`` says why). A
    string (why there is no default) only when neither file is there.
    """
    path = default_profile_path(model_name)
    if path.exists():
        data = _read(path)
        problem = ShippedProfile.of(data).problem(model_name, model_id)
        if problem is None:
            return DefaultProfile(Profile.from_json(data))
    else:
        problem = f"no calibration profile ships for model {model_name!r}"
    if not AGNOSTIC_PROFILE.exists():
        return problem
    agnostic = Profile.from_json(_read(AGNOSTIC_PROFILE))
    bound = dataclasses.replace(agnostic, model=model_name, model_id=model_id)
    return DefaultProfile(bound, agnostic_because=problem)


@functools.cache
def _agnostic() -> Profile | None:
    return (
        Profile.from_json(_read(AGNOSTIC_PROFILE))
        if AGNOSTIC_PROFILE.exists()
        else None
    )


def agnostic_profile(model_name: str) -> Profile | None:
    """The model-agnostic default bound to ``model_name`` (None if it is not shipped).

    For collections whose clients bring their own vectors: no model files of the
    server's made them, so the profile records the client's model name only.
    """
    agnostic = _agnostic()
    if agnostic is None:
        return None
    return dataclasses.replace(agnostic, model=model_name, model_id=None)


def _read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data
