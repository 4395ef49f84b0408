"""Slow clients cannot hold the proxy: slowloris heads are cut at the header deadline, slow bodies get
408, connections beyond the cap are closed at once, and legitimate clients keep being served.

The proxy runs as `openclaw-rl serve` (the real uvicorn wiring). A few hundred sockets on loopback,
bounded in count and time.
"""

from __future__ import annotations

import asyncio
import selectors
import signal
import socket
import subprocess
import threading
import time

import httpx
import uvicorn
from support import serve_cli

from openclaw_rl.servers import free_port

SLOW = 300


def start(policy_url: str, tokenizer_dir: str, port: int, spool: str, *extra: str) -> subprocess.Popen:
    return serve_cli(port, "--policy-url", policy_url, "--tokenizer", tokenizer_dir, "--spool-dir", spool, *extra)


def wait_closed(socks: list[socket.socket], timeout: float) -> int:
    """How many of ``socks`` the server closed (EOF or reset) within ``timeout``."""
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    closed, deadline = 0, time.monotonic() + timeout
    while closed < len(socks) and time.monotonic() < deadline:
        for key, _ in sel.select(0.1):
            try:
                data = key.fileobj.recv(4096)
            except OSError:
                data = b""
            if not data or b"408" in data:
                closed += 1
                sel.unregister(key.fileobj)
    sel.close()
    return closed


def test_slowloris_heads_are_dropped_and_legit_clients_served(policy_server, tiny_model_dir, tmp_path):
    port = free_port()
    proc = start(policy_server.url, str(tiny_model_dir), port, str(tmp_path / "spool"), "--header-timeout", "1",
                 "--body-timeout", "1")
    url = f"http://127.0.0.1:{port}"
    slow: list[socket.socket] = []
    try:
        for _ in range(SLOW):  # every one sends a request line and one header, then drips
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            slow.append(s)
        stop = threading.Event()

        def drip() -> None:  # one more header line per socket every 0.3 s: never a complete head
            n = 0
            while not stop.is_set() and n < 30:
                for s in slow:
                    try:
                        s.sendall(b"X-Slow-%d: 1\r\n" % n)
                    except OSError:
                        pass
                n += 1
                stop.wait(0.3)

        dripper = threading.Thread(target=drip)
        dripper.start()
        codes = []
        with httpx.Client(timeout=10) as client:  # legitimate traffic meanwhile
            for i in range(10):
                r = client.post(f"{url}/v1/chat/completions", headers={"X-Turn-Type": "side"},
                                json={"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 4})
                codes.append(r.status_code)
        closed = wait_closed(slow, timeout=8)
        stop.set()
        dripper.join(10)
        assert codes == [200] * 10
        assert closed == SLOW, f"only {closed} of {SLOW} slow-header connections were dropped"
        # a slow body with a complete head: 408 at the body deadline
        body = b'{"messages": [{"role": "user", "content": "hi"}]}'
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
        s.settimeout(10)
        assert s.recv(4096).startswith(b"HTTP/1.1 408")
        s.close()
        metrics = httpx.get(f"{url}/metrics").text
        assert f'openclaw_slow_clients_total{{why="header_timeout"}} {float(SLOW)}' in metrics
        assert httpx.get(f"{url}/healthz").status_code == 200
    finally:
        for s in slow:
            s.close()
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


def test_connections_beyond_the_cap_are_closed_at_once():
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from openclaw_rl.listener import uvicorn_config

    drops: list[str] = []
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("ok"))])
    port = free_port()
    config = uvicorn_config(app, host="127.0.0.1", port=port, header_timeout_s=30, max_connections=20,
                            max_header_bytes=65536, keep_alive_s=30, on_drop=drops.append, log_level="warning",
                            lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()))
    thread.start()
    socks: list[socket.socket] = []
    try:
        while not server.started:
            time.sleep(0.01)
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
        assert wait_closed(socks[20:], timeout=5) == 10  # the 10 over the cap, at once
        assert drops == ["connection_limit"] * 10
        for s in socks[:20]:  # those under the cap are served
            s.close()
        deadline = time.monotonic() + 10  # until the server has seen the closes: it is under its cap again
        while server.server_state.connections and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not server.server_state.connections
        assert httpx.get(f"http://127.0.0.1:{port}/").text == "ok"
    finally:
        for s in socks:
            s.close()
        server.should_exit = True
        thread.join(10)
