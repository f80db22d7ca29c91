"""Fault injection against the serving edge: races in the embedder, slow and idle
clients, connection floods, and API keys that cannot work (issue 10, defects 4, 6, 8).

Server tests run real ``normcal serve`` subprocesses and talk raw sockets to them.
Nothing here sleeps to synchronise: sockets block on the server's answer (with a
generous timeout), threads start together on a barrier, and conditions are polled
with a deadline.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support.server import ServerProcess

SHORT = ["a cat", "what is the capital of France?", "normcal keeps the raw norm"]
LONG = [" ".join(f"word{i}" for i in range(n)) for n in (300, 700)]  # > 256 tokens


@pytest.mark.slow
def test_concurrent_embed_and_token_counting_do_not_interfere(embedder):
    """Defect 4: counting tokens (no truncation, no padding) while other threads
    encode made ``embed`` raise "Unable to create tensor"; results must also match."""
    texts = SHORT + LONG + SHORT[:1]
    expected = embedder.embed(texts, "document")
    expected_counts = embedder.token_counts(texts)
    assert expected.truncated.any() and not expected.truncated.all()
    embedders, counters, rounds = 3, 3, 3
    barrier = threading.Barrier(embedders + counters)
    embedded = threading.Event()  # counters keep counting until the embeds are done
    errors: list[BaseException] = []
    batches = []
    counts = []

    def run(work) -> None:
        try:
            barrier.wait(timeout=60)
            work()
        except BaseException as error:  # reported below
            errors.append(error)

    def embed() -> None:
        for _ in range(rounds):
            batches.append(embedder.embed(texts, "document"))

    def count() -> None:
        for _ in range(2000):  # bounded; normally ends when the embeds are done
            counts.append(embedder.token_counts(texts))
            if embedded.is_set():
                return

    embedding = [threading.Thread(target=run, args=(embed,)) for _ in range(embedders)]
    counting = [threading.Thread(target=run, args=(count,)) for _ in range(counters)]
    for thread in embedding + counting:
        thread.start()
    for thread in embedding:
        thread.join(300)
    embedded.set()
    for thread in counting:
        thread.join(300)
    assert not any(t.is_alive() for t in embedding + counting)
    assert errors == []
    assert len(batches) == embedders * rounds and len(counts) >= counters
    for batch in batches:
        np.testing.assert_allclose(batch.vectors, expected.vectors, atol=1e-5)
        np.testing.assert_allclose(batch.norms, expected.norms, rtol=1e-5)
        assert (batch.n_tokens == expected.n_tokens).all()
        assert (batch.truncated == expected.truncated).all()
    for got in counts:
        assert (got == expected_counts).all()


# ---------------------------------------------------------------- slow and idle clients

PARTIAL_HEAD = (
    b"GET /healthz HTTP/1.1\r\nHost: normcal\r\n"  # no blank line: unfinished
)
WAIT = 120.0  # generous bound on any single wait for the server to act
SERVER_NOFILE = 256  # the slow-client server's open-file limit (soft = hard)
FLOOD_SPARE = 32  # descriptors the flood test leaves the server above what it holds
FLOOD = FLOOD_SPARE + 64  # the flood's connections, all queued at once


@pytest.fixture(scope="module")
def slow_client_server(tmp_path_factory):
    """A server with 1 s / 2 s head / body deadlines and only 256 descriptors."""
    tmp = tmp_path_factory.mktemp("slow")
    with (tmp / "server.log").open("wb") as log:
        server = ServerProcess(
            tmp / "data",
            env={"NORMCAL_HEADER_TIMEOUT": "1", "NORMCAL_BODY_TIMEOUT": "2"},
            log=log,
            nofile=(SERVER_NOFILE, SERVER_NOFILE),
        ).start()
        try:
            yield server, tmp / "server.log"
        finally:
            server.stop()


def connect(server: ServerProcess, first: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    if first:
        sock.sendall(first)
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """Block until the server answers or closes; True when it closed with no answer."""
    with sock:
        try:
            return sock.recv(65536) == b""
        except ConnectionResetError:
            return True


@pytest.mark.server
def test_unfinished_request_heads_are_closed_by_the_header_timeout(
    slow_client_server,
):
    """Defect 6: connections that never finish their headers were never timed out."""
    server, _ = slow_client_server
    socks = [connect(server, PARTIAL_HEAD if i % 2 else b"") for i in range(100)]
    assert httpx.get(f"{server.url}/healthz", timeout=WAIT).status_code == 200
    assert all(closed_by_server(sock) for sock in socks)
    assert httpx.get(f"{server.url}/healthz", timeout=WAIT).status_code == 200


@pytest.mark.server
def test_trickling_a_head_byte_by_byte_does_not_extend_the_deadline(
    slow_client_server,
):
    """The deadline runs from the first byte; each new byte does not renew it."""
    server, _ = slow_client_server
    head = PARTIAL_HEAD * 1000  # far more bytes than the loop below can send
    with connect(server) as sock:
        sock.settimeout(0.25)  # the pace of the trickle, not a synchronisation
        for i in range(2000):  # bounded: ~500 s of trickling at most
            try:
                if sock.recv(1) == b"":
                    break  # closed by the server
            except TimeoutError:
                sock.sendall(head[i : i + 1])
            except ConnectionResetError:
                break
        else:
            pytest.fail("a trickled head kept the connection open")


@pytest.mark.server
def test_a_body_that_stops_half_way_is_closed_by_the_body_timeout(slow_client_server):
    """64 never-finished 8 MiB bodies grew RSS by 500 MB: bodies have a deadline."""
    server, _ = slow_client_server
    head = (
        b"POST /v1/collections HTTP/1.1\r\nHost: normcal\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
    )
    chunked = (
        b"PUT /v1/collections/kb/documents HTTP/1.1\r\nHost: normcal\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"10000\r\n" + b" " * 65536 + b"\r\n"
    )
    socks = [connect(server, head + b'{"name": "' + b"x" * 1000)]
    socks += [connect(server, chunked) for _ in range(8)]
    assert all(closed_by_server(sock) for sock in socks)
    listed = httpx.get(f"{server.url}/v1/collections", timeout=WAIT).json()
    assert listed["count"] == 0, "nothing was created from the unfinished body"


@pytest.mark.server
def test_idle_connection_flood_past_the_fd_limit_neither_wedges_nor_floods_the_log(
    slow_client_server,
):
    """1,100 idle connections under a 1,024 fd limit made /healthz time out and
    wrote 61 MB of 'socket.accept() out of system resource' in 15 s.

    That the flood runs the server out of descriptors is set here, not left to the
    host (how many connections it holds at once depends on how fast it accepts
    them, each closed 1 s later, and on how many the kernel queues for it): the
    server is stopped while :data:`FLOOD` connections queue in its listen backlog,
    its soft limit is lowered to what it holds plus :data:`FLOOD_SPARE`, and then it
    is continued, so it finds far more connections waiting than it has descriptors
    for. ``FLOOD`` stays below 128, the smallest default ``net.core.somaxconn``, so
    the kernel completes every connection while the server is stopped.
    """
    server, log_path = slow_client_server
    assert server.proc is not None
    pid = server.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        socks = [connect(server) for _ in range(FLOOD)]
        held = len(os.listdir(f"/proc/{pid}/fd"))
        limit = (held + FLOOD_SPARE, SERVER_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, limit)
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        assert all(closed_by_server(sock) for sock in socks)
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (SERVER_NOFILE, SERVER_NOFILE))
    assert httpx.get(f"{server.url}/healthz", timeout=WAIT).status_code == 200
    log = log_path.read_bytes()
    assert b"out of system resource" in log, "the flood did exhaust descriptors"
    assert len(log) < 64 * 1024, f"{len(log)} bytes of log"


def poll_healthz(client: httpx.Client, want: int) -> None:
    """Ask /healthz until it answers ``want`` (bounded by a generous deadline)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if client.get("/healthz").status_code == want:
            return
        time.sleep(0.1)
    pytest.fail(f"/healthz never answered {want}")


