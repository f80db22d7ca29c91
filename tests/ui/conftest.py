"""Fixtures of the app tests that drive a real browser."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


@pytest.fixture(scope="session")
def chromium() -> str:
    """Path of chromium, installed from Debian's packages when absent (root only)."""
    found = shutil.which("chromium")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"],
            check=False,
            env=env,
            timeout=900,
        )
        found = shutil.which("chromium")
    if found is None:
        pytest.skip("chromium is not installed and could not be installed here")
    return found
