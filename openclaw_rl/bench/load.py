"""Drive a proxy with S concurrent multi-turn sessions, like many OpenClaw users at once.

Each session sends T sequential turns; turn t+1's last user message ("thanks …") is turn t's next
state. Every request is bounded by a timeout and the whole run by the session count, so the generator
always stops by itself. Used by the load test (reduced) and ``scripts/load_test.py`` (full size).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx


@dataclass
class LoadReport:
    sessions: int
    turns: int
    ok: int = 0
    errors: Counter = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def turns_per_s(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return 0.0
        data = sorted(self.latencies)
        return data[min(len(data) - 1, int(q * len(data)))]


async def _session(client: httpx.AsyncClient, url: str, sid: str, turns: int, report: LoadReport,
                   tools: list | None, done: bool) -> None:
    history: list[dict] = [{"role": "system", "content": "You are a helpful agent."},
                           {"role": "user", "content": f"session {sid}: please help with task 0"}]
    for t in range(turns):
        headers = {"X-Session-Id": sid}
        if done and t == turns - 1:
            headers["X-Session-Done"] = "1"
        start = time.perf_counter()
        try:
            r = await client.post(f"{url}/v1/chat/completions", headers=headers,
                                  json={"model": "policy", "messages": history, "tools": tools, "max_tokens": 64})
        except httpx.HTTPError as e:
            report.errors[type(e).__name__] += 1
            return
        if r.status_code != 200:
            report.errors[str(r.status_code)] += 1
            return
        report.latencies.append(time.perf_counter() - start)
        report.ok += 1
        history += [r.json()["choices"][0]["message"],
                    {"role": "user", "content": f"thanks, that worked. Now task {t + 1}"}]


async def run_load(url: str, *, sessions: int, turns: int, concurrency: int | None = None, tools: list | None = None,
                   session_done: bool = False, timeout_s: float = 120.0) -> LoadReport:
    report = LoadReport(sessions, turns)
    limits = httpx.Limits(max_connections=concurrency or sessions, max_keepalive_connections=concurrency or sessions,
                          keepalive_expiry=2.0)
    gate = asyncio.Semaphore(concurrency or sessions)

    async def one(i: int) -> None:
        async with gate:
            await _session(client, url, f"load-{i}", turns, report, tools, session_done)

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits, trust_env=False) as client:
        await asyncio.gather(*(one(i) for i in range(sessions)))
    report.seconds = time.perf_counter() - start
    return report
