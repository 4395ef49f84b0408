"""Ports for test and benchmark servers: free, and out of the range that outgoing connections draw from."""

from __future__ import annotations

import random
import socket

from openclaw_rl.servers import ephemeral_port_range, first_bindable, free_port


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
        assert first_bindable("127.0.0.1", [busy, spare]) == spare
        assert first_bindable("127.0.0.1", [busy]) not in (busy, 0)  # none left: the OS picks
