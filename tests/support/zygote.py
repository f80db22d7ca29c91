"""Start test servers by forking an interpreter that has imported them already.

A ``normcal serve`` start costs ~14 s of CPU here, ~10 s of it importing torch,
transformers, sentence-transformers and scikit-learn; the suite starts the server ~70
times. Each test worker keeps a *zygote*: a child interpreter that imports those once,
then forks one child per server start. The child is a real process (its own pid,
signals, limits, descriptors, exit status) running the real ``python -m app.cli``;
only the imports are done before the fork. Model loading, tracing and every start-up
check still run in the child, as in a fresh interpreter.

Only ``NORMCAL_*`` settings (and pytest's ``PYTEST_CURRENT_TEST``) may differ
between the zygote's environment and a server's: they are read at run time. A server whose other variables differ (another
``PYTHONPATH``, say) gets a zygote of its own environment. The zygote refuses to fork
if its imports started a Python thread (a forked child keeps only the forking thread;
the native pools they start, OpenBLAS's and pyarrow's jemalloc's, handle a fork
themselves); :func:`spawn` then returns ``None`` and the caller starts the server
the product's way (a fresh interpreter), as it does where Linux's pidfds are missing.

Protocol, over a ``SOCK_SEQPACKET`` socket pair: ``{"spawn": argv, "env", "cwd",
"nofile"}`` with stdin, stdout and stderr attached (``SCM_RIGHTS``) answers
``{"pid": n}``; ``{"reap": pid}`` (once the pid's pidfd says it exited) answers
``{"status": wait status}``. EOF ends the zygote.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import resource
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
import weakref
from collections.abc import Mapping
from typing import IO, Any

# What ``python -m app.cli serve`` imports on its way to serving, heaviest first.
PRELOAD = (
    "torch",
    "sentence_transformers",
    "transformers.models.bert.modeling_bert",
    "app.cli.main",
    "app.api.app",
    "app.api.lifespan",
    "app.embedding.torch_backend",
    "app.embedding.onnx_backend",
    "app.collections.milvus",
)
_MESSAGE = 1 << 16


# Read at run time, never by an import: they may differ between a zygote and a server.
RUN_TIME = ("NORMCAL_", "PYTEST_CURRENT_TEST")


def _same_interpreter(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables a zygote's imports may have read."""
    return tuple(sorted((k, v) for k, v in env.items() if not k.startswith(RUN_TIME)))


class ForkedProcess:
    """A server forked by a zygote: ``Popen``'s ``poll``/``wait``/``send_signal``.

    Exit is seen on a pidfd (readable once the process has exited); the status comes
    from the zygote, its parent, which reaps it only then, so the pid cannot be
    reused while this object may still signal it.
    """

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._zygote = zygote
        self._pidfd = os.pidfd_open(pid)
        # Closed once reaped, or when this object goes unreaped (a test that never
        # waited for its server kept the descriptor until its worker exited).
        self._close_pidfd = weakref.finalize(self, os.close, self._pidfd)

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._pidfd], [], [], 0)[0]:
            self._reap()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            self._reap()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            signal.pidfd_send_signal(self._pidfd, sig)

    def _reap(self) -> None:
        status = self._zygote.ask({"reap": self.pid})["status"]
        self.returncode = os.waitstatus_to_exitcode(status)
        self._close_pidfd()


class Zygote:
    """One zygote interpreter (started by the constructor, ended at exit)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cmd = [sys.executable, "-m", "tests.support.zygote", str(theirs.fileno())]
        self._proc = subprocess.Popen(cmd, env=dict(env), pass_fds=[theirs.fileno()])
        theirs.close()
        self._sock = ours
        self._lock = threading.Lock()
        self.ready = self.ask({"hello": True})["ready"]
        atexit.register(self.close)

    def ask(self, message: dict[str, Any], fds: list[int] | None = None) -> Any:
        with self._lock:
            socket.send_fds(self._sock, [json.dumps(message).encode()], fds or [])
            answer = self._sock.recv(_MESSAGE)
        if not answer:
            raise RuntimeError("the test zygote exited")
        return json.loads(answer)

    def spawn(
        self,
        argv: list[str],
        env: Mapping[str, str],
        stderr: IO[bytes] | None,
        nofile: tuple[int, int] | None,
        stdout: IO[bytes] | None = None,
    ) -> ForkedProcess:
        with open(os.devnull, "rb") as null_in, open(os.devnull, "wb") as null_out:
            fds = [null_in.fileno(), (stdout or null_out).fileno()]
            fds.append(stderr.fileno() if stderr is not None else sys.stderr.fileno())
            message = {
                "spawn": argv,
                "env": dict(env),
                "cwd": os.getcwd(),
                "nofile": nofile,
            }
            answer = self.ask(message, fds)
        return ForkedProcess(self, answer["pid"])

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(30)


_zygotes: dict[tuple[tuple[str, str], ...], Zygote | None] = {}


def spawn(
    cmd: list[str],
    env: Mapping[str, str],
    stderr: IO[bytes] | None,
    nofile: tuple[int, int] | None,
    stdout: IO[bytes] | None = None,
) -> ForkedProcess | None:
    """``cmd`` (``python -m app.cli ...``) forked from a zygote of ``env``'s
    interpreter, or ``None`` where none can fork it (the caller starts it itself).
    Its stdin is ``/dev/null``, its stdout ``stdout`` (default ``/dev/null``)."""
    if cmd[1:3] != ["-m", "app.cli"] or not hasattr(os, "pidfd_open"):
        return None
    key = _same_interpreter(env)
    if key not in _zygotes:
        zygote = Zygote(env)
        if not zygote.ready:
            zygote.close()
        _zygotes[key] = zygote if zygote.ready else None
    zygote = _zygotes[key]
    return (
        None if zygote is None else zygote.spawn(cmd[3:], env, stderr, nofile, stdout)
    )


# -- the zygote's side ---------------------------------------------------------------
def _child(message: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become ``python -m app.cli *argv``; never returns."""
    code: Any = 0
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(message["cwd"])
        os.environ.clear()
        os.environ.update(message["env"])
        if message["nofile"] is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, tuple(message["nofile"]))
        sys.argv = ["-m", *message["spawn"]]
        runpy.run_module("app.cli", run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code
    except BaseException:
        traceback.print_exc()
        code = 1
    # What the interpreter's own exit does: join non-daemon threads, run atexit
    # handlers, flush the standard streams.
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    if not isinstance(code, int):
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def main(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    while True:
        data, fds, _, _ = socket.recv_fds(sock, _MESSAGE, 3)
        if not data:
            return
        message = json.loads(data)
        if "hello" in message:
            answer: dict[str, Any] = {"ready": threading.active_count() == 1}
        elif "reap" in message:
            answer = {"status": os.waitpid(message["reap"], 0)[1]}
        else:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                sock.close()
                _child(message, fds)
            for received in fds:
                os.close(received)
            answer = {"pid": pid}
        sock.send(json.dumps(answer).encode())


if __name__ == "__main__":
    main(int(sys.argv[1]))
