"""Socket floods for the load test's attacks: many sockets from other loopback addresses that send a
complete head and drip the body, or send nothing, and come back as soon as the proxy closes them.

Stage: client (hostile) → listener. Used by ``attacks.py`` (``scripts/load_test.py --slow-body-flood`` /
``--idle-flood``) and by the listener's tests. Loopback only (127.0.0.2 …), bounded in rounds.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from typing import Any

HOST = "127.0.0.1"
ATTACKER_KEY = "attacker-key"


def flood(port: int, n: int, addresses: int, slow_body: bool, stop: threading.Event, out: dict[str, Any]) -> None:
    """``n`` sockets from 127.0.0.2 … ``addresses``: a slow body sends a complete head (the attacker's key,
    Content-Length 100000) and then one body byte every 2 s; an idle one sends nothing. Each round (0.5 s)
    every socket the proxy closed is reopened. Bounded: 600 rounds at most."""
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + ATTACKER_KEY.encode() + b"\r\nContent-Length: 100000\r\n\r\n{")
    sources = [f"127.0.0.{2 + i % 250}" for i in range(max(1, addresses))]
    sel = selectors.DefaultSelector()
    socks: list[socket.socket | None] = [None] * n
    opened = closed = failed_connects = max_open = 0

    def open_one(i: int) -> None:
        nonlocal opened, failed_connects
        try:
            s = socket.create_connection((HOST, port), timeout=1, source_address=(sources[i % len(sources)], 0))
            if slow_body:
                s.sendall(head)
            s.setblocking(False)
        except OSError:
            failed_connects += 1
            return
        socks[i] = s
        sel.register(s, selectors.EVENT_READ, i)
        opened += 1

    rounds = 0
    while not stop.is_set() and rounds < 600:
        for i in range(n):
            if socks[i] is None and not stop.is_set():
                open_one(i)
        max_open = max(max_open, sum(s is not None for s in socks))
        drip = slow_body and rounds % 4 == 0
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            for key, _ in sel.select(max(0.0, end - time.monotonic())):
                s = key.fileobj
                try:
                    data = s.recv(4096)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data or data.startswith(b"HTTP/"):  # closed, or answered (a 408): reopen next round
                    sel.unregister(s)
                    s.close()  # type: ignore[union-attr]
                    socks[key.data] = None
                    closed += 1
        if drip:
            for s in socks:
                if s is not None:
                    with contextlib.suppress(OSError):
                        s.send(b" ")
        rounds += 1
    for s in socks:
        if s is not None:
            s.close()
    sel.close()
    out.update(opened=opened, closed_by_proxy=closed, failed_connects=failed_connects, max_open=max_open)
