from __future__ import annotations

import subprocess
import sys
import types

import pytest

import calibration


def test_all_is_sorted_and_matches_public_names():
    public = {
        name
        for name, value in vars(calibration).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and name != "annotations"
    }
    assert sorted(calibration.__all__, key=lambda s: (not s.isupper(), s)) == list(
        calibration.__all__
    ) or calibration.__all__ == sorted(calibration.__all__)
    assert set(calibration.__all__) == public
    for name in calibration.__all__:
        assert getattr(calibration, name) is not None


@pytest.mark.slow  # starts a Python process
def test_import_does_not_pull_service_dependencies():
    code = (
        "import calibration, sys; "
        "bad = [m for m in ('fastapi', 'torch', 'faiss') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_exceptions_hierarchy():
    from calibration import exceptions as ex

    assert issubclass(ex.InvalidInputError, ValueError)
    assert issubclass(ex.SingleClassError, ex.InsufficientDataError)
    assert issubclass(ex.InsufficientDataError, ex.CalibrationFitError)
    assert issubclass(ex.UnsupportedFormatError, ex.CalibrationError)
    for name in ex.__all__:
        assert issubclass(getattr(ex, name), ex.CalibrationError)