@pytest.mark.server
def test_connections_past_the_cap_get_503_and_the_fd_limit_is_raised(tmp_path):
    """At the cap every connection is served; one more and requests get 503 (not a
    hang); when connections go away, service resumes. The server also raised its
    soft open-file limit to the hard one."""
    cap = 8
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    server = ServerProcess(
        tmp_path / "data",
        env={"NORMCAL_MAX_CONNECTIONS": str(cap), "NORMCAL_HEADER_TIMEOUT": "600"},
        nofile=(min(512, hard), hard),
    ).start()
    idle: list[socket.socket] = []
    try:
        limits = Path(f"/proc/{server.proc.pid}/limits").read_text()
        row = next(line for line in limits.splitlines() if "open files" in line)
        assert row.split()[3:5] == [str(hard)] * 2 or hard == resource.RLIM_INFINITY

        idle = [connect(server, PARTIAL_HEAD) for _ in range(cap - 1)]
        with httpx.Client(base_url=server.url, timeout=WAIT) as client:
            # cap connections with the client's: served (whether or not the server
            # has accepted every idle one yet, it never sees more than cap)
            assert client.get("/healthz").status_code == 200
            idle.append(connect(server, PARTIAL_HEAD))
            poll_healthz(client, 503)  # one past the cap, once it is accepted
            for sock in idle:
                sock.close()
            poll_healthz(client, 200)  # the idle ones are gone: served again
    finally:
        for sock in idle:
            sock.close()
        server.stop()


