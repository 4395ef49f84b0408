"""A connection flood from one client address cannot starve the others: each address holds at most
``max_per_client`` slots, the last ``reserved`` go only to addresses below the mean, and a request whose
body is not read in time loses its connection at the body deadline whatever route it went to.

Loopback only: client addresses 127.0.0.2, 127.0.0.3 … (the whole 127.0.0.0/8 is local) stand for
distinct clients. A few dozen sockets, limits of 20.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from test_slow_clients import wait_closed

from openclaw_rl.listener import Admission, client_key, uvicorn_config
from openclaw_rl.servers import free_port


def test_client_key_groups_ipv6_by_64_and_unmaps_ipv4():
    assert client_key("203.0.113.7") == "203.0.113.7"
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("::ffff:198.51.100.4") == "198.51.100.4"
    assert client_key(None) == "local"


def test_admission_per_client_limit_and_reserve():
    a = Admission(max_connections=20, max_per_client=8, reserved=4)
    assert [a.admit("flood-1") for _ in range(9)] == [None] * 8 + ["client_connection_limit"]
    assert [a.admit("flood-2") for _ in range(8)] == [None] * 8  # 16 held: the last 4 are the reserve
    assert a.admit("flood-1") == "client_connection_limit"
    a.release("flood-2")  # 15 held: one unreserved slot free, flood-2 may have it back
    assert a.admit("flood-2") is None
    assert a.admit("flood-2") == "client_connection_limit"
    for _ in range(3):  # a new address and one below the mean get reserved slots
        assert a.admit("bystander") is None
    assert a.admit("late") is None
    assert a.admit("late-2") == "connection_limit"
    assert a.total == 20 and a.held["bystander"] == 3
    with pytest.raises(ValueError):
        Admission(max_connections=4, reserved=4)


def test_one_address_never_takes_the_reserve():
    a = Admission(max_connections=10, max_per_client=0, reserved=3)
    results = [a.admit("only") for _ in range(10)]
    assert results == [None] * 7 + ["connection_reserve"] * 3
    assert a.admit("other") is None


@contextmanager
def guarded_server(app, **limits) -> Iterator[tuple[uvicorn.Server, int, list[str]]]:
    drops: list[str] = []
    port = free_port()
    config = uvicorn_config(app, host="127.0.0.1", port=port, max_header_bytes=65536, keep_alive_s=30,
                            on_drop=drops.append, log_level="warning", lifespan="off", **limits)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()))
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        yield server, port, drops
    finally:
        server.should_exit = True
        thread.join(10)


def connect_from(source: str, port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), source_address=(source, 0))


def ok_app():
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    return Starlette(routes=[Route("/", lambda request: PlainTextResponse("ok"))])


def test_a_flood_from_one_address_leaves_slots_for_another():
    with guarded_server(ok_app(), header_timeout_s=30, max_connections=20, max_per_client=8, reserved=4) as (
            server, port, drops):
        flood: list[socket.socket] = []
        try:
            flood = [connect_from("127.0.0.2", port) for _ in range(12)]  # idle: never send a byte
            assert wait_closed(flood[8:], timeout=5) == 4  # beyond its 8, closed at once
            assert drops == ["client_connection_limit"] * 4
            flood += [connect_from("127.0.0.3", port) for _ in range(12)]  # a second address: 8 more
            assert wait_closed(flood[20:], timeout=5) == 4
            with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.4")) as client:
                assert client.get(f"http://127.0.0.1:{port}/").text == "ok"  # a third address is served
            held = server.config.http.admission.held
            assert (held["127.0.0.2"], held["127.0.0.3"]) == (8, 8)
        finally:
            for s in flood:
                s.close()


def test_a_body_the_app_never_reads_loses_its_connection_at_the_body_deadline():
    released = threading.Event()

    async def never_reads(scope, receive, send):  # an ASGI app that neither reads the body nor answers
        for _ in range(1000):  # until the test ends (bounded)
            if released.is_set():
                return
            await asyncio.sleep(0.02)

    with guarded_server(never_reads, header_timeout_s=30, max_connections=20, body_timeout_s=0.2) as (
            server, port, drops):
        s = socket.create_connection(("127.0.0.1", port))
        try:
            s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")  # 97 bytes never come
            assert wait_closed([s], timeout=10) == 1
            assert drops == ["body_timeout"]
        finally:
            released.set()
            s.close()


def test_the_load_tests_flood_reopens_what_the_proxy_closes():
    """``scripts/load_test.py --idle-flood``'s attacker: sockets refused over the per-address limit come back."""
    from openclaw_rl.bench.floods import flood

    with guarded_server(ok_app(), header_timeout_s=30, max_connections=20, max_per_client=8) as (server, port, drops):
        stop, out = threading.Event(), {}
        attacker = threading.Thread(target=flood, args=(port, 12, 1, False, stop, out))
        attacker.start()
        deadline = time.monotonic() + 20
        while len(drops) < 8 and time.monotonic() < deadline:  # the first 4 refused, reopened, refused again
            time.sleep(0.01)
        stop.set()
        attacker.join(20)
        assert len(drops) >= 8 and set(drops) == {"client_connection_limit"}
        assert out["opened"] >= 16 and out["closed_by_proxy"] >= 8 and out["max_open"] == 12
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.4")) as client:
            assert client.get(f"http://127.0.0.1:{port}/").text == "ok"
