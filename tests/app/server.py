"""Run ``normcal serve`` as a real subprocess on a loopback port (for crash tests).

The server binds port 0 and writes the port the kernel gave it to ``--port-file``:
no test ever guesses a free port (binding one, releasing it and hoping nobody
takes it before the server does is a race).
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import httpx

REPO = Path(__file__).resolve().parents[2]
CLIENT_SRC = REPO / "clients" / "python" / "src"


def source_env(**extra: str) -> dict[str, str]:
    """``os.environ`` for a Python subprocess that imports this checkout.

    pytest's ``pythonpath`` setting (which puts ``clients/python/src`` on the path)
    reaches only the test process; a child sees ``normcal_client`` only when the
    venv was installed from this tree. This puts the checkout and the client's
    sources first, so a child imports what the test imports.
    """
    paths = [str(REPO), str(CLIENT_SRC), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), **extra}


@contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port nobody listens on, for as long as the block runs.

    The socket is bound (so nothing else can take the port) but never listens, so
    connecting to it is refused.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def wait_for_port_file(
    path: Path, proc: subprocess.Popen[bytes], timeout: float
) -> int:
    """The port ``normcal serve --port-file path`` bound (polls until written)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return int(path.read_text())
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        time.sleep(0.05)
    raise TimeoutError("server did not bind its port")


class ServerProcess:
    """``python -m app.ops.cli serve`` on 127.0.0.1, started and stopped by the test.

    ``url`` (and ``port``) are set by :meth:`start`; a restart may get another port.
    ``log``, when given, receives the server's stderr (its log); ``nofile`` sets the
    server's (soft, hard) open-file limit.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        env: dict[str, str] | None = None,
        log: IO[bytes] | None = None,
        nofile: tuple[int, int] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = 0
        self.url = ""
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "NORMCAL_LOG_LEVEL": "WARNING"}
        self.env.update(env or {})
        self.log = log
        self.nofile = nofile
        self.proc: subprocess.Popen[bytes] | None = None
        self._port_file = data_dir.with_name(f"{data_dir.name}.port")

    def start(self, timeout: float = 120.0) -> ServerProcess:
        self._port_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "app.ops.cli", "serve", "--port", "0"]
        cmd += ["--port-file", str(self._port_file), "--data-dir", str(self.data_dir)]
        # preexec_fn only when asked, so a caller's own Popen hook keeps working.
        extra = {"preexec_fn": self._limit_files} if self.nofile else {}
        self.proc = subprocess.Popen(
            cmd, env=self.env, stdout=subprocess.DEVNULL, stderr=self.log, **extra
        )
        started = time.monotonic()
        self.port = wait_for_port_file(self._port_file, self.proc, timeout)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError("server did not become ready")

    def _limit_files(self) -> None:
        """In the child, before exec: apply ``nofile``."""
        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, self.nofile)

    def kill(self) -> None:
        """SIGKILL: no shutdown handlers run."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int:
        """SIGTERM and wait: the graceful path."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
        return int(self.proc.returncode)
