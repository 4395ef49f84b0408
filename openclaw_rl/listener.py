"""The listening socket's own defences: a request-head deadline and a cap on open connections.

Stage: socket → **listener** → ASGI app. uvicorn times out idle keep-alive connections but never a
connection that is *sending* a request head, so a client dripping one header line every few seconds
holds its file descriptor forever (slowloris): enough of them exhaust the fd limit and the proxy stops
accepting anyone. Here every connection must deliver a complete request head within
``header_timeout_s`` of its first byte (or of being accepted), and connections beyond
``max_connections`` are closed as soon as they are accepted. Body read deadlines are enforced at the
ASGI level (``server.read_json_body``). The wrapper works on uvicorn's h11 and httptools protocols alike:
both create ``self.cycle`` synchronously in ``data_received`` once a request head is parsed.

Exposed to the internet, still put a reverse proxy (nginx, Caddy, Envoy) in front: it buffers slow
clients and terminates TLS. See docs/deployment.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import uvicorn

log = logging.getLogger(__name__)


def guarded_protocol(base: type, *, header_timeout_s: float, max_connections: int,
                     on_drop: Callable[[str], None] | None = None) -> type:
    """A subclass of uvicorn's HTTP protocol ``base`` with a head deadline and a connection cap."""
    drop = on_drop or (lambda why: None)

    class Guarded(base):  # type: ignore[misc, valid-type]
        _head_timer: asyncio.TimerHandle | None = None
        _seen_cycle: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                drop("connection_limit")
                transport.close()
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            cycle = self.cycle
            if cycle is not None and cycle is not self._seen_cycle:  # a complete head arrived
                self._seen_cycle = cycle
                self._disarm()
            elif self._waiting_for_head():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
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

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def uvicorn_config(app: Any, *, host: str, port: int, header_timeout_s: float, max_connections: int,
                   max_header_bytes: int, keep_alive_s: int, on_drop: Callable[[str], None] | None = None,
                   http_impl: str = "auto", **kw: Any) -> uvicorn.Config:
    """uvicorn settings of a proxy exposed to clients: its HTTP protocol (httptools when installed, as
    uvicorn's own "auto" picks, else h11) with the guards above and a bounded keep-alive."""
    http = guarded_protocol(http_protocol(http_impl), header_timeout_s=header_timeout_s,
                            max_connections=max_connections, on_drop=on_drop)
    return uvicorn.Config(app, host=host, port=port, http=http, timeout_keep_alive=keep_alive_s,
                          h11_max_incomplete_event_size=max_header_bytes, **kw)


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
