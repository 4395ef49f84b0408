"""Several policy engines behind one proxy (``engines.py``, ``embedded/engine_sync.py``): each session stays
on one engine, a turn whose engine is down goes to another (counted), ``/healthz`` lists every engine, and
``train``'s weight sync reaches every engine (named, or listed by a router's ``/workers``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest
from support import metric, scripted_server

from openclaw_rl.config import load_settings
from openclaw_rl.engines import EnginePool, rendezvous_order, routing_key, split_urls


@contextmanager
def engines(tokenizer: Any, names: str = "AB") -> Iterator[list[Any]]:
    """Scripted engines, each replying with its own name (so a reply says which engine served it)."""
    with ExitStack() as stack:
        yield [stack.enter_context(scripted_server(tokenizer, lambda _p, n=name: f"engine {n} here"))
               for name in names]


def ask(url: str, session: str, text: str = "hello", stream: bool = False) -> str:
    body = {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 40, "stream": stream}
    resp = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-Id": session}, timeout=30)
    assert resp.status_code == 200, resp.text
    if stream:
        events = [json.loads(line[6:]) for line in resp.text.split("\n")
                  if line.startswith("data: {")]
        return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    return resp.json()["choices"][0]["message"]["content"]


def refresh(proxy: Any) -> None:
    """One probe round of /healthz's background probe, on the proxy's loop, awaited."""
    asyncio.run_coroutine_threadsafe(proxy.probes.refresh(), proxy.server.loop).result(30)


def served_by(reply: str) -> str:
    return "A" if "engine A" in reply else "B" if "engine B" in reply else "?"


def sessions_on_both(pool: EnginePool, n: int = 2) -> dict[str, list[str]]:
    """Session ids, ``n`` homed on each engine (found by the pool's own hashing: no luck involved)."""
    found: dict[str, list[str]] = {url: [] for url in pool.urls}
    i = 0
    while any(len(v) < n for v in found.values()):
        sid = f"s{i}"
        home = pool.home(routing_key(f"default\x1f{sid}"))
        if len(found[home]) < n:
            found[home].append(sid)
        i += 1
    return found


def test_rendezvous_order_is_stable_and_moves_only_a_removed_engines_keys():
    urls = ["http://a:1", "http://b:1", "http://c:1"]
    keys = [f"k{i}" for i in range(200)]
    homes = {k: urls[rendezvous_order(k, urls)[0]] for k in keys}
    assert homes == {k: urls[rendezvous_order(k, urls)[0]] for k in keys}  # deterministic
    assert set(homes.values()) == set(urls)
    left = [u for u in urls if u != "http://b:1"]
    for k in keys:  # without b: b's keys go to their second choice, every other key stays
        new_home = left[rendezvous_order(k, left)[0]]
        assert new_home == homes[k] or homes[k] == "http://b:1"


def test_policy_url_takes_several_engines():
    s = load_settings({"proxy_policy_url": ["http://a:1/", "http://b:2"]}, env={})
    assert split_urls(s.proxy.policy_url) == ["http://a:1", "http://b:2"]
    s = load_settings({"proxy_policy_url": "http://a:1, http://b:2"}, env={})
    assert split_urls(s.proxy.policy_url) == ["http://a:1", "http://b:2"]
    for bad in ("http://a:1,b:2", "http://a:1,http://a:1", "http://a:1,,http://b:2"):
        with pytest.raises(ValueError, match="openclaw_proxy_policy_url"):
            load_settings({"proxy_policy_url": bad}, env={})


@pytest.mark.parametrize("stream", [False, True])
def test_each_session_stays_on_one_engine(tokenizer, make_proxy, stream):
    with engines(tokenizer) as (a, b):
        proxy, url = make_proxy(f"{a.url},{b.url}")
        pool = proxy.service.backend
        assert isinstance(pool, EnginePool)
        by_home = sessions_on_both(pool)
        name = {a.url: "A", b.url: "B"}
        for turn in range(3):
            for home, sids in by_home.items():
                for sid in sids:
                    assert served_by(ask(url, sid, f"turn {turn}", stream=stream)) == name[home], (sid, turn)
        assert [s.requests for s in pool.states] == [6, 6]
        assert pool.failovers == 0


def test_a_down_engine_sends_its_sessions_to_the_other_counted(tokenizer, make_proxy):
    with engines(tokenizer) as (a, b):
        proxy, url = make_proxy(f"{a.url},{b.url}")
        pool = proxy.service.backend
        sid_b = sessions_on_both(pool, 1)[b.url][0]
        assert served_by(ask(url, sid_b)) == "B"
        b.stop()
        assert served_by(ask(url, sid_b, "again")) == "A"  # a 200, not a 502
        assert served_by(ask(url, sid_b, "stream", stream=True)) == "A"
        assert pool.failovers == 1  # the second turn skipped B: it was marked down by the first failure
        assert metric(proxy, "openclaw_policy_failovers_total", engine=b.url, reason="unreachable") == 1
        refresh(proxy)
        health = httpx.get(f"{url}/healthz").json()
        policy = health["backends"]["policy"]
        assert health["ok"] and policy["reachable"]  # one engine is enough to serve
        assert [(e["url"], e["reachable"]) for e in policy["engines"]] == [(a.url, True), (b.url, False)]
        assert policy["engines"][1]["marked_down"] and policy["engines"][1]["failures"] == 1
        assert policy["engines"][0]["failovers_in"] == 2 and policy["failovers"] == 1


def test_healthz_lists_every_engine(tokenizer, make_proxy):
    with engines(tokenizer) as (a, b):
        proxy, url = make_proxy(f"{a.url},{b.url}")
        refresh(proxy)
        policy = httpx.get(f"{url}/healthz").json()["backends"]["policy"]
        assert [e["url"] for e in policy["engines"]] == [a.url, b.url]
        assert all(e["reachable"] and e["context_length"] == 65536 for e in policy["engines"])
        assert policy["reachable"] and policy["context_length"] == 65536
        assert metric(proxy, "openclaw_policy_engine_up", engine=b.url) == 1
        b.stop()
        refresh(proxy)
        assert [e["reachable"] for e in httpx.get(f"{url}/healthz").json()["backends"]["policy"]["engines"]] == \
            [True, False]


def test_one_engine_keeps_the_plain_backend(policy_server, make_proxy):
    from openclaw_rl.backend import PolicyBackend

    proxy, url = make_proxy(policy_server.url)
    assert type(proxy.service.backend) is PolicyBackend
    refresh(proxy)
    policy = httpx.get(f"{url}/healthz").json()["backends"]["policy"]
    assert "engines" not in policy and "router_workers" not in policy
    assert proxy.probes.not_router  # the engine answered /workers with 404: not asked again


@contextmanager
def fake_router(workers: list[str]) -> Iterator[Any]:
    """sglang-router's ``GET /workers`` answer (the shape 0.3.2 gives) and nothing else."""
    from fastapi import FastAPI

    from openclaw_rl.servers import BackgroundServer

    app = FastAPI()

    @app.get("/workers")
    async def listed() -> dict[str, Any]:
        return {"workers": [{"id": str(i), "url": w, "is_healthy": True, "load": 0} for i, w in enumerate(workers)],
                "total": len(workers)}

    with BackgroundServer(app) as server:
        yield server


@pytest.mark.parametrize("through_router", [False, True])
def test_weight_sync_reaches_every_engine(tokenizer, tmp_path, through_router):
    from openclaw_rl.embedded.engine_sync import FanOutWeightSync, weight_sync_for

    with engines(tokenizer) as (a, b), ExitStack() as stack:
        policy_url = f"{a.url},{b.url}"
        if through_router:
            policy_url = stack.enter_context(fake_router([a.url, b.url])).url
        sync = weight_sync_for(policy_url, tmp_path / "w")
        try:
            assert isinstance(sync, FanOutWeightSync)
            assert [e.url for e in sync.engines] == [a.url, b.url]
            assert sync.server_version() == "default"
            sync.load_all(tmp_path / "w" / "step-1", "step-1")
            assert (a.model.weight_updates, b.model.weight_updates) == (1, 1)
            assert sync.server_version() == "step-1"
            assert [e.version for e in sync.engines] == ["step-1", "step-1"]  # each engine's guard restores it
            for server in (a, b):  # each engine was resumed after its update
                assert httpx.post(f"{server.url}/generate", json={"text": "hi", "sampling_params": {
                    "max_new_tokens": 2}}, timeout=10).status_code == 200
        finally:
            sync.close()


def test_weight_sync_fails_when_an_engine_is_down(tokenizer, tmp_path):
    from openclaw_rl.embedded.engine_sync import FanOutWeightSync
    from openclaw_rl.embedded.weight_sync import WeightSyncError

    with engines(tokenizer) as (a, b):
        sync = FanOutWeightSync([a.url, b.url], tmp_path / "w")
        b.stop()
        try:
            with pytest.raises(WeightSyncError, match=f"1 of 2 policy engines.*{b.url}"):
                sync.load_all(tmp_path / "w" / "step-1", "step-1", wait_s=0)
            assert a.model.weight_updates == 1
        finally:
            sync.close()


def test_a_plain_server_is_one_engine(tokenizer, tmp_path):
    from openclaw_rl.embedded.engine_sync import weight_sync_for
    from openclaw_rl.embedded.weight_sync import SGLangWeightSync

    with engines(tokenizer, "A") as (a,):
        sync = weight_sync_for(a.url, tmp_path / "w")  # the engine answers /workers with 404: not a router
        try:
            assert type(sync) is SGLangWeightSync and sync.url == a.url
        finally:
            sync.close()


def test_an_engine_still_down_after_the_retry_time_is_skipped_again(tokenizer):
    """Past ``DOWN_RETRY_S`` a down engine is tried again; when it still refuses, it is marked down anew
    (one more failover, not one per turn from then on). The clock is the pool's own: no waiting."""
    from openclaw_rl.backend import PolicyBackend
    from openclaw_rl.engines import DOWN_RETRY_S
    from openclaw_rl.servers import free_port

    now = [1000.0]
    with engines(tokenizer, "A") as (a,):
        dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there

        async def run() -> list[int]:
            async with httpx.AsyncClient() as http:
                pool = EnginePool([PolicyBackend(http, a.url), PolicyBackend(http, dead)], clock=lambda: now[0])
                key = next(k for k in (f"k{i}" for i in range(100)) if pool.home(k) == dead)
                payload = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}, "return_logprob": True}
                seen = []
                for step in (0.0, DOWN_RETRY_S + 1, 1.0):
                    now[0] += step
                    await pool.generate(payload, key)
                    seen.append(pool.failovers)
                await pool.aclose()
                return seen

        assert asyncio.run(run()) == [1, 2, 2]
