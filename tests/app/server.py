"""Run ``normcal serve`` as a real subprocess on a loopback port (for crash tests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``python -m app.cli serve`` on 127.0.0.1, started and stopped by the test."""

    def __init__(self, data_dir: Path, *, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "NORMCAL_LOG_LEVEL": "WARNING"}
        self.env.update(env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> ServerProcess:
        cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port)]
        cmd += ["--data-dir", str(self.data_dir)]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
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
