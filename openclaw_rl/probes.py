"""Cached reachability of the policy engines and the judge, refreshed in the background for ``/healthz``.

Stage: proxy (health). ``/healthz`` must answer at once, whatever a backend does, so it reads this cache;
the refresh also teaches the proxy and the judge client their servers' context lengths, and tells an
engine pool (``engines.py``) which engines answer again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx

from .backend import probe_backend
from .config import Settings
from .engines import EnginePool, router_workers, split_urls
from .judge import JudgeClient
from .metrics import ProxyMetrics
from .serving import ChatService

log = logging.getLogger(__name__)


class BackendProbes:
    """Cached reachability (and context length) of the policy and judge servers, refreshed in the
    background every ``probe_interval_s``: ``/healthz`` reads the cache and never waits on a backend."""

    def __init__(self, http: httpx.AsyncClient, settings: Settings, service: ChatService, judge: JudgeClient,
                 metrics: ProxyMetrics):
        self.http, self.settings, self.service, self.judge, self.metrics = http, settings, service, judge, metrics
        self.state: dict[str, dict[str, Any]] = {}
        self.not_router = False  # the one policy URL is a plain engine, not an sglang-router
        self._task: asyncio.Task | None = None
        self.on_refresh: Callable[[], None] | None = None  # after each refresh (the context length may be new)

    async def refresh(self) -> None:
        p, j = self.settings.proxy, self.settings.judge
        policy_headers = {"Authorization": f"Bearer {p.policy_api_key}"} if p.policy_api_key else None
        urls = split_urls(p.policy_url)
        targets = [(f"policy#{i}", url, policy_headers) for i, url in enumerate(urls)]
        if self.judge.enabled:
            targets.append(("judge", j.url, self.judge.headers or None))
        pool = self.service.backend if isinstance(self.service.backend, EnginePool) else None
        started = pool.clock() if pool is not None else 0.0
        infos = await asyncio.gather(*(probe_backend(self.http, url, headers) for _, url, headers in targets))
        workers = None
        if len(urls) == 1 and not self.not_router:
            try:
                workers = await router_workers(self.http, urls[0], policy_headers)
            except httpx.HTTPError:
                pass  # no answer: asked again next time
            else:  # it answered, but not as a router: ask no more (SGLang would log a 404 each time)
                self.not_router = workers is None
        state = {name: {"reachable": info.reachable, "checked_at": time.time(), "context_length": info.context_length,
                        **({"error": info.error} if info.error else {})} for (name, _, _), info in zip(targets, infos)}
        engines = [{"url": url, **state.pop(f"policy#{i}")} for i, url in enumerate(urls)]
        for engine in engines:
            if pool is not None:
                pool.probed(engine["url"], {k: v for k, v in engine.items() if k != "url"}, started)
            self.metrics.policy_engine_up.labels(engine["url"]).set(1 if engine["reachable"] else 0)
        # the policy is up while one engine (or the router) answers; its context is the smallest engine's
        contexts = [e["context_length"] for e in engines if e["context_length"]]
        policy: dict[str, Any] = {"reachable": any(e["reachable"] for e in engines), "checked_at": time.time(),
                                  "context_length": min(contexts) if contexts else None}
        if not policy["reachable"]:
            policy["error"] = engines[0].get("error", "") if len(engines) == 1 else \
                "; ".join(f"{e['url']}: {e.get('error', '')}" for e in engines)
        if len(engines) > 1:
            policy["engines"] = pool.health() if pool is not None else engines
            policy["failovers"] = pool.failovers if pool is not None else 0
        if workers is not None:  # a router: the engines behind it, as it sees them
            policy["router_workers"] = workers
        self.state = {"policy": policy, **state}
        for name, info in self.state.items():
            self.metrics.backend_up.labels(name).set(1 if info["reachable"] else 0)
        if not p.context_length and policy["context_length"]:
            self.service.context_length = policy["context_length"]
        if "judge" in state and not j.context_length and state["judge"]["context_length"]:
            self.judge.context_length = state["judge"]["context_length"]
        if self.on_refresh is not None:
            self.on_refresh()

    def start(self) -> None:
        async def loop() -> None:
            while True:
                try:
                    await self.refresh()
                except Exception:  # noqa: BLE001 - a probe bug must not kill the loop
                    log.exception("backend probe failed")
                await asyncio.sleep(self.settings.proxy.probe_interval_s)
        self._task = asyncio.get_running_loop().create_task(loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
