"""``openclaw-rl bench --stream-cost``: the proxy's CPU per streamed turn by reply length, in both of
SGLang's streaming modes.

SGLang's default stream repeats every id and log-prob triple so far in each chunk (the bytes grow with
the square of the reply length); ``--incremental-streaming-output`` sends only the new ones. For each
mode a policy mock streaming that way and a proxy (judge off: only the stream is measured) run as
separate processes; each reply length is sent a few times at concurrency 1, and the proxy's CPU from
``/proc`` is divided by turns and by tokens. Linear cost means a flat CPU per token: the figure of
merit is the 8,192-token reply's CPU per token over the 512-token reply's (target ≤ 2). A benchmark,
not a test: it reports, never asserts.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from openclaw_rl.bench import mock, processes

LENGTHS = (64, 512, 2048, 8192)
MODES = ("cumulative", "incremental")


def reps_for(length: int, scale: float = 1.0) -> int:
    """Turns per length: about the same number of tokens for each (at least 2 turns)."""
    return max(2, round(scale * 16384 / max(length, 512)))


async def _stream_turn(http: httpx.AsyncClient, url: str, case: mock.Case, length: int, sid: str) -> tuple[int, int]:
    """One streamed turn through the proxy; (content characters received, completion tokens)."""
    body = json.loads(mock.chat_body(case, length, True))  # max_tokens: length + 8, clamped to the cap
    body["stream_options"] = {"include_usage": True}
    chars, tokens = 0, 0
    headers = {"X-Session-Id": sid, "X-Session-Done": "1"}
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("error"):
                raise RuntimeError(f"stream failed: {event['error']}")
            for choice in event.get("choices") or []:
                chars += len((choice.get("delta") or {}).get("content") or "")
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return chars, tokens


async def measure_mode(tokenizer: Any, tokenizer_dir: str, mode: str, lengths: tuple[int, ...], scale: float,
                       workdir: Path, proxy_port: int | None = None, profile: str = "",
                       proxy_env: dict[str, str] | None = None, stream_interval: int = 0,
                       pace: tuple[float, float] = (0.0, 0.0)) -> list[dict[str, Any]]:
    case = mock.build_workload(tokenizer, sessions=1, turns=1, max_history_tokens=2048, reply_tokens=64)[0][0]
    stack = processes.Stack(tokenizer_dir, workdir, reply_tokens=64, judge_votes=0, incremental=mode == "incremental",
                       proxy_port=proxy_port, profile_proxy=profile, proxy_env=proxy_env,
                       proxy_args=["--stream-interval", str(stream_interval)], replay=False)
    rows = []
    async with httpx.AsyncClient(timeout=600, trust_env=False) as http:
        try:
            await stack.start(http)
            pid = stack.proxy_pid
            for length in lengths:
                # the scripted reply is length - 1 byte tokens, then eos: ``length`` tokens in all, within
                # the proxy's default cap of 8,192 new tokens
                await http.post(f"{stack.policy_url}/bench/latency",
                                json={"reply_tokens": length - 1, "ttft_ms": pace[0], "tokens_per_s": pace[1]})
                await _stream_turn(http, stack.proxy_url, case, length, f"warm-{mode}-{length}")
                await stack.settle()
                if length == lengths[0]:
                    stack.profile_reset()  # a yappi profile (--profile-proxy X.pstat) leaves out start-up
                reps = reps_for(length, scale)
                cpu0, mock0, wall0 = processes.cpu_seconds_fine(pid), processes.cpu_seconds(stack.procs[0].pid), time.perf_counter()
                received = [await _stream_turn(http, stack.proxy_url, case, length, f"{mode}-{length}-{i}")
                            for i in range(reps)]
                wall = time.perf_counter() - wall0
                await stack.settle()
                cpu = processes.cpu_seconds_fine(pid) - cpu0
                tokens = received[0][1]
                rows.append({"mode": mode, "stream_interval": stream_interval, "ttft_ms": pace[0],
                             "tokens_per_s": pace[1], "reply_tokens": length, "completion_tokens": tokens, "turns": reps,
                             "proxy_cpu_ms_per_turn": round(cpu / reps * 1e3, 2),
                             "proxy_cpu_us_per_token": round(cpu / reps / tokens * 1e6, 2),
                             "mock_cpu_ms_per_turn": round((processes.cpu_seconds(stack.procs[0].pid) - mock0) / reps * 1e3, 1),
                             "wall_ms_per_turn": round(wall / reps * 1e3, 1),
                             "complete": all(c == length - 1 and t == length for c, t in received)})
                print(progress_line(rows[-1]), file=sys.stderr, flush=True)
        finally:
            stack.stop()
    return rows


def progress_line(row: dict[str, Any]) -> str:
    """What is done, on stderr while it runs; the figures are printed once, in the table at the end (the
    whole row here printed every row twice on a terminal)."""
    return f"stream-cost: {row['mode']} mode, {row['reply_tokens']}-token replies: {row['turns']} turns measured"


def _per_mode(path: str, mode: str) -> str:
    """One profile file per mode: ``out.folded`` → ``out.cumulative.folded``."""
    if not path:
        return ""
    stem, dot, ext = path.rpartition(".")
    return f"{stem}.{mode}.{ext}" if dot else f"{path}.{mode}"


def run_stream_cost(tokenizer_dir: str, *, lengths: tuple[int, ...] = LENGTHS, modes: tuple[str, ...] = MODES,
                    scale: float = 1.0, proxy_port: int | None = None,
                    proxy_env: dict[str, str] | None = None, profile: str = "", stream_interval: int = 0,
                    pace: tuple[float, float] = (0.0, 0.0)) -> dict[str, Any]:
    """``pace``: (ms to the first token, tokens/s) of the policy mock; (0, 0) streams at once, which
    understates the proxy's cost: a paced stream arrives an event per read, an instant one in a few reads."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="openclaw-stream-bench-") as tmp:
        for mode in modes:
            rows += asyncio.run(measure_mode(tokenizer, tokenizer_dir, mode, lengths, scale,
                                             Path(tempfile.mkdtemp(dir=tmp)), proxy_port,
                                             profile=_per_mode(profile, mode), proxy_env=proxy_env,
                                             stream_interval=stream_interval, pace=pace))
    ratios = {}
    for mode in modes:
        per = {r["reply_tokens"]: r["proxy_cpu_us_per_token"] for r in rows if r["mode"] == mode}
        if 512 in per and 8192 in per:
            ratios[mode] = round(per[8192] / per[512], 3)
    return {"rows": rows, "per_token_ratio_8192_over_512": ratios, "proxy_env": proxy_env or {},
            "stream_interval": stream_interval, "ttft_ms": pace[0], "tokens_per_s": pace[1]}


def print_stream_cost(results: dict[str, Any]) -> None:
    print(f"stream interval asked of SGLang: {results.get('stream_interval')} tokens per event (0: one per token); "
          f"pace: {results.get('ttft_ms', 0)} ms to the first token, {results.get('tokens_per_s', 0) or 'unpaced'} tokens/s")
    cols = ("mode", "reply_tokens", "turns", "proxy_cpu_ms_per_turn", "proxy_cpu_us_per_token", "mock_cpu_ms_per_turn",
            "wall_ms_per_turn", "complete")
    print("  ".join(f"{c:>22}" for c in cols))
    for row in results["rows"]:
        print("  ".join(f"{row[c]!s:>22}" for c in cols))
    for mode, ratio in results["per_token_ratio_8192_over_512"].items():
        print(f"{mode}: CPU per token at 8,192 / at 512 = {ratio} (target <= 2: {'PASS' if ratio <= 2 else 'MISS'})")