# ---------------------------------------------------------------- API keys that cannot work


@pytest.mark.server
@pytest.mark.parametrize("key", ["", "  padded-key "])
def test_serve_refuses_an_empty_or_padded_api_key(tmp_path, key):
    """An empty NORMCAL_API_KEY silently disabled auth; a padded one never matched."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NORMCAL_API_KEY": key}
    cmd = [sys.executable, "-m", "app.cli", "serve", "--port", "0"]
    cmd += ["--data-dir", str(tmp_path / "data")]
    done = subprocess.run(cmd, env=env, capture_output=True, timeout=WAIT)
    assert done.returncode != 0
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and "NORMCAL_API_KEY" in lines[0], lines
    assert "Traceback" not in done.stderr.decode()
    if key:
        assert key.strip() not in lines[0], "the key is never echoed"
    assert not (tmp_path / "data").exists(), "refused before touching anything"


def test_served_connections_send_without_nagle_delays(monkeypatch):
    """The socket ``serve`` binds has proto 0, so asyncio left Nagle's algorithm on
    for its connections: each keep-alive request after the first waited ~40 ms for
    the client's delayed ACK of the response head. Every connection gets NODELAY."""
    import asyncio

    import uvicorn

    from app.api import serving

    states: list[int] = []
    set_no_delay = serving.no_delay

    def recording(transport: asyncio.BaseTransport) -> None:
        set_no_delay(transport)
        sock = transport.get_extra_info("socket")
        states.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    monkeypatch.setattr(serving, "no_delay", recording)

    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        http=serving.ReadDeadlineProtocol.with_deadlines(header=30, body=30),
        lifespan="off",
        log_config=None,
    )
    sock = serving.bind_socket("127.0.0.1", 0)  # as serve() does
    assert sock.proto == 0  # what asyncio skips when it sets NODELAY itself
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)  # polling a condition, with a deadline
        assert server.started
        port = sock.getsockname()[1]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            assert [client.get("/").text for _ in range(3)] == ["ok"] * 3
    finally:
        server.should_exit = True
        thread.join(timeout=60)
    assert states == [1]  # one keep-alive connection, Nagle off
