"""``pip install ./clients/python`` in a fresh venv: light, importable, and the README
snippet runs against a live server from there."""

from __future__ import annotations

import re
import subprocess
import venv
from pathlib import Path

import pytest

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"
HEAVY = ("torch", "faiss", "faiss-cpu", "sentence-transformers", "scikit-learn")


def readme_snippet() -> str:
    text = (CLIENT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)[0]


@pytest.mark.slow
def test_fresh_venv_installs_the_light_client_and_runs_the_readme(tmp_path, live):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", str(CLIENT)], check=True, timeout=600)
    frozen = subprocess.run(
        [*pip, "freeze"], check=True, capture_output=True, text=True, timeout=120
    ).stdout.lower()
    installed = {re.split(r"[=@ ]", line)[0] for line in frozen.splitlines()}
    assert "normcal-client" in installed
    assert not installed & set(HEAVY), installed
    subprocess.run([str(python), "-c", "import normcal_client"], check=True, timeout=60)
    snippet = readme_snippet().replace("http://127.0.0.1:8000", live.url)
    out = subprocess.run(
        [str(python), "-c", snippet],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # not the repository: nothing importable by accident
    ).stdout
    assert out.split()[0] == "1"  # the upserted document is the first hit
