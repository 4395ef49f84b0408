"""``openclaw-rl bench --compare-upstream PATH``: this proxy and upstream's, side by side on one mock.

Upstream's ``OpenClawAPIServer`` runs unmodified from a Gen-Verse/OpenClaw-RL checkout (``upstream.py``,
with the Slime stub), this proxy runs as ``openclaw-rl serve``, both with the judge on (m = 3) and
records on, in front of the same policy and judge mocks. The
same turns are sent to each and directly to the mock's answers (``/generate`` with the ids this proxy
renders, answered with the mock's bytes by the lean replay server, ``replay.py``: the floor),
interleaved batch by batch, so load changes hit all three alike. Configurations: concurrency 1 and
16 × ~1K and ~8K-token histories × 64- and 1,024-token replies × not streamed, streamed in the mode the
launch scripts run SGLang in (``--incremental-streaming-output``) and streamed in SGLang's default
cumulative mode (the mock switches modes between configurations). Reported per
configuration: CPU per turn of each proxy (``/proc``, judge votes and writes included), p50 latency
and time to first content byte, turns/s, and the ratios ours / upstream; and the load average.
Upstream's stream is not real (it sends the whole answer at the end), so its TTFB is its total.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from openclaw_rl.bench import mock, processes, replay
from openclaw_rl.bench.loadclient import LoadClient, LoadClientError
from openclaw_rl.servers import free_port

TARGETS = ("direct", "ours", "upstream")


@dataclass(frozen=True)
class CompareConfig:
    concurrency: int
    history: int
    stream: bool
    reply: int
    cumulative: bool = False  # the policy mock's stream mode for streamed configs (SGLang's default)

    @property
    def name(self) -> str:
        kind = ("stream-cumulative" if self.cumulative else "stream") if self.stream else "plain"
        return f"c={self.concurrency} hist={self.history // 1024}K {kind} reply={self.reply}"


def all_configs(quick: bool = False) -> list[CompareConfig]:
    """Streamed configurations run in the mode the launch scripts start SGLang in
    (``--incremental-streaming-output``: "stream") and in SGLang's default ("stream-cumulative")."""
    if quick:
        return [CompareConfig(c, 1024, s, 64) for c in (1, 16) for s in (False, True)]
    return [CompareConfig(c, h, s, r, cum) for c, h, s, r, cum in itertools.product(
        (1, 16), (1024, 8192), (False, True), (64, 1024), (False, True)) if s or not cum]


