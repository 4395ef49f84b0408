"""The listening socket's own defences: request-head and request-body deadlines, and connection limits
(in total, per client address, and a reserve that one address cannot take).

Stage: socket → **listener** → ASGI app. uvicorn times out idle keep-alive connections but never a
connection that is *sending* a request head, so a client dripping one header line every few seconds
holds its file descriptor forever (slowloris): enough of them exhaust the fd limit and the proxy stops
accepting anyone. Here every connection must deliver a complete request head within
``header_timeout_s`` of its first byte (or of being accepted), and the body within ``body_timeout_s``
(plus ``BODY_GRACE_S``) of its head, whatever route it goes to: the app answers a slow body 408 at
``body_timeout_s`` (``routes.read_body``), and this deadline closes the connection of any body the app
did not read in time. So one request holds a connection for at most head + body deadline.

Connections are admitted at accept time, before a byte is read (``Admission``): beyond
``max_connections`` in total, beyond ``max_per_client`` from one client address (an IPv6 client counts
by its /64, an IPv4-mapped one as IPv4), and, once fewer than ``reserved`` slots are free, only an
address holding fewer connections than the mean of the addresses connected gets one. So a flood of
slow or idle sockets from one address, which reopens each one the deadlines close, can hold at most
``max_per_client`` slots and never the reserve, and a few addresses at their limit leave the reserve to
everyone else. The wrapper works on uvicorn's h11 and httptools protocols alike: both create
``self.cycle`` synchronously in ``data_received`` once a request head is parsed, and set its
``more_body`` to False once the body is complete.

Behind a reverse proxy every client has the proxy's address: set ``max_per_client`` to 0 and
``reserved`` to 0 there, and limit clients in the reverse proxy (nginx ``limit_conn``). Exposed to the
internet, put one in front anyway: it buffers slow clients and terminates TLS. See docs/deployment.md.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from collections.abc import Callable
from typing import Any

import uvicorn

log = logging.getLogger(__name__)

BODY_GRACE_S = 1.0  # the app's own 408 comes first; the listener closes what the app did not answer


def client_key(host: str | None) -> str:
    """The address a connection counts against: IPv4 as is, IPv6 by its /64 (one host usually has a whole
    /64), an IPv4-mapped IPv6 address as its IPv4. A unix socket (no address) counts as ``"local"``."""
    if not host:
        return "local"
    if ":" not in host:
        return host
    try:
        ip = ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return host
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((ip, 64), strict=False))


class Admission:
    """Who gets a connection slot: one per listener (its connections share it). ``held`` counts the open,
    admitted connections of each client key."""

    def __init__(self, max_connections: int, max_per_client: int = 0, reserved: int = 0):
        if max_connections < 1 or max_per_client < 0 or not 0 <= reserved < max_connections:
            raise ValueError(f"connection limits: need max_connections >= 1, max_per_client >= 0 and "
                             f"0 <= reserved < max_connections, got {max_connections}, {max_per_client}, {reserved}")
        self.max_connections, self.max_per_client, self.reserved = max_connections, max_per_client, reserved
        self.held: dict[str, int] = {}
        self.total = 0

    def admit(self, key: str) -> str | None:
        """Take a slot for ``key``; None when taken, else the reason it is refused."""
        held = self.held.get(key, 0)
        if self.total >= self.max_connections:
            return "connection_limit"
        if self.max_per_client and held >= self.max_per_client:
            return "client_connection_limit"
        if self.total >= self.max_connections - self.reserved and held and held * len(self.held) >= self.total:
            return "connection_reserve"  # into the reserve only below the mean per connected address
        self.held[key] = held + 1
        self.total += 1
        return None

    def release(self, key: str) -> None:
        held = self.held.get(key, 0)
        if held <= 1:
            self.held.pop(key, None)
        else:
            self.held[key] = held - 1
        self.total = max(0, self.total - 1)


def guarded_protocol(base: type, *, header_timeout_s: float, max_connections: int, body_timeout_s: float = 0.0,
                     max_per_client: int = 0, reserved: int = 0,
                     on_drop: Callable[[str], None] | None = None) -> type:
    """A subclass of uvicorn's HTTP protocol ``base`` with head and body deadlines (``body_timeout_s`` 0:
    none here) and the connection limits of ``Admission``."""
    drop = on_drop or (lambda why: None)
    admission = Admission(max_connections, max_per_client, reserved)

    class Guarded(base):  # type: ignore[misc, valid-type]
        _head_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None
        _seen_cycle: Any = None
        _key: str | None = None  # set while this connection holds a slot

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            key = client_key(self.client[0] if self.client else None)
            refused = admission.admit(key)
            if refused is not None:
                drop(refused)
                transport.close()
                return
            self._key = key
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            cycle = self.cycle
            if cycle is not None and cycle is not self._seen_cycle:  # a complete head arrived
                self._seen_cycle = cycle
                self._disarm()
                if cycle.more_body and body_timeout_s > 0:
                    self._body_timer = self.loop.call_later(body_timeout_s + BODY_GRACE_S, self._body_expired)
            elif self._waiting_for_head():
                self._arm()
            if self._body_timer is not None and (cycle is None or not cycle.more_body):
                self._body_timer.cancel()
                self._body_timer = None

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None
            if self._key is not None:
                admission.release(self._key)
                self._key = None
            super().connection_lost(exc)

        def _waiting_for_head(self) -> bool:
            cycle = self.cycle
            return cycle is None or (cycle is self._seen_cycle and cycle.response_complete)

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(header_timeout_s, self._head_expired)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_expired(self) -> None:
            self._head_timer = None
            if self._waiting_for_head() and not self.transport.is_closing():
                drop("header_timeout")
                self.transport.close()

        def _body_expired(self) -> None:
            self._body_timer = None
            cycle = self.cycle
            if cycle is not None and cycle.more_body and not self.transport.is_closing():
                drop("body_timeout")
                self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    Guarded.admission = admission  # type: ignore[attr-defined]  (read by tests and the load test)
    return Guarded


def uvicorn_config(app: Any, *, host: str, port: int, header_timeout_s: float, max_connections: int,
                   max_header_bytes: int, keep_alive_s: int, body_timeout_s: float = 0.0, max_per_client: int = 0,
                   reserved: int = 0, on_drop: Callable[[str], None] | None = None, http_impl: str = "auto",
                   **kw: Any) -> uvicorn.Config:
    """uvicorn settings of a proxy exposed to clients: its HTTP protocol (httptools when installed, as
    uvicorn's own "auto" picks, else h11) with the guards above and a bounded keep-alive."""
    http = guarded_protocol(http_protocol(http_impl), header_timeout_s=header_timeout_s,
                            max_connections=max_connections, body_timeout_s=body_timeout_s,
                            max_per_client=max_per_client, reserved=reserved, on_drop=on_drop)
    return uvicorn.Config(app, host=host, port=port, http=http, timeout_keep_alive=keep_alive_s,
                          h11_max_incomplete_event_size=max_header_bytes, **kw)


def proxy_uvicorn_config(app: Any, p: Any, on_drop: Callable[[str], None], keep_alive_s: int) -> uvicorn.Config:
    """``serve``'s listener (one process, or each of ``--workers``) from its ``ProxyConfig`` ``p``. loop/http
    "auto": uvloop and httptools when installed (uvicorn[standard]); the benchmark sets
    OPENCLAW_RL_UVICORN_LOOP=asyncio / _HTTP=h11 to measure what they buy."""
    return uvicorn_config(app, host=p.host, port=p.port, header_timeout_s=p.header_timeout_s,
                          max_connections=p.max_connections, max_header_bytes=p.max_header_bytes,
                          body_timeout_s=p.body_timeout_s, max_per_client=p.max_connections_per_client,
                          reserved=p.reserved_connections, keep_alive_s=keep_alive_s, on_drop=on_drop,
                          http_impl=os.environ.get("OPENCLAW_RL_UVICORN_HTTP", "auto"),
                          loop=os.environ.get("OPENCLAW_RL_UVICORN_LOOP", "auto"),
                          log_level="warning", access_log=False, timeout_graceful_shutdown=30)


def http_protocol(name: str = "auto") -> type:
    """uvicorn's protocol class for ``name`` ("auto", "httptools" or "h11"), resolved like uvicorn's "auto"."""
    if name not in ("auto", "httptools", "h11"):
        raise ValueError(f"http implementation must be auto, httptools or h11, not {name!r}")
    if name != "h11":
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

            return HttpToolsProtocol
        except ImportError:
            if name == "httptools":
                raise
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return H11Protocol
