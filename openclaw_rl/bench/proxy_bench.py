"""``openclaw-rl bench``: what the proxy costs on top of SGLang, measured on loopback.

The proxy's cost is small next to a model's, so it is measured as a *difference*: every turn goes
through the proxy (OpenAI messages + a dozen tools, as OpenClaw sends them) and, in the same run,
"direct": ``/generate`` with the ids the proxy renders (pre-rendered with the same tokenizer and
template) sent to the mock the proxy talks to, so "added" latency (proxy - direct) is the proxy's own;
"floor" (c=16): the same bytes from a lean replay server (``replay.py``), with nothing in between, so
``b_proxy_over_floor`` is how much of the fastest possible throughput the proxy keeps. Mocks and proxy are separate processes
(``processes.Stack``): the proxy's CPU and RSS come from ``/proc/<pid>`` alone. Configurations: (a) zero-
latency mock, concurrency 1; (b) the same at concurrency C (throughput); (c) a model-like mock (50 ms
to the first token, then 100 tokens/s) at C; streaming TTFT at concurrency 1, model-like; then, on a
fresh proxy, RSS per idle session (one parked turn) and per live one (a request in flight). The
judge runs in all (m votes). A benchmark, not a test: targets are printed PASS/MISS, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from openclaw_rl.bench import mock, processes, replay
from openclaw_rl.bench.loadclient import LoadClient, LoadClientError
from openclaw_rl.bench.mock import Case
from openclaw_rl.bench.processes import Stack
from openclaw_rl.bench.report import BUCKETS, METRIC_KEYS, plot, print_report, verdicts
from openclaw_rl.bench.stream_cost import MODES as STREAM_MODES
from openclaw_rl.config import ProxySettings

JSON = mock.JSON_HEADERS


@dataclass(frozen=True)
class BenchConfig:
    sessions: int = 32
    turns: int = 16
    concurrency: int = 16
    max_history_tokens: int = 8192
    reply_tokens: int = 64
    stream_pairs: int = 24
    idle_sessions: int = 400
    live_sessions: int = 200
    real_ttft_ms: float = 50.0
    real_tokens_per_s: float = 100.0
    judge_votes: int = 3
    seed: int = 0


# --quick checks that every phase runs and every metric is measured, not what they measure: its model-like mock
# answers 5x faster (10 ms TTFT, 500 tokens/s), so the smoke test spends ~1 s instead of ~7 s asleep in those phases.
QUICK = BenchConfig(sessions=2, turns=8, max_history_tokens=6800, reply_tokens=16, stream_pairs=4, idle_sessions=24,
                    live_sessions=24, real_ttft_ms=10.0, real_tokens_per_s=500.0)


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile, None when there is nothing to rank."""
    data = sorted(values)
    return data[max(0, math.ceil(q * len(data)) - 1)] if data else None


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 3)


