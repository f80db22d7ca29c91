"""The profile schema (``Profile.from_json``) and the trial over the feature space."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calibration import io
from calibration.exceptions import UnsupportedFormatError
from calibration.models import (
    IsotonicCalibrator,
    ListAwareCalibrator,
    NormTemperedCalibrator,
    PlattCalibrator,
)
from calibration.profile import (
    MAX_CREATED_AT,
    MAX_NAME_CHARS,
    Profile,
    trial_scores,
)

DEFAULT = Path(__file__).resolve().parents[2] / "app/profiles/all-minilm-l6-v2.json"
MAX_RANK = 100


@pytest.fixture(scope="module")
def base() -> dict[str, Any]:
    return dict(json.loads(DEFAULT.read_text(encoding="utf-8")))


def _with(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    out.update(changes)
    return out


def _refused(data: Any, field: str | None, rule: str) -> None:
    with pytest.raises(UnsupportedFormatError) as info:
        trial_scores(Profile.from_json(data), max_rank=MAX_RANK)
    assert info.value.field == field
    assert rule in str(info.value)


def test_the_shipped_default_decodes_and_passes_the_trial(base):
    profile = Profile.from_json(base)
    trial_scores(profile, max_rank=MAX_RANK)
    text = json.dumps(profile.to_json())
    assert json.dumps(Profile.from_json(json.loads(text)).to_json()) == text


def test_created_at_at_the_bound_and_one_past(base):
    assert Profile.from_json(_with(base, created_at=MAX_CREATED_AT)).created_at > 0
    past = math.nextafter(MAX_CREATED_AT, math.inf)
    _refused(_with(base, created_at=past), "created_at", "must be a number in")
    _refused(_with(base, created_at=10**400), "created_at", "must be a number in")
    _refused(_with(base, created_at=-1), "created_at", "must be a number in")
    _refused(_with(base, created_at=True), "created_at", "must be a number in")


def test_names_at_the_bound_and_one_past(base):
    assert Profile.from_json(_with(base, id="x" * MAX_NAME_CHARS)).id
    _refused(_with(base, id="x" * (MAX_NAME_CHARS + 1)), "id", "1 to 256 characters")
    _refused(_with(base, model=["m"]), "model", "must be a string")


@pytest.mark.parametrize(
    ("changes", "field", "rule"),
    [
        ({"format": "3"}, "format", "is not supported"),
        ({"format": 9}, "format", "is not supported"),
        ({"confidence_weight": 1.0000001}, "confidence_weight", "in [0, 1]"),
        ({"default": "yes"}, "default", "must be true or false"),
        ({"report": "r"}, "report", "must be a JSON object"),
    ],
)
def test_top_level_fields_are_typed(base, changes, field, rule):
    _refused(_with(base, **changes), field, rule)


def test_each_slot_holds_its_class(base):
    data = _with(base, doc_ref=copy.deepcopy(base["estimator"]))
    _refused(data, "doc_ref.class", "must be NormReference")
    data = _with(base, estimator=copy.deepcopy(base["query_ref"]))
    _refused(data, "estimator.class", "must be PlattCalibrator or")


def test_an_untyped_format_1_report_is_checked_too(base):
    report = Profile.from_json(base).report.to_jsonable()
    report["reliability"]["counts"] = "abc"
    _refused(_with(base, report=report), "report", "not a readable untyped")
    report["reliability"]["counts"] = [1] * 16
    report["reliability"]["mean_predicted"] = [0.5] * 16
    report["reliability"]["observed_frequency"] = [0.5] * 16
    _refused(_with(base, report=report), "report.reliability.mean_predicted", "15")


def _isotonic(base: dict[str, Any], x: list[Any], y: list[Any]) -> dict[str, Any]:
    def arr(v: list[Any]) -> dict[str, Any]:
        return {"__ndarray__": v, "dtype": "float64", "shape": [len(v)]}

    estimator = {
        "format_version": 1,
        "class": "IsotonicCalibrator",
        "params": {"eps": 1e-4},
        "state": {
            "x_thresholds_": arr(x),
            "y_thresholds_": arr(y),
            "n_features_in_": 10,
        },
    }
    return _with(base, method="isotonic", estimator=estimator)


def test_the_trial_refuses_maps_out_of_range_anywhere_in_cosine(base):
    x = [-1.0, 0.5, 0.55, 0.56, 1.0]
    trial_scores(
        Profile.from_json(_isotonic(base, x, [0, 0.2, 0.4, 0.6, 1])), max_rank=1
    )
    for y in ([0, 0.2, 0.4, 5.0, 5.0], [-0.1, 0.2, 0.4, 0.6, 0.9]):
        _refused(_isotonic(base, x, y), "estimator", "over the trial grid")
    # A spike between two points of the fine sweep: the map's own knots are scored.
    spike = _isotonic(base, [-1.0, 0.5501, 0.5502, 0.5503, 1.0], [0, 0.1, 7.0, 0.2, 1])
    _refused(spike, "estimator", "over the trial grid")


def test_the_trial_refuses_an_estimator_that_cannot_score(base):
    data = copy.deepcopy(base)
    data["estimator"]["state"]["coef_"] = {
        "__ndarray__": [1.0, 2.0],
        "dtype": "float64",
        "shape": [2],
    }
    _refused(data, "estimator", "over the trial grid")
    data = copy.deepcopy(base)
    data["query_ref"]["state"]["residual_sd_"] = "wide"
    _refused(data, "query_ref", "finite features")


def test_the_trial_covers_large_ranks(base):
    """A rank slope harmless at rank 1 that overflows at max_rank is refused."""
    data = copy.deepcopy(base)
    prior = data["estimator"]["params"]["prior"]["__dict__"]
    fields = dict(prior)["fields"]["__dict__"]
    scale = next(v for k, v in fields if k == "scale")["__tuple__"]
    scale[1] = (
        0.0  # rank standardised by a zero scale: inf at every rank but the centre
    )
    profile = Profile.from_json(data)
    with pytest.raises(UnsupportedFormatError, match="over the trial grid"):
        trial_scores(profile, max_rank=MAX_RANK)
    assert np.isfinite(profile.estimator.coef_).all()


@pytest.mark.parametrize(
    "estimator",
    [
        PlattCalibrator(),
        IsotonicCalibrator(),
        NormTemperedCalibrator(),
        NormTemperedCalibrator(prior_width="none", query_side_only=True),
        ListAwareCalibrator(),
        ListAwareCalibrator(use_lexical=True),
    ],
    ids=repr,
)
def test_every_fitted_family_passes_the_trial(base, list_world, estimator):
    d = list_world
    estimator.fit(d.X, d.y, d.groups)
    data = _with(base, estimator=io.to_dict(estimator), method="fitted")
    profile = Profile.from_json(json.loads(json.dumps(data)))
    trial_scores(profile, max_rank=1000)
