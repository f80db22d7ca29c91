"""Issue 21, defects 6-9: calibrator import is no longer an open door.

One real ``normcal serve`` (real model, real SQLite) for the module. The base of every
attack is a valid profile exported through the API (the shipped default of the
model); each attack mutates one field of it and imports it with ``activate: true``.
Each is refused with a 422 problem+json naming the field and the rule, and nothing
changed: the calibrator list, the active calibrator, and a search's top hit and its
probability.
"""

from __future__ import annotations

import copy
import json
import sqlite3
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from calibration.metrics import BINNING
from tests.conftest import assert_problem
from tests.support.corpus import CORPUS, QUERIES
from tests.support.server import ServerProcess

pytestmark = pytest.mark.server

KB = "/v1/collections/kb"
DOCS = [{"id": k, "text": v, "metadata": {}} for k, v in CORPUS.items()]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """``(client, data_dir)`` of a server with the collection ``kb``."""
    data = tmp_path_factory.mktemp("profiles") / "data"
    server = ServerProcess(data).start()
    try:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            assert client.post("/v1/collections", json={"name": "kb"}).is_success
            r = client.put(f"{KB}/documents", json={"documents": DOCS})
            assert r.status_code == 200, r.text
            yield client, data
    finally:
        server.stop()


@pytest.fixture(scope="module")
def base(served: tuple[httpx.Client, Any]) -> dict[str, Any]:
    """A valid exported profile: the shipped default, through the export endpoint."""
    client, _ = served
    listed = client.get(f"{KB}/calibrators").json()["data"]
    default = next(c for c in listed if c["default"])
    r = client.get(f"{KB}/calibrators/{default['id']}/export")
    assert r.status_code == 200, r.text
    return dict(r.json())


def _state(client: httpx.Client) -> tuple[list[str], list[str], str, float]:
    """Calibrator ids, the active one(s), the top hit of a search and its probability."""
    r = client.get(f"{KB}/calibrators")
    assert r.status_code == 200, r.text
    listed = r.json()["data"]
    s = client.post(f"{KB}/search", json={"query": QUERIES["paris"], "k": 3})
    assert s.status_code == 200, s.text
    top = s.json()["hits"][0]
    return (
        [c["id"] for c in listed],
        [c["id"] for c in listed if c["active"]],
        top["id"],
        top["probability"],
    )


def _refused(
    client: httpx.Client, profile: dict[str, Any] | str, field: str, rule: str
) -> dict[str, Any]:
    """Import ``profile`` (activating it); assert a 422 naming ``field`` and ``rule``,
    no exception text, and that nothing changed."""
    before = _state(client)
    if isinstance(profile, str):  # raw JSON text (numbers Python would not write)
        body = '{"activate": true, "profile": ' + profile + "}"
        r = client.post(
            f"{KB}/calibrators/import",
            content=body.encode(),
            headers={"content-type": "application/json"},
        )
    else:
        r = client.post(
            f"{KB}/calibrators/import", json={"profile": profile, "activate": True}
        )
    problem = assert_problem(r, 422)
    assert [e["loc"] for e in problem["errors"]] == [field.split(".")], problem
    assert rule in problem["detail"], problem
    for leak in ("Traceback", "Error:", "numpy", "object has no attribute"):
        assert leak not in problem["detail"], problem
    assert _state(client) == before
    return problem


