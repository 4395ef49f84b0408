"""Stopping a server with requests still running: after the grace period each gets a clear 503 (or, if its
stream had started, a cut stream the client sees as an error), one log line, and the proxy's turn is
counted as dropped; never uvicorn's bare 500 with a CancelledError traceback."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import httpx
import pytest
from support import fault_backend, metric, wait_until

from openclaw_rl.servers import BackgroundServer


def lifespan_app(handler: Any) -> Any:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await handler(send)
    return app


def in_thread(fn: Any) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = fn()
        except Exception as e:  # noqa: BLE001 - the test inspects it
            result["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_request_running_at_shutdown_gets_503_not_500(caplog):
    entered = threading.Event()

    async def hang(send: Any) -> None:
        entered.set()
        await asyncio.sleep(60)

    server = BackgroundServer(lifespan_app(hang), graceful_shutdown_s=0.2).start()
    thread, result = in_thread(lambda: httpx.get(server.url, timeout=30))
    assert entered.wait(30)
    with caplog.at_level(logging.WARNING, logger="openclaw_rl.servers"):
        server.stop()
    thread.join(30)
    r = result["value"]
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "service_unavailable" and "shutting down" in r.json()["error"]["message"]
    assert any("answered 503" in rec.getMessage() for rec in caplog.records)


def test_stream_running_at_shutdown_is_cut_not_ended_cleanly():
    entered = threading.Event()

    async def stream_then_hang(send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        entered.set()
        await asyncio.sleep(60)

    def read_stream() -> list[str]:
        with httpx.stream("GET", server.url, timeout=30) as r:
            return list(r.iter_lines())

    server = BackgroundServer(lifespan_app(stream_then_hang), graceful_shutdown_s=0.2).start()
    thread, result = in_thread(read_stream)
    assert entered.wait(30)
    server.stop()
    thread.join(30)
    assert isinstance(result.get("error"), httpx.RemoteProtocolError)  # a truncated stream never looks complete


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
def test_proxy_stopped_mid_turn_answers_503_and_counts_the_drop(tmp_path, tiny_model_dir, tokenizer, stream):
    from openclaw_rl.config import load_settings
    from openclaw_rl.server import Proxy

    with fault_backend(tokenizer=tokenizer) as backend:
        backend.plan = [{"delay": 60}]
        settings = load_settings({"proxy_tokenizer": str(tiny_model_dir), "proxy_policy_url": backend.url,
                                  "spool_dir": str(tmp_path / "spool")}, env={})
        proxy = Proxy.build(settings, tokenizer=tokenizer)
        server = BackgroundServer(proxy.app, graceful_shutdown_s=0.2).start()
        body = {"messages": [{"role": "user", "content": "hello"}], "stream": stream}
        thread, result = in_thread(lambda: httpx.post(f"{server.url}/v1/chat/completions", json=body,
                                                      headers={"X-Session-Id": "s"}, timeout=30))
        wait_until(lambda: backend.calls)  # the turn's /generate is in flight
        server.stop()
        proxy.writer.close()
        thread.join(30)
        r = result["value"]
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
        wait_until(lambda: backend.hung_up == 1)  # the backend call nobody waits for was hung up
        assert metric(proxy, "openclaw_turns_dropped_total", reason="client_disconnected") == 1


def test_a_request_finishing_within_the_grace_period_completes_before_the_lifespan_ends(caplog):
    """``PromptStopServer`` keeps uvicorn's shutdown rules with its own 5 ms checks: a request that ends
    within the grace period is answered in full, the app's lifespan shutdown runs after it, nothing is
    cancelled, and an idle keep-alive connection does not hold the stop for the whole grace period."""
    events: list[str] = []
    entered = threading.Event()

    async def slow_ok(send: Any) -> None:
        entered.set()
        await asyncio.sleep(0.3)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"done"})
        events.append("answered")

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            events.append("lifespan shutdown")
            await send({"type": "lifespan.shutdown.complete"})
            return
        await slow_ok(send)

    server = BackgroundServer(app, graceful_shutdown_s=30).start()
    with httpx.Client(timeout=30) as idle:
        assert idle.get(server.url).text == "done"  # leaves a pooled keep-alive connection open
        wait_until(lambda: events == ["answered"])  # the handler records it after the client has read it
        events.clear()
        entered.clear()
        thread, result = in_thread(lambda: httpx.get(server.url, timeout=30))
        assert entered.wait(30)
        with caplog.at_level(logging.WARNING, logger="openclaw_rl.servers"):
            server.stop()  # joins for 10 s, then forces the exit: inside the 30 s grace only if nothing held it
        assert not server._server.force_exit  # the idle connection was closed, not waited out
        thread.join(30)
    assert result["value"].status_code == 200 and result["value"].text == "done"
    assert events == ["answered", "lifespan shutdown"]
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    assert not server.running


@pytest.mark.parametrize("how", ["stop", "signal", "flag"])
def test_a_stop_or_a_signal_wakes_the_main_loop_without_waiting_for_its_tick(how):
    """With the main loop's tick set to an hour, only the wake can end it: ``stop()``, SIGINT/SIGTERM
    (``handle_exit``, as uvicorn's signal handlers call it) and ``should_exit = True`` alone (how a worker whose
    owner is gone, or uvicorn itself, asks) all stop the server (and run its lifespan shutdown)."""
    import signal

    events: list[str] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        assert scope["type"] == "lifespan"
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        events.append("lifespan shutdown")
        await send({"type": "lifespan.shutdown.complete"})

    server = BackgroundServer(app)
    server._server.TICK_S = 3600.0
    server.start()
    wait_until(lambda: server._server._waiter is not None)  # the main loop is waiting
    if how == "stop":
        server.stop(timeout=20)
    elif how == "flag":
        server._server.should_exit = True
        server._thread.join(20)
    else:
        server._server.handle_exit(signal.SIGTERM, None)
        server._thread.join(20)
    assert not server.running and events == ["lifespan shutdown"]
