"""A real uvicorn server in a thread, sharing the session's loaded embedder."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn


class ThreadServer:
    """Serve ``app`` on 127.0.0.1 from a background thread.

    It binds port 0 (the kernel picks a free port, no race); ``port`` and ``url``
    are set once it has started.
    """

    def __init__(self, app: Any) -> None:
        self.port = 0
        self.url = ""
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        sockets = self.server.servers[0].sockets
        self.port = int(sockets[0].getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
