"""Ports for test and benchmark servers: free, and out of the range that outgoing connections draw from."""

from __future__ import annotations

import random
import socket

import httpx
import pytest

from openclaw_rl.servers import BackgroundServer, ephemeral_port_range, first_bindable, free_port


def test_ports_come_from_below_the_ephemeral_range_and_are_bindable():
    low, high = ephemeral_port_range()
    assert 0 < low <= high
    ports = [free_port() for _ in range(20)]
    if low > 22000:  # the usual Linux range: room below it, above Ray's worker ports
        assert all(20000 <= p < low for p in ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[0]))


def test_a_seeded_global_generator_does_not_make_workers_pick_the_same_ports():
    random.seed(0)
    first = [free_port() for _ in range(5)]
    random.seed(0)
    assert [free_port() for _ in range(5)] != first


def test_a_port_in_use_is_skipped():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        busy = held.getsockname()[1]
        held.listen()
        spare = free_port()
        with first_bindable("127.0.0.1", [busy, spare]) as sock:
            assert sock.getsockname()[1] == spare
        with first_bindable("127.0.0.1", [busy]) as sock:
            assert sock.getsockname()[1] not in (busy, 0)  # none left: the OS picks


def test_a_background_server_without_a_port_holds_the_one_it_chose():
    """Between choosing its port and listening on it, nobody else can bind it (a CI run once failed
    with "address already in use" when two test workers' servers chose the same port)."""
    async def app(scope, receive, send):  # a minimal ASGI app: lifespan only
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})

    server = BackgroundServer(app)
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", server.port))
    with server, httpx.Client() as http:
        assert server.running
        assert http.get(f"{server.url}/").status_code == 500  # it listens on that port (this app answers nothing)
