"""The proxy in front of the real sglang-router (PyPI ``sglang-router``, the ``router`` extra) and two
scripted engines: every turn of a session reaches the engine that served its first turn, ``/healthz``
lists the router's workers, and ``train``'s weight sync finds them through the router's ``/workers``.
Skipped when the package is not installed (``pip install -e .[router]``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
import pytest
from support import scripted_server

pytest.importorskip("sglang_router", reason="sglang-router is not installed: pip install -e .[router]")

from openclaw_rl.servers import free_port  # noqa: E402


@contextmanager
def router(worker_urls: list[str], policy: str = "manual") -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                             "--port", str(port), "--worker-urls", *worker_urls, "--policy", policy,
                             "--assignment-mode", "min_group", "--prometheus-port", str(free_port()),
                             "--log-level", "warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # the router's own readiness: no event to wait on across processes
            try:
                workers = httpx.get(f"{url}/workers", timeout=2).json().get("workers", [])
                if len(workers) == len(worker_urls) and all(w.get("is_healthy") for w in workers):
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert proc.poll() is None, f"sglang-router exited with {proc.returncode}"
            assert time.monotonic() < deadline, "sglang-router did not list its workers within 60 s"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def test_sessions_stick_to_one_engine_behind_the_real_router(tokenizer, make_proxy, tmp_path):
    from openclaw_rl.embedded.engine_sync import FanOutWeightSync, weight_sync_for

    with ExitStack() as stack:
        a, b = (stack.enter_context(scripted_server(tokenizer, lambda _p, n=name: f"engine {n} here"))
                for name in "AB")
        router_url = stack.enter_context(router([a.url, b.url]))
        proxy, url = make_proxy(router_url)
        served: dict[str, set[str]] = {}
        for turn in range(3):
            for s in range(6):
                resp = httpx.post(f"{url}/v1/chat/completions", headers={"X-Session-Id": f"s{s}"}, timeout=30,
                                  json={"model": "tiny", "max_tokens": 20,
                                        "messages": [{"role": "user", "content": f"turn {turn}"}]})
                assert resp.status_code == 200, resp.text
                served.setdefault(f"s{s}", set()).add(resp.json()["choices"][0]["message"]["content"][:8])
        assert all(len(engines) == 1 for engines in served.values()), served  # one engine per session
        assert set().union(*served.values()) == {"engine A", "engine B"}  # min_group: both hold sessions
        asyncio.run_coroutine_threadsafe(proxy.probes.refresh(), proxy.server.loop).result(30)
        policy = httpx.get(f"{url}/healthz").json()["backends"]["policy"]
        assert policy["reachable"]
        assert sorted(w["url"] for w in policy["router_workers"]) == sorted([a.url, b.url])
        assert all(w["healthy"] for w in policy["router_workers"])
        sync = weight_sync_for(router_url, tmp_path / "w")  # the router's workers, each synced directly
        try:
            assert isinstance(sync, FanOutWeightSync)
            assert sorted(e.url for e in sync.engines) == sorted([a.url, b.url])
            sync.load_all(tmp_path / "w" / "step-1", "step-1")
            assert (a.model.weight_updates, b.model.weight_updates) == (1, 1)
        finally:
            sync.close()