class Bench:
    """The phases and measurements of one run; ``self.stack`` is the process set under test."""

    def __init__(self, cfg: BenchConfig, new_stack: Any):
        self.cfg, self.new_stack = cfg, new_stack
        self.metrics: dict[str, Any] = {}
        self.details: dict[str, Any] = {"phase_seconds": {}}
        self.checks: Counter[str] = Counter()
        self.reply = mock.reply_text(cfg.reply_tokens)
        # run()'s clients: httpx for health checks and knobs, the lean one for the measured turns
        self.http: httpx.AsyncClient
        self.load: LoadClient

    def _request(self, case: Case, sid: str | None, done: bool, stream: bool,
                 floor: bool = False) -> tuple[str, bytes, dict[str, str]]:
        """Through the proxy when ``sid`` is given (OpenAI body), else straight to the mock the proxy talks to
        (token ids: "added" latency is the proxy's own), or with ``floor`` to the replay of its bytes."""
        n, stack = self.cfg.reply_tokens, self.stack
        if sid is None:
            return f"{stack.direct_url if floor else stack.policy_url}/generate", mock.generate_body(case, n, stream), JSON
        headers = {**JSON, "X-Session-Id": sid, **({"X-Session-Done": "1"} if done else {})}
        return f"{stack.proxy_url}/v1/chat/completions", mock.chat_body(case, n, stream), headers

    async def post(self, case: Case, sid: str | None, done: bool = False, floor: bool = False) -> float | None:
        """One non-streaming turn; seconds, or None (counted) when it failed."""
        url, body, headers = self._request(case, sid, done, False, floor)
        start = time.perf_counter()
        try:
            raw = await self.load.post(url, body, headers)
        except LoadClientError as e:  # counted, reported under "checks"
            self.checks[f"error {type(e).__name__}"] += 1
            return None
        elapsed = time.perf_counter() - start
        if sid:  # the comparison is only fair if the proxy rendered the very same ids
            data = json.loads(raw)
            self.checks["prompt_token_mismatches"] += data["usage"]["prompt_tokens"] != len(case.ids)
            self.checks["content_mismatches"] += data["choices"][0]["message"]["content"] != self.reply
        return elapsed

    async def ttft(self, case: Case, sid: str | None, done: bool) -> float | None:
        """Seconds to the first SSE chunk that carries output (through the proxy: a non-empty delta)."""
        url, body, headers = self._request(case, sid, done, True)
        first, start = None, time.perf_counter()
        try:
            async for line in self.load.post_lines(url, body, headers):
                if first is not None or not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                    continue
                delta = ((json.loads(line[5:]).get("choices") or [{}])[0].get("delta") or {}) if sid else {}
                if not sid or delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                    first = time.perf_counter() - start
        except LoadClientError as e:
            self.checks[f"error {type(e).__name__}"] += 1
        return first

    async def turn_major(self, cases: list[list[Case]], tag: str, stream: bool,
                         marks: list[float]) -> tuple[list[float], list[float], list[float]]:
        """Concurrency 1, turn 1 of every session, then turn 2, …; each turn direct, then through the proxy.
        Turn-major keeps one history size contiguous; ``marks`` gets the proxy's CPU before each proxy turn."""
        prox, dire, added = [], [], []
        send = self.ttft if stream else self.post
        for t in range(self.cfg.turns):
            for s, session in enumerate(cases):
                d = await send(session[t], None, False)
                marks.append(processes.cpu_seconds_fine(self.pid))
                p = await send(session[t], f"{tag}-{s}", t == self.cfg.turns - 1)
                prox += [p] if p is not None else []
                dire += [d] if d is not None else []
                added += [p - d] if p is not None and d is not None else []
        return prox, dire, added

    async def sequential(self, cases: list[list[Case]]) -> None:
        """(a): each proxy turn is bracketed by CPU readings, so its judge votes and spool writes count to it."""
        marks: list[float] = []
        cpu0 = processes.cpu_seconds(self.pid)
        prox, dire, added = await self.turn_major(cases, "a", False, marks)
        await self.stack.settle()
        marks.append(processes.cpu_seconds_fine(self.pid))
        self._summarise("a", added, prox, dire, sum(prox), sum(dire), processes.cpu_seconds(self.pid) - cpu0)
        # CPU by history size; turn 1 is left out: it carries no judgement of an earlier turn
        order = [(s, t) for t in range(self.cfg.turns) for s in range(len(cases))]
        points = [(len(cases[s][t].ids), marks[i + 1] - marks[i]) for i, (s, t) in enumerate(order) if t > 0]
        m = self.metrics
        for name, lo, hi in BUCKETS:
            sel = [(h, x) for h, x in points if lo <= h < hi]
            m[f"cpu_ms_per_turn_{name}"] = ms(sum(x for _, x in sel) / len(sel)) if sel else None
            m[f"history_tokens_{name}"] = round(sum(h for h, _ in sel) / len(sel)) if sel else None
        low, high = m["cpu_ms_per_turn_2k"], m["cpu_ms_per_turn_8k"]
        m["cpu_growth_8k_over_2k"] = round(high / low, 3) if low and high else None
        xs, ys = [h for h, _ in points], [x for _, x in points]
        m["cpu_ms_per_1k_history_tokens"] = round(statistics.linear_regression(xs, ys).slope * 1e6, 4) \
            if len(set(xs)) > 1 else None
        self.details["cpu_points_tokens_ms"] = [(h, round(x * 1e3, 3)) for h, x in points]

    async def drive(self, cases: list[list[Case]], tag: str | None, floor: bool = False
                    ) -> tuple[dict[tuple[int, int], float], float]:
        """C workers, each running whole sessions turn after turn, as C users would; direct if no tag (to
        the replay server with ``floor``)."""
        lat: dict[tuple[int, int], float] = {}
        queue = iter(range(len(cases)))

        async def worker() -> None:
            for s in queue:
                for t, case in enumerate(cases[s]):
                    dt = await self.post(case, f"{tag}-{s}" if tag else None, t == len(cases[s]) - 1, floor)
                    lat.update({(s, t): dt} if dt is not None else {})

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(self.cfg.concurrency)))
        return lat, time.perf_counter() - start

    async def concurrent(self, cases: list[list[Case]], tag: str) -> None:
        """(b)/(c): all sessions direct, then all through the proxy; added latency is paired per turn."""
        direct, direct_wall = await self.drive(cases, None)
        await self.stack.settle()
        cpu0 = processes.cpu_seconds(self.pid)
        proxy, proxy_wall = await self.drive(cases, tag)
        await self.stack.settle()
        added = [proxy[k] - direct[k] for k in proxy if k in direct]
        self._summarise(tag, added, list(proxy.values()), list(direct.values()), proxy_wall, direct_wall,
                        processes.cpu_seconds(self.pid) - cpu0)
        if tag == "b":  # the floor: the same bytes from the lean replay server, with nothing in between
            floor, floor_wall = await self.drive(cases, None, floor=True)
            m = self.metrics
            m["b_floor_turns_per_s"] = round(len(floor) / floor_wall, 2) if floor_wall else None
            m["b_proxy_over_floor"] = round(m["b_turns_per_s"] / m["b_floor_turns_per_s"], 4) \
                if m["b_floor_turns_per_s"] and m["b_turns_per_s"] else None

    def _summarise(self, tag: str, added: list[float], prox: list[float], dire: list[float], proxy_wall: float,
                   direct_wall: float, cpu_s: float) -> None:
        m = self.metrics
        m.update({f"{tag}_added_p{q}_ms": ms(pct(added, q / 100)) for q in (50, 95, 99)})
        for name, values in (("proxy", prox), ("direct", dire)):
            m[f"{tag}_{name}_p50_ms"], m[f"{tag}_{name}_p99_ms"] = ms(pct(values, 0.5)), ms(pct(values, 0.99))
        if tag == "stream_ttft":
            return
        m[f"{tag}_turns_per_s"] = round(len(prox) / proxy_wall, 2) if proxy_wall else None
        m[f"{tag}_direct_turns_per_s"] = round(len(dire) / direct_wall, 2) if direct_wall else None
        direct_tps = m[f"{tag}_direct_turns_per_s"]
        m[f"{tag}_proxy_over_direct"] = round(m[f"{tag}_turns_per_s"] / direct_tps, 4) if direct_tps else None
        m[f"{tag}_cpu_ms_per_turn"] = ms(cpu_s / len(prox)) if prox else None
        m[f"{tag}_turns"], m[f"{tag}_errors"] = len(prox), self.cfg.sessions * self.cfg.turns - len(prox)

    async def streaming(self, cases: list[list[Case]]) -> None:
        """TTFT at concurrency 1 with the model-like mock, on the first sessions (``stream_pairs`` turns)."""
        k = max(1, math.ceil(self.cfg.stream_pairs / self.cfg.turns))
        prox, dire, added = await self.turn_major(cases[:k], "stream", True, [])
        self._summarise("stream_ttft", added, prox, dire, 0.0, 0.0, 0.0)
        self.metrics["stream_pairs"] = len(added)

    async def memory(self, cases: list[list[Case]]) -> None:
        """RSS per session on a fresh proxy: ``idle_sessions`` each left holding one parked turn (answered,
        waiting for its next state), then ``live_sessions`` each with a request held in the paused mock."""
        c, gate = self.cfg, asyncio.Semaphore(self.cfg.concurrency)
        picks = [cases[i % len(cases)][c.turns // 2] for i in range(max(c.idle_sessions, c.live_sessions))]

        async def idle(i: int) -> None:
            async with gate:
                await self.post(picks[i], f"idle-{i}")

        rss = [processes.rss_kb(self.pid)]
        await asyncio.gather(*(idle(i) for i in range(c.idle_sessions)))
        await self.stack.settle()
        rss.append(processes.rss_kb(self.pid))
        await self.http.post(f"{self.stack.policy_url}/pause_generation")
        live = [asyncio.ensure_future(self.post(picks[i], f"live-{i}")) for i in range(c.live_sessions)]
        deadline = time.monotonic() + 120  # until every live request has reached the proxy's session tracker
        while (await self.http.get(f"{self.stack.proxy_url}/healthz")).json()["pending_turns"] < \
                c.idle_sessions + c.live_sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await self.stack.settle()
        rss.append(processes.rss_kb(self.pid))
        await self.http.post(f"{self.stack.policy_url}/continue_generation")
        await asyncio.gather(*live)
        prompt = len(picks[0].ids)
        token_bytes = prompt * 4 + (c.reply_tokens + 1) * 12  # array('i') prompt + response ids + float64 log-probs
        idle_kb, live_kb = (rss[1] - rss[0]) / c.idle_sessions, (rss[2] - rss[1]) / c.live_sessions
        self.metrics.update(rss_baseline_kb=rss[0], idle_sessions=c.idle_sessions, live_sessions=c.live_sessions,
                            idle_session_kb=round(idle_kb, 2), live_session_kb=round(live_kb, 2),
                            idle_session_net_kb=round(idle_kb - token_bytes / 1024, 2),
                            live_session_net_kb=round(live_kb - prompt * 4 / 1024, 2))
        self.details["memory"] = {"rss_kb": rss, "history_tokens": prompt, "token_bytes": token_bytes}

    async def run(self, cases: list[list[Case]]) -> None:
        c, real = self.cfg, (self.cfg.real_ttft_ms, self.cfg.real_tokens_per_s)
        limits = httpx.Limits(max_connections=c.live_sessions + c.concurrency + 8, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=120, limits=limits, trust_env=False) as http, LoadClient(120.0) as load:
            self.http, self.load = http, load
            self.stack = self.new_stack()
            try:
                await self.stack.start(http)
                k = max(1, math.ceil(c.stream_pairs / c.turns))  # the streaming phase's sessions
                await replay.prime(load, self.stack.direct_url,
                                   [*(mock.generate_body(x, c.reply_tokens, False) for s in cases for x in s),
                                    *(mock.generate_body(x, c.reply_tokens, True) for s in cases[:k] for x in s)])
                for phases in ((("a", (0, 0)), ("b", (0, 0)), ("c", real), ("stream", real)), (("memory", (0, 0)),)):
                    if phases[0][0] == "memory":  # a fresh proxy (its heap untouched), the same mocks
                        await self.stack.restart_proxy(http)
                    self.pid = self.stack.proxy_pid
                    for s in range(min(2, len(cases))):  # warm-up: template compile, pools, first calls
                        for t in range(min(2, c.turns)):
                            await self.post(cases[s][t], None)
                            await self.post(cases[s][t], f"warm-{s}", t == min(2, c.turns) - 1)
                    for tag, (ttft_ms, rate) in phases:
                        await self.phase(http, cases, tag, ttft_ms, rate)
            finally:
                self.stack.stop()

    async def phase(self, http: httpx.AsyncClient, cases: list[list[Case]], tag: str, ttft_ms: float,
                    rate: float) -> None:
        for url in (self.stack.policy_url, self.stack.judge_url, self.stack.direct_url):  # direct: paced alike
            await http.post(f"{url}/bench/latency", json={"ttft_ms": ttft_ms, "tokens_per_s": rate})
        await self.stack.settle()
        started, cpu0 = time.perf_counter(), self.stack.cpu()
        phase = {"a": self.sequential, "stream": self.streaming, "memory": self.memory}.get(tag)
        await (phase(cases) if phase else self.concurrent(cases, tag))
        self.details["phase_seconds"][tag] = round(time.perf_counter() - started, 2)
        self.details.setdefault("phase_cpu_s", {})[tag] = {k: round(v - cpu0[k], 2) for k, v in self.stack.cpu().items()}
        print(f"bench: phase {tag} took {self.details['phase_seconds'][tag]} s", file=sys.stderr)


def run_bench(cfg: BenchConfig, tokenizer_dir: str, out: str = "", plot_path: str = "",
              profile_proxy: str = "", proxy_port: int | None = None) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    cases = mock.build_workload(tokenizer, sessions=cfg.sessions, turns=cfg.turns, reply_tokens=cfg.reply_tokens,
                                max_history_tokens=cfg.max_history_tokens, seed=cfg.seed)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-") as tmp:  # logs and spools; only one proxy profiled
        bench = Bench(cfg, lambda: Stack(tokenizer_dir, Path(tmp), reply_tokens=cfg.reply_tokens,
                                         judge_votes=cfg.judge_votes, profile_proxy=profile_proxy,
                                         proxy_port=proxy_port))
        asyncio.run(bench.run(cases))
    metrics = {k: bench.metrics.get(k) for k in METRIC_KEYS}
    results = {"load_average_start": load_start, "load_average_end": os.getloadavg(), "metrics": metrics, "targets": verdicts(metrics), "config": asdict(cfg), "checks": dict(bench.checks),
               "details": bench.details, "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                                     "platform": platform.platform()}}
    for path in filter(None, (out, plot_path)):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    if out:
        Path(out).write_text(json.dumps(results, indent=2) + "\n")
    if plot_path:
        plot(results, plot_path)
    return results


def add_bench_flags(p: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    p.add_argument("--quick", action="store_true", help="a small run (seconds), for smoke tests; its model-like mock is 5x faster")
    p.add_argument("--out", default="runs/bench/results.json", help="JSON results")
    p.add_argument("--plot", default="runs/bench/bench.png", help="PNG chart")
    p.add_argument("--tokenizer", default="", help="tokenizer dir (default: the tiny model's, built offline)")
    for name in ("sessions", "turns", "concurrency", "max_history_tokens", "reply_tokens", "stream_pairs",
                 "idle_sessions", "live_sessions", "seed"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=f"default {getattr(d, name)}")
    p.add_argument("--profile-proxy", default="", help="run the proxy under cProfile and write its stats here (a path ending in .folded: under py-spy, "
                        "collapsed stacks; .pstat: yappi's CPU clock over all threads, start-up left out; "
                        "--stream-cost writes one file per mode)")
    p.add_argument("--port", type=int, default=None, help="the proxy's port on 127.0.0.1 (default: a free one)")
    p.add_argument("--stream-cost", action="store_true",
                   help="only measure CPU per streamed turn at 64-8,192-token replies in both SGLang stream modes")
    p.add_argument("--stream-ttft-ms", type=float, default=0.0,
                   help="paced streams (--stream-cost, --compare-upstream): the policy mock's and the direct replay's "
                        "delay to the first token; 0 with no rate: instant")
    p.add_argument("--stream-tokens-per-s", type=float, default=0.0,
                   help="paced streams: tokens per second after the first (0: instant); a zero-latency stream "
                        "understates what streaming costs the proxy")
    p.add_argument("--stream-lengths", default="64,512,2048,8192", help="reply lengths for --stream-cost")
    p.add_argument("--stream-scale", type=float, default=1.0, help="turns per length x this (--stream-cost)")
    p.add_argument("--stream-modes", type=_stream_modes, default=STREAM_MODES,
                   help=f"SGLang stream modes for --stream-cost, comma-separated (default {','.join(STREAM_MODES)})")
    p.add_argument("--proxy-env", action="append", default=[], metavar="KEY=VALUE", type=_key_value,
                   help="environment of the proxy under test (--stream-cost), e.g. OPENCLAW_RL_JSON=json or "
                        "OPENCLAW_RL_UVICORN_LOOP=asyncio / OPENCLAW_RL_UVICORN_HTTP=h11 to measure what they buy")
    p.add_argument("--stream-interval", type=int, default=ProxySettings.stream_interval,
                   help="the proxy's --stream-interval (tokens per SGLang stream event; 0 or 1: one per token) for "
                        "--stream-cost and --compare-upstream; default the proxy's own")
    p.add_argument("--compare-upstream", default="", metavar="PATH",
                   help="run upstream's proxy from this Gen-Verse/OpenClaw-RL checkout side by side with this one")
    p.add_argument("--compare-reps", type=int, default=2, help="interleaved repetitions per configuration")
    p.add_argument("--compare-configs", default="", metavar="NAMES",
                   help='only these configurations, ";"-separated, e.g. "c=1 hist=1K plain reply=64"')


def _stream_modes(text: str) -> tuple[str, ...]:
    """``--stream-modes``: known names only (an unknown one used to run the cumulative mode under its name)."""
    modes = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))  # each once, in order
    unknown = [m for m in modes if m not in STREAM_MODES]
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"unknown stream mode {', '.join(unknown) or '(none)'}: choose from "
                                         f"{', '.join(STREAM_MODES)}")
    return modes


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def cmd_bench(ns: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    cfg = QUICK if ns.quick else BenchConfig()
    cfg = replace(cfg, **{k: v for k, v in vars(ns).items() if v is not None and k in asdict(cfg)})
    ns.tokenizer = ns.tokenizer or str(mock.ensure_tokenizer())
    if ns.compare_upstream:
        from openclaw_rl.bench.compare import run_compare

        results = run_compare(ns.compare_upstream, ns.tokenizer, quick=ns.quick, reps=ns.compare_reps,
                              proxy_port=ns.port, out=ns.out, only=ns.compare_configs,
                              profile=ns.profile_proxy and os.path.abspath(ns.profile_proxy),
                              stream_interval=ns.stream_interval, pace=(ns.stream_ttft_ms, ns.stream_tokens_per_s))
        print(f"stream interval asked of SGLang on streamed turns: {ns.stream_interval}")
        print(f"load average at start {results['load_average_start']}, end {results['load_average_end']}; "
              f"errors {results.get('errors')}")
        return 0
    if ns.stream_cost:
        from openclaw_rl.bench.stream_cost import print_stream_cost, run_stream_cost

        lengths = tuple(int(x) for x in ns.stream_lengths.split(","))
        results = run_stream_cost(ns.tokenizer, lengths=lengths, scale=0.25 if ns.quick else ns.stream_scale,
                                  proxy_port=ns.port, modes=ns.stream_modes, proxy_env=dict(ns.proxy_env),
                                  profile=ns.profile_proxy and os.path.abspath(ns.profile_proxy),
                                  stream_interval=ns.stream_interval,
                                  pace=(ns.stream_ttft_ms, ns.stream_tokens_per_s))
        results["load_average"] = os.getloadavg()
        print_stream_cost(results)
        print(f"load average: {results['load_average']}")
        if ns.out:
            Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
            Path(ns.out).write_text(json.dumps(results, indent=2) + "\n")
        return 0
    results = run_bench(cfg, ns.tokenizer, ns.out, ns.plot, ns.profile_proxy and os.path.abspath(ns.profile_proxy),
                        proxy_port=ns.port)
    print_report(results)
    print(f"\nload average (1/5/15 min) at start {_load(results['load_average_start'])}, end "
          f"{_load(results['load_average_end'])} on {os.cpu_count()} CPUs: the targets are the documented figures of a "
          "quiet machine, so a loaded one misses the latency and throughput ones")
    print(f"checks: {results['checks']}; results: {ns.out or '-'}; chart: {ns.plot or '-'}")
    return 0


def _load(values: tuple[float, ...]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def register_bench_command(sub: Any) -> None:
    """Add ``bench`` to the ``openclaw-rl`` subcommands (see ``cli._EXTRA_COMMANDS``)."""
    p = sub.add_parser("bench", help="measure the proxy's overhead against a mocked SGLang (loopback)",
                       description=__doc__.splitlines()[0])
    add_bench_flags(p)
    p.set_defaults(fn=cmd_bench)


def main(argv: list[str] | None = None) -> int:
    """``scripts/bench_proxy.py``: the same as ``openclaw-rl bench``."""
    p = argparse.ArgumentParser(prog="bench_proxy", description=__doc__.splitlines()[0])
    add_bench_flags(p)
    return cmd_bench(p.parse_args(argv))
