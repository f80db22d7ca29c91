"""Headless chromium driven over the DevTools protocol, on a pipe (no port, no deps).

``--remote-debugging-pipe`` makes chromium read commands from fd 3 and write replies
and events to fd 4, each a JSON message ended by NUL. Waiting is always for an
event: a reply, or a page condition evaluated in the page until it holds, bounded by
a deadline.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HEADLESS_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Key events: DOM key, and the code and virtual key code chromium wants with it.
_SPECIAL_KEYS = {"Enter": ("Enter", 13, "\r")}
# Moves the two pipe ends onto fds 3 and 4 (via fds >= 10, so neither clobbers the
# other), then becomes chromium.
_ONTO_FDS_3_AND_4 = (
    "import fcntl, os, sys\n"
    "a, b = (fcntl.fcntl(int(fd), fcntl.F_DUPFD, 10) for fd in sys.argv[1:3])\n"
    "os.dup2(a, 3); os.dup2(b, 4); os.execv(sys.argv[3], sys.argv[3:])\n"
)


class Browser:
    """One headless chromium with one attached page; ``flags`` are added to its own."""

    def __init__(
        self,
        chromium: str,
        profile: Path,
        *,
        timeout: float = 60,
        flags: Sequence[str] = (),
    ) -> None:
        self.timeout = timeout
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _ONTO_FDS_3_AND_4,
                str(to_child),
                str(from_child),
                chromium,
                *HEADLESS_FLAGS,
                *flags,
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            pass_fds=(to_child, from_child),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._next_id = 0
        self.session = ""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        attached = self.call("Target.attachToTarget", targetId=target, flatten=True)
        self.session = attached["sessionId"]
        self.call("Runtime.enable")

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait(30)
        os.close(self._out)
        os.close(self._in)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its reply (events in between are dropped)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method}
        message["params"] = params
        if self.session:
            message["sessionId"] = self.session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._in], [], [], max(left, 0))
            if not ready:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._in, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return dict(json.loads(message))

    def goto(self, url: str) -> None:
        """Navigate and wait for the load event's DOM."""
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JS expression (awaited when it is a promise)."""
        result = self.call(
            "Runtime.evaluate",
            expression=expression,
            returnByValue=True,
            awaitPromise=True,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, condition: str, *, timeout: float | None = None) -> Any:
        """Wait until ``condition`` is truthy in the page; return its value.

        The page itself re-checks it every 20 ms (in its own event loop, so the test
        does not sleep); the deadline only bounds the wait.
        """
        limit_ms = int(1000 * (timeout or self.timeout))
        return self.evaluate(
            f"""new Promise((resolve, reject) => {{
                const started = performance.now();
                const check = () => {{
                    let value;
                    try {{ value = ({condition}); }} catch (e) {{ value = undefined; }}
                    if (value) return resolve(value);
                    if (performance.now() - started > {limit_ms})
                        return reject(new Error("timed out waiting for: " +
                                                {json.dumps(condition)}));
                    setTimeout(check, 20);
                }};
                check();
            }})"""
        )

    def press(self, key: str) -> None:
        """Type one key, as a user would (keydown, char, keyup)."""
        code, vk, text = _SPECIAL_KEYS.get(key, (f"Key{key.upper()}", 0, key))
        if key.isdigit():
            code, vk = f"Digit{key}", ord(key)
        elif key.isalpha() and len(key) == 1:
            vk = ord(key.upper())
        common = {"key": key, "code": code, "windowsVirtualKeyCode": vk}
        self.call("Input.dispatchKeyEvent", type="keyDown", text=text, **common)
        self.call("Input.dispatchKeyEvent", type="keyUp", **common)