def sessions_at(tokenizer: Any, *, sessions: int, history: int, reply: int, seed: int) -> list[list[mock.Case]]:
    """Two-turn sessions whose prompts straddle ``history`` tokens (turn 2 brings turn 1's next state).

    ~1K histories keep 2 of the 12 tools (the system prompt and all tools alone are ~1.9K tokens)."""
    tools = mock.TOOLS if history > 4096 else mock.TOOLS[:2]
    reply_text = mock.reply_text(reply)

    def render(messages: list[dict[str, Any]]) -> list[int]:
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        return list(tokenizer.encode(text, add_special_tokens=False))

    system = {"role": "system", "content": mock.SYSTEM}
    base = len(render([system, {"role": "user", "content": ""}]))
    per_word = len(tokenizer.encode(" ".join(mock.WORDS * 4), add_special_tokens=False)) / (len(mock.WORDS) * 4)
    first_words = max(8, round((history - base - (reply + 40) // 2) / per_word))
    out = []
    for s in range(sessions):
        words = iter(mock.WORDS[(s * 7 + i * 13 + seed) % len(mock.WORDS)] for i in range(1 << 30))
        m1 = [system, {"role": "user", "content": f"Task {seed}-{s}: " + " ".join(next(words) for _ in range(first_words))}]
        m2 = [*m1, {"role": "assistant", "content": reply_text},
              {"role": "user", "content": "Thanks. Next: " + " ".join(next(words) for _ in range(24))}]
        out.append([mock.Case(m1, render(m1), tools), mock.Case(m2, render(m2), tools)])
    return out


class Compare:
    def __init__(self, stack: processes.Stack, upstream_pid: int, upstream_url: str, stream_interval: int = 0):
        self.stack, self.upstream_pid, self.upstream_url = stack, upstream_pid, upstream_url
        self.stream_interval = stream_interval  # what ours asks SGLang for; direct streamed turns ask the same
        self.errors: dict[str, int] = {}

    def url_pid(self, target: str) -> tuple[str, int | None]:
        return {"direct": (self.stack.direct_url, None), "ours": (self.stack.proxy_url, self.stack.proxy_pid),
                "upstream": (self.upstream_url, self.upstream_pid)}[target]

    async def turn(self, load: LoadClient, target: str, cfg: CompareConfig, case: mock.Case, sid: str,
                   last: bool) -> tuple[float, float] | None:
        """(seconds to the first content byte, seconds in all) of one turn; None if it failed (counted)."""
        base, _ = self.url_pid(target)
        if target == "direct":
            url, headers = f"{base}/generate", mock.JSON_HEADERS
            body = mock.generate_body(case, cfg.reply, cfg.stream, self.stream_interval)
        else:
            url, body = f"{base}/v1/chat/completions", mock.chat_body(case, cfg.reply, cfg.stream)
            headers = {**mock.JSON_HEADERS, "X-Session-Id": sid, "X-Turn-Type": "main",
                       **({"X-Session-Done": "1"} if last else {})}
        start = time.perf_counter()
        first = None
        try:
            if not cfg.stream:
                await load.post(url, body, headers)
                total = time.perf_counter() - start
                return total, total
            async for line in load.post_lines(url, body, headers):
                if first is None and line.startswith(b"data: {") and (
                        target == "direct" or b'"content":"' in line and b'"content":""' not in line):
                    first = time.perf_counter() - start
            total = time.perf_counter() - start
            return (first if first is not None else total), total
        except LoadClientError as e:
            key = f"{target}: {type(e).__name__}"
            self.errors[key] = self.errors.get(key, 0) + 1
            return None

    async def batch(self, load: LoadClient, target: str, cfg: CompareConfig, sessions: list[list[mock.Case]],
                    tag: str) -> dict[str, Any]:
        _, pid = self.url_pid(target)
        if pid:
            await self.stack.settle(pid=pid)
        cpu0 = processes.cpu_seconds(pid) if pid else 0.0
        results: list[tuple[float, float]] = []
        queue = iter(range(len(sessions)))

        async def worker() -> None:
            for s in queue:
                for t, case in enumerate(sessions[s]):
                    r = await self.turn(load, target, cfg, case, f"{tag}-{s}", t == len(sessions[s]) - 1)
                    results.extend([r] if r else [])

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))
        wall = time.perf_counter() - start
        if pid:
            await self.stack.settle(pid=pid)
        cpu = processes.cpu_seconds(pid) - cpu0 if pid else None
        return {"ttfb": [r[0] for r in results], "total": [r[1] for r in results], "wall": wall,
                "cpu": cpu, "turns": len(results)}


def _summary(batches: list[dict[str, Any]]) -> dict[str, Any]:
    ttfb = [x for b in batches for x in b["ttfb"]]
    total = [x for b in batches for x in b["total"]]
    turns = sum(b["turns"] for b in batches)
    cpu = [b["cpu"] for b in batches if b["cpu"] is not None]
    return {"turns": turns, "p50_ms": round(statistics.median(total) * 1e3, 2) if total else None,
            "ttfb_p50_ms": round(statistics.median(ttfb) * 1e3, 2) if ttfb else None,
            "turns_per_s": round(turns / sum(b["wall"] for b in batches), 2) if turns else None,
            "cpu_ms_per_turn": round(sum(cpu) / turns * 1e3, 2) if cpu and turns else None}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def ratios(s: dict[str, dict[str, Any]], cfg: CompareConfig) -> dict[str, Any]:
    d, o, u = s["direct"], s["ours"], s["upstream"]
    out = {"cpu_ours_over_upstream": _ratio(o["cpu_ms_per_turn"], u["cpu_ms_per_turn"]),
           "throughput_ours_over_upstream": _ratio(o["turns_per_s"], u["turns_per_s"]),
           "throughput_ours_over_direct": _ratio(o["turns_per_s"], d["turns_per_s"]),
           "throughput_upstream_over_direct": _ratio(u["turns_per_s"], d["turns_per_s"])}
    for key in ("p50_ms", "ttfb_p50_ms"):
        if d[key] is not None and o[key] is not None and u[key] is not None:
            added_o, added_u = o[key] - d[key], u[key] - d[key]
            out[f"added_{key}"] = {"ours": round(added_o, 2), "upstream": round(added_u, 2),
                                   "ratio": _ratio(max(added_o, 0.0), added_u)}
    return out


async def _run(checkout: str, tokenizer_dir: str, workdir: Path, configs: list[CompareConfig], reps: int,
               proxy_port: int | None, profile: str = "", stream_interval: int = 0,
               pace: tuple[float, float] = (0.0, 0.0)) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    stack = processes.Stack(tokenizer_dir, workdir, reply_tokens=64, judge_votes=3, proxy_port=proxy_port,
                       proxy_args=["--record-dir", str(workdir / "records"), "--stream-interval", str(stream_interval)],
                       profile_proxy=profile)
    upstream_port = free_port(mock.HOST)
    upstream_url = f"http://{mock.HOST}:{upstream_port}"
    results: dict[str, Any] = {"configs": [], "load_average_start": os.getloadavg(), "stream_interval": stream_interval,
                               "ttft_ms": pace[0], "tokens_per_s": pace[1]}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=300, limits=limits, trust_env=False) as http, LoadClient(300.0) as load:
        try:
            await stack.start(http)
            up = stack._spawn("upstream", [sys.executable, "-m", "openclaw_rl.bench.upstream", "--checkout", checkout,
                                           "--tokenizer", tokenizer_dir, "--policy-url", stack.policy_url,
                                           "--judge-url", stack.judge_url, "--port", str(upstream_port),
                                           "--record-file", str(workdir / "upstream" / "records.jsonl")])
            deadline = time.monotonic() + 120
            while True:
                if up.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"upstream's proxy did not come up; see {workdir}/upstream.log")
                try:
                    if (await http.get(f"{upstream_url}/healthz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.2)
            cmp = Compare(stack, up.pid, upstream_url, stream_interval)
            for i, cfg in enumerate(configs):
                for url in (stack.policy_url, stack.direct_url):  # the replay forgets the mock's older answers
                    await http.post(f"{url}/bench/latency",
                                    json={"reply_tokens": cfg.reply, "incremental": not cfg.cumulative,
                                          "ttft_ms": 0.0, "tokens_per_s": 0.0})  # primed unpaced
                n = 8 if cfg.concurrency == 1 else 32
                warm = sessions_at(tokenizer, sessions=2, history=cfg.history, reply=cfg.reply, seed=10_000 + i)
                runs = [sessions_at(tokenizer, sessions=n, history=cfg.history, reply=cfg.reply, seed=i * 100 + rep)
                        for rep in range(reps)]
                await _prime(load, cmp, cfg, [*warm, *(s for sessions in runs for s in sessions)])
                for url in (stack.policy_url, stack.direct_url):  # --stream-ttft-ms / --stream-tokens-per-s
                    await http.post(f"{url}/bench/latency", json={"ttft_ms": pace[0], "tokens_per_s": pace[1]})
                for target in TARGETS:  # warm-up: template compile, pools, first calls of this shape
                    await cmp.batch(load, target, CompareConfig(1, cfg.history, cfg.stream, cfg.reply), warm,
                                    f"warm{i}")
                if i == 0:
                    stack.profile_reset()  # a yappi profile (--profile-proxy X.pstat) leaves out start-up
                per: dict[str, list[dict[str, Any]]] = {t: [] for t in TARGETS}
                for rep in range(reps):
                    sessions = runs[rep]
                    order = TARGETS if rep % 2 == 0 else TARGETS[::-1]
                    for target in order:
                        per[target].append(await cmp.batch(load, target, cfg, sessions, f"{target}{i}r{rep}"))
                summary = {t: _summary(b) for t, b in per.items()}
                row = {"config": cfg.name, **{k: v for k, v in cfg.__dict__.items()}, "summary": summary,
                       "ratios": ratios(summary, cfg), "load_average": os.getloadavg(),
                       "history_tokens": [len(s[0].ids) for s in sessions[:1]] + [len(sessions[0][1].ids)]}
                results["configs"].append(row)
                print(format_row(row), file=sys.stderr, flush=True)
            results["errors"] = cmp.errors
        finally:
            stack.stop()
    results["load_average_end"] = os.getloadavg()
    return results


async def _prime(load: LoadClient, cmp: Compare, cfg: CompareConfig, sessions: list[list[mock.Case]]) -> None:
    """The direct replay server learns the mock's answer to each direct body before any is timed."""
    await replay.prime(load, cmp.stack.direct_url, [mock.generate_body(case, cfg.reply, cfg.stream, cmp.stream_interval)
                                                    for session in sessions for case in session])


def format_row(row: dict[str, Any]) -> str:
    s, r = row["summary"], row["ratios"]
    parts = [f"{row['config']:<34}"]
    for t in ("ours", "upstream"):
        parts.append(f"{t}: cpu {s[t]['cpu_ms_per_turn']} ms, p50 {s[t]['p50_ms']} ms, ttfb {s[t]['ttfb_p50_ms']} ms, "
                     f"{s[t]['turns_per_s']} t/s")
    parts.append(f"direct p50 {s['direct']['p50_ms']} ms ttfb {s['direct']['ttfb_p50_ms']} ms, "
                 f"{s['direct']['turns_per_s']} t/s")
    added = r.get("added_p50_ms", {})
    parts.append(f"RATIOS cpu {r['cpu_ours_over_upstream']}, added p50 {added.get('ratio')} "
                 f"({added.get('ours')} vs {added.get('upstream')} ms), throughput ours/upstream "
                 f"x{r['throughput_ours_over_upstream']}, ours/direct x{r['throughput_ours_over_direct']}, "
                 f"upstream/direct x{r['throughput_upstream_over_direct']}")
    if row["stream"]:
        t = r.get("added_ttfb_p50_ms", {})
        parts.append(f"added ttfb {t.get('ratio')} ({t.get('ours')} vs {t.get('upstream')} ms)")
    parts.append(f"load {tuple(round(x, 2) for x in row['load_average'])}")
    return " | ".join(parts)


def run_compare(checkout: str, tokenizer_dir: str, *, quick: bool = False, reps: int = 2,
                proxy_port: int | None = None, out: str = "", only: str = "", profile: str = "",
                stream_interval: int = 0, pace: tuple[float, float] = (0.0, 0.0)) -> dict[str, Any]:
    if not (Path(checkout) / "openclaw-rl" / "openclaw_api_server.py").is_file():
        raise SystemExit(f"{checkout} is not a Gen-Verse/OpenClaw-RL checkout (no openclaw-rl/openclaw_api_server.py)")
    with tempfile.TemporaryDirectory(prefix="openclaw-compare-") as tmp:
        (Path(tmp) / "upstream").mkdir()
        configs = all_configs(quick)
        if only:  # e.g. "c=1 hist=1K plain reply=64;c=16 hist=8K stream reply=1024"
            wanted = {name.strip() for name in only.split(";") if name.strip()}
            configs = [c for c in configs if c.name in wanted]
            if len(configs) != len(wanted):
                raise SystemExit(f"unknown configurations in {only!r}; known: {[c.name for c in all_configs()]}")
        results = asyncio.run(_run(os.path.abspath(checkout), tokenizer_dir, Path(tmp), configs, reps, proxy_port,
                                   profile, stream_interval, pace))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(results, indent=2) + "\n")
    return results
