"""The ports the Slime CPU checks listen on, confined to one range (``OPENCLAW_CHECK_PORTS=LO-HI``, default
29700-29899) so that two checks, or a check on a busy machine, can be given ranges of their own.

Stage: tests (the Slime CPU checks' harness). Why: the check used to take fixed ports plus random free ones;
a port is now handed out only after it was bound here, and never twice by one run. Outgoing connections and
gloo's own connections between ranks still use the system's ephemeral ports.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator


def port_range(env: dict[str, str] | None = None) -> range:
    raw = (os.environ if env is None else env).get("OPENCLAW_CHECK_PORTS") or "29700-29899"
    lo, _, hi = raw.partition("-")
    if not (lo.isdigit() and hi.isdigit() and 1024 <= int(lo) <= int(hi) <= 65535):
        raise ValueError(f"OPENCLAW_CHECK_PORTS must be LO-HI within 1024-65535, got {raw!r}")
    return range(int(lo), int(hi) + 1)


def free_ports(ports: range) -> Iterator[int]:
    """Each port of ``ports`` that 127.0.0.1 can bind now, once; StopIteration when the range is used up."""
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        yield port
