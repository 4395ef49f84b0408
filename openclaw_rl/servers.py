"""Run an ASGI app (proxy, engine, mock backend) on a background thread with its own event loop.

Slime's hook model calls our rollout function from a plain thread, so the proxy cannot share an event
loop with its caller; tests and the embedded stack need the same thing. This module owns only the
lifecycle (start, wait until listening, stop); it knows nothing about what the app does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random  # SystemRandom: unaffected by tests seeding the global generator
import socket
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

from .errors import ShuttingDown, error_body

log = logging.getLogger(__name__)

RAW_SEND = "openclaw.raw_send"  # ASGI scope key: the server's own `send` (the engine's crash closes its transport)
KEEP_ALIVE_S = 30  # longer than clients' pool expiry (httpx: 5 s), so idle connections close client-side first


def ephemeral_port_range() -> tuple[int, int]:
    """The ports the OS hands out to ``bind(0)`` and to outgoing connections (Linux's default if unknown)."""
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free now, for a server started elsewhere (racy by nature: another
    process may bind it first; ``BackgroundServer`` without a port holds its socket instead).

    Picked between Ray's worker ports (10002-19999 by default) and the OS's ephemeral range where there
    is room: a port from ``bind(0)`` is one that every outgoing connection (gloo and Ray rendezvous, HTTP
    clients) may take as its source port before the server binds it, which made a proxy under Slime's
    tp=2 check fail with "port in use". There, only another server choosing explicitly can collide.
    """
    with bind_free_socket(host, reuse_address=False) as sock:
        return int(sock.getsockname()[1])


def bind_free_socket(host: str = "127.0.0.1", reuse_address: bool = True) -> socket.socket:
    """A TCP socket bound (not yet listening) to a free port of ``host``, chosen as ``free_port`` says.

    A server that listens on this very socket cannot lose its port to anyone between choosing and
    binding it (a CI run failed so: two test workers' servers picked the same port)."""
    low, _ = ephemeral_port_range()
    first = 20000 if low > 22000 else 1024
    candidates = random.SystemRandom().sample(range(first, low), min(64, max(low - first, 0)))
    return first_bindable(host, candidates, reuse_address)


def first_bindable(host: str, candidates: list[int], reuse_address: bool = False) -> socket.socket:
    """A socket bound to the first of ``candidates`` that ``host`` can bind now; else to one from the OS
    (``bind(0)``). ``reuse_address`` is uvicorn's own choice for its listeners (SO_REUSEADDR)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    error: OSError | None = None
    for port in [*candidates, 0]:
        # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on connections whose socket says TCP,
        # and the accepted ones copy this listener's. With 0, Nagle held every response's second write
        # (uvicorn sends head and body apart) for the client's delayed ACK: ~44 ms a request, not ~1.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            if reuse_address:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError as e:
            sock.close()
            error = e
            continue
        return sock
    raise OSError(f"cannot bind any port on {host}: {error}") from error


class AnswerRequestsCutByShutdown:
    """ASGI wrapper: a request still running when uvicorn's graceful-shutdown window ends is cancelled by
    uvicorn, which then prints a CancelledError traceback and answers a bare 500. This turns that into
    one log line and, if the response has not started, a clear 503 in OpenAI's error JSON. A response
    already streaming is left unfinished (no final chunk), so the client sees a cut stream, never a
    silently truncated but well-formed one."""

    def __init__(self, app: Any, grace_s: float):
        self.app = app
        self.grace_s = grace_s
        self.shutting_down = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False
        scope.setdefault(RAW_SEND, send)  # the wrapper below hides uvicorn's send (and its transport)

        async def send_tracking_start(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracking_start)
        except asyncio.CancelledError:
            if not self.shutting_down:
                raise
            log.warning("shutdown: %s %s was still running after the %ss grace period; %s", scope.get("method"),
                        scope.get("path"), self.grace_s,
                        "its stream is cut" if started else "answered 503")
            if not started:
                body = json.dumps(error_body(ShuttingDown("the server is shutting down; retry later"))).encode()
                await send({"type": "http.response.start", "status": ShuttingDown.status,
                            "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})


class PromptStopServer(uvicorn.Server):
    """uvicorn's server, stopped without its fixed polls.

    uvicorn checks ``should_exit`` every 0.1 s, waits a fixed 0.1 s after asking its connections to close
    and then re-checks them every 0.1 s: 0.15-0.25 s per stop of an idle server, which a test suite that
    starts a few hundred servers (policy, judge and proxy per test) spends idle. Here ``stop()`` wakes
    the main loop at once, and the shutdown checks its connections and tasks every 5 ms with the same
    rules: stop accepting, ask every connection to close, wait for them and the running tasks for at
    most ``timeout_graceful_shutdown`` s, cancel what is left (``AnswerRequestsCutByShutdown`` answers
    those), then run the app's lifespan shutdown. A uvicorn without the internals used here
    (``server_state``, ``lifespan``) shuts down its own way."""

    POLL_S = 0.005  # how often the shutdown checks its connections and tasks
    TICK_S = 1.0  # the main loop's wait between two ticks when nobody wakes it
    """uvicorn ticks every 0.1 s (an exit check, and the date header every tenth tick); a proxy streaming a
    reply was woken by it ten times a second (~0.16 wake-ups per paced stream event, and an ``asyncio.wait_for``
    per tick: ~2.5 ms of CPU a second, ``scripts/bench_stream_events.py``). Setting ``should_exit`` wakes the
    loop at once, so the tick only refreshes the date header, as uvicorn's does once a second
    (``limit_max_requests``, unused by the proxy, is checked once a second too)."""

    def __init__(self, config: uvicorn.Config):
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future | None = None
        super().__init__(config)

    @property  # type: ignore[override]
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value:  # whoever sets it (a signal, stop(), a test, a worker whose owner is gone): noticed now
            self.wake()

    def wake(self) -> None:
        """Called from any thread (or a signal handler): the main loop runs its exit check now, not at its tick."""
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._end_wait)
            except RuntimeError:  # the loop closed meanwhile: it has stopped already
                pass

    def _end_wait(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def main_loop(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        tick = 0
        while not await self.on_tick(tick):  # on_tick keeps uvicorn's date header and exit rules
            tick = (tick + 10) % 864000  # a tick is a second: uvicorn refreshes the date at every tenth of its own
            self._waiter = waiter = loop.create_future()
            handle = loop.call_later(self.TICK_S, self._end_wait)
            try:
                await waiter
            finally:
                handle.cancel()
                self._waiter = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        state, lifespan = getattr(self, "server_state", None), getattr(self, "lifespan", None)
        if state is None or lifespan is None:
            return await super().shutdown(sockets=sockets)
        for listener in self.servers:
            listener.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(state.connections):
            connection.shutdown()
        loop = asyncio.get_running_loop()
        grace = self.config.timeout_graceful_shutdown
        deadline = loop.time() + (grace if grace is not None else float("inf"))
        while (state.connections or state.tasks) and not self.force_exit and loop.time() < deadline:
            await asyncio.sleep(self.POLL_S)
        if state.tasks and not self.force_exit:
            log.warning("shutdown: cancelling %d request(s) still running after %ss", len(state.tasks), grace)
            for task in list(state.tasks):
                task.cancel(msg="the graceful shutdown window ended")
        elif not self.force_exit:
            # On Python 3.12.1+ wait_closed also waits for every connection: bounded by the same window
            try:
                await asyncio.wait_for(asyncio.gather(*(listener.wait_closed() for listener in self.servers)),
                                       max(0.0, deadline - loop.time()) if grace is not None else None)
            except asyncio.TimeoutError:
                pass
        if not self.force_exit:
            await lifespan.shutdown()


class BackgroundServer:
    """A uvicorn server on a daemon thread. Use as a context manager or call start()/stop()."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int | None = None, log_level: str = "warning",
                 max_header_bytes: int = 64 * 1024, graceful_shutdown_s: float = 5.0):
        self.host = host
        # Without a port the server holds the socket of the one it chose, so nobody can take it meanwhile
        self._socket = None if port else bind_free_socket(host)
        self.port = port or int(self._socket.getsockname()[1])
        self._guard = AnswerRequestsCutByShutdown(app, graceful_shutdown_s)
        config = uvicorn.Config(
            self._guard, host=self.host, port=self.port, log_level=log_level, lifespan="on", access_log=False,
            timeout_graceful_shutdown=graceful_shutdown_s, timeout_keep_alive=KEEP_ALIVE_S,
            h11_max_incomplete_event_size=max_header_bytes,
        )
        self._server = PromptStopServer(config)
        self._thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """Started and its thread not exited (uvicorn stops the thread when it shuts down or crashes)."""
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        sockets = [self._socket] if self._socket is not None else None  # one start: shutdown closes it
        self.loop.run_until_complete(self._server.serve(sockets=sockets))

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self._thread = threading.Thread(target=self._run, name=f"uvicorn:{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"server on {self.url} exited during startup (port in use?)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on {self.url} did not start within {timeout}s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._guard.shutting_down = True
        self._server.should_exit = True
        self._server.wake()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
