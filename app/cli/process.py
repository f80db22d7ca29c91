"""Run ``normcal serve`` as a subprocess on a loopback port, and stop it.

Benchmarks and crash tests need the real server in its own process (to load it
over HTTP, to SIGKILL it). The server binds port 0 and writes the port the kernel
gave it to ``--port-file``: nobody guesses a free port (binding one, releasing it
and hoping nobody takes it before the server does is a race).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Protocol

import httpx


class Process(Protocol):
    """What :class:`ServerProcess` needs of a started process (a ``Popen`` has it)."""

    pid: int
    returncode: int | Any

    def poll(self) -> int | None:
        """The exit code if it has exited, else None."""

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, once it exits (``subprocess.TimeoutExpired`` past it)."""

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` if it is still running."""


def wait_for_port_file(path: Path, proc: Process, timeout: float) -> int:
    """The port ``normcal serve --port-file path`` bound (polls until written)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return int(path.read_text())
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        time.sleep(0.05)
    raise TimeoutError("server did not bind its port")


def wait_ready(proc: Process, url: str, deadline: float) -> None:
    """Poll ``url``'s ``/readyz`` until it answers 200 (by ``deadline``, monotonic).

    One client for every poll: each new one builds a TLS context (~35 ms of CPU)
    even for ``http://``, which five polls a second would pay each time. Raises
    ``RuntimeError`` if ``proc`` exits, ``TimeoutError`` past the deadline.
    """
    with httpx.Client(base_url=url, timeout=1) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                if http.get("/readyz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
    raise TimeoutError("server did not become ready")


class ServerProcess:
    """``python -m app.cli serve`` on 127.0.0.1, started and stopped by the caller.

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
        self.proc: Process | None = None
        self._port_file = data_dir.with_name(f"{data_dir.name}.port")

    def start(self, timeout: float = 120.0) -> ServerProcess:
        """Start the server and return once ``/readyz`` answers 200."""
        self._port_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "app.cli", "serve", "--port", "0"]
        cmd += ["--port-file", str(self._port_file), "--data-dir", str(self.data_dir)]
        started = time.monotonic()
        self.proc = self.spawn(cmd)
        self.port = wait_for_port_file(self._port_file, self.proc, timeout)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_ready(self.proc, self.url, started + timeout)
        return self

    def spawn(self, cmd: list[str]) -> Process:
        """Start ``cmd`` (the server) with ``env``, ``log`` and ``nofile``.

        A subclass may start it another way (the test suite forks it from an
        interpreter that has imported the server already: tests/support/zygote.py).
        """
        # preexec_fn only when asked, so a caller's own Popen hook keeps working.
        extra: dict[str, Any] = {"preexec_fn": self._limit_files} if self.nofile else {}
        return subprocess.Popen(
            cmd, env=self.env, stdout=subprocess.DEVNULL, stderr=self.log, **extra
        )

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