def _set(profile: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``profile`` with the value at dotted ``path`` replaced."""
    out = copy.deepcopy(profile)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[key]
    node[last] = value
    return out


def _array(values: list[Any], dtype: str = "float64") -> dict[str, Any]:
    return {"__ndarray__": values, "dtype": dtype, "shape": [len(values)]}


def test_defect_6_array_dtypes_are_whitelisted_before_any_allocation(served, base):
    client, _ = served
    coef = "estimator.state.coef_"
    for dtype in ("S1000000000", "(1000000000,)f8", "object", "<U1000000000"):
        attack = _set(base, f"{coef}.dtype", dtype)
        _refused(client, attack, f"profile.{coef}.dtype", "float64, int64, bool")
    # A shape that does not match the values, or more dimensions than any state has.
    _refused(
        client,
        _set(base, f"{coef}.shape", [10**9]),
        f"profile.{coef}.shape",
        "at most 2 integers in [0, 65536]",
    )
    # Values of the wrong kind for the dtype named.
    _refused(
        client,
        _set(base, coef, _array(["x"] * 8)),
        f"profile.{coef}",
        "float64 arrays hold numbers",
    )


def test_defect_7_reliability_curve_is_its_bins_and_the_png_is_cheap(served, base):
    client, _ = served
    curve = "report.fields.reliability.fields"
    n = BINNING.n_bins
    for points, rule in ((n + 1, f"at most {n} bins"), (150_000, "at most 65536")):
        attack = copy.deepcopy(base)
        fields = attack["report"]["fields"]["reliability"]["fields"]
        fields["mean_predicted"] = _array([0.5] * points)
        fields["observed_frequency"] = _array([0.5] * points)
        fields["counts"] = _array([1] * points, "int64")
        _refused(client, attack, f"profile.{curve}.mean_predicted", rule)
    # The default's diagram (15 bins) is drawn, and drawn again from the cache.
    default = next(c for c in client.get(f"{KB}/calibrators").json()["data"])
    url = f"{KB}/calibrators/{default['id']}/reliability.png"
    first, second = client.get(url), client.get(url)
    assert first.status_code == second.status_code == 200
    assert first.content.startswith(b"\x89PNG") and first.content == second.content


@pytest.mark.parametrize(
    ("path", "value", "rule"),
    [
        ("report.fields.abstain", "zzz", "must be AbstainPolicy or null"),
        ("report.fields.n_pairs", {"__tuple__": [1, 2]}, "must be an integer"),
        ("report.fields.n_queries", -3, "must be >= 0"),
        ("report.fields.k", 1.5, "must be an integer"),
        ("report.fields.reliability.fields.counts", "abc", "dtype int64"),
        ("report.fields.notes", ["raw", "list"], "wrapped"),
        ("created_at", 1e300, "must be a number in"),
        ("id", 7, "must be a string"),
        ("method", "x" * 300, "1 to 256 characters"),
        ("confidence_weight", 2.0, "must be a number in [0, 1]"),
    ],
)
def test_defect_8_every_report_field_is_typed(served, base, path, value, rule):
    client, _ = served
    _refused(client, _set(base, path, value), f"profile.{path}", rule)


def test_defect_8_int_cv_keys_and_huge_numbers_are_refused(served, base):
    client, _ = served
    attack = copy.deepcopy(base)
    attack["report"]["fields"]["cv"]["__dict__"][0][0] = 7
    _refused(client, attack, "profile.report.fields.cv", "keys must be strings")
    # 10**400 as raw JSON: an integer no float holds.
    text = json.dumps(base).replace(
        f'"created_at": {json.dumps(base["created_at"])}', '"created_at": ' + "9" * 400
    )
    assert "9" * 400 in text
    _refused(client, text, "profile.created_at", "must be a number in")


def test_defect_8_a_bad_stored_active_profile_breaks_nothing_across_restarts(
    tmp_path, base
):
    """A profile stored (and activated) before imports were checked: after a restart
    search serves the default, which the list says is active; the list shows the
    bad one as a summary (read without decoding it) that can be deleted once another
    is active; nothing is quarantined."""
    server = ServerProcess(tmp_path / "data").start()
    try:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            assert client.post("/v1/collections", json={"name": "kb"}).is_success
            r = client.put(f"{KB}/documents", json={"documents": DOCS})
            assert r.status_code == 200, r.text
            default_ids, _, top, probability = _state(client)
            good = client.post(
                f"{KB}/calibrators/import", json={"profile": base, "activate": True}
            )
            assert good.status_code == 201, good.text
            bad_id = good.json()["id"]
    finally:
        server.stop()
    # What the old decoder let through, written where an old server stored it.
    stored = _set(base, "report.fields.reliability.fields.counts", "abc")
    stored = _set(stored, "report.fields.abstain", "zzz")
    with sqlite3.connect(tmp_path / "data" / "kb.sqlite3") as conn:
        changed = conn.execute(
            "UPDATE calibrators SET profile = ? WHERE id = ?",
            (json.dumps({**stored, "id": bad_id}), bad_id),
        ).rowcount
    assert changed == 1
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            # The default serves again, so a search is as before.
            assert _state(client) == (
                [*default_ids, bad_id],
                default_ids,
                top,
                probability,
            )
            one = client.get(f"{KB}/calibrators/{bad_id}")
            assert assert_problem(one, 422)["errors"][0]["loc"][-1] == "counts"
            assert client.get(f"{KB}/calibrators/{bad_id}/reliability.png").is_error
            # Another import still works and activates.
            again = client.post(
                f"{KB}/calibrators/import", json={"profile": base, "activate": True}
            )
            assert again.status_code == 201 and again.json()["active"], again.text
            gone = client.delete(f"{KB}/calibrators/{bad_id}")
            assert gone.status_code == 204, gone.text
            assert client.get("/readyz").status_code == 200
    finally:
        server.stop()


def _isotonic(base: dict[str, Any], y: list[Any]) -> dict[str, Any]:
    attack = copy.deepcopy(base)
    attack["method"] = "isotonic"
    attack["estimator"] = {
        "format_version": 1,
        "class": "IsotonicCalibrator",
        "params": {"eps": 1e-4},
        "state": {
            "x_thresholds_": _array([-1.0, 0.3, 0.55, 0.56, 1.0]),
            "y_thresholds_": _array(y),
            "n_features_in_": 10,
        },
    }
    return attack


def test_defect_9_maps_are_scored_over_the_feature_space(served, base):
    client, _ = served
    nan = {"__float__": "nan"}
    _refused(
        client,
        _isotonic(base, [0.01, 0.1, 0.3, nan, nan]),
        "profile.estimator.state.y_thresholds_",
        "never NaN",
    )
    for y in ([0.01, 0.1, 0.3, 5.0, 5.0], [0.01, 0.1, 0.3, -0.5, 0.9]):
        _refused(
            client,
            _isotonic(base, y),
            "profile.estimator",
            "finite probabilities in [0, 1] over the trial grid",
        )
    # A slope that overflows nothing but a list model's rank term would: NaN coef.
    _refused(
        client,
        _set(base, "estimator.state.coef_.__ndarray__", [nan] * 8),
        "profile.estimator.state.coef_",
        "never NaN",
    )
    # The same map with probabilities in [0, 1] is imported, served and activated.
    ok = client.post(
        f"{KB}/calibrators/import",
        json={"profile": _isotonic(base, [0.01, 0.1, 0.3, 0.6, 0.9]), "activate": True},
    )
    assert ok.status_code == 201, ok.text
    assert ok.json()["active"] is True
    _, active, _, probability = _state(client)
    assert active == [ok.json()["id"]] and 0.0 <= probability <= 1.0
