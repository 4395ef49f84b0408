"""The proxy's CPU and scheduler wake-ups per streamed event (issue #33 item 3), from its own ``/proc`` entry.

A paced policy mock (``--ttft-ms``, ``--tokens-per-s``; incremental SGLang stream, one event per
``--interval`` tokens, judge off: only the stream is measured) streams replies of two lengths through the
proxy at concurrency 1; the difference of the proxy's CPU (``schedstat``, all threads) between the long and the
short replies, divided by the events between them, is the CPU per event, and likewise the number of times
its threads were scheduled (wake-ups). A benchmark: nothing is asserted. Usage:
``python scripts/bench_stream_events.py [--lengths 64,512] [--reps 8]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from openclaw_rl.bench import mock, processes  # noqa: E402
from openclaw_rl.bench.stream_cost import _stream_turn  # noqa: E402


def cpu_and_runs(pid: int) -> tuple[float, int]:
    """(on-CPU seconds, times scheduled) of the live threads of ``pid``."""
    cpu = runs = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except OSError:
            continue
        cpu, runs = cpu + int(fields[0]), runs + int(fields[2])
    return cpu / 1e9, runs


async def measure(ns: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    tokenizer_dir = str(mock.ensure_tokenizer())
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    case = mock.build_workload(tokenizer, sessions=1, turns=1, max_history_tokens=2048, reply_tokens=64)[0][0]
    lengths = [int(x) for x in ns.lengths.split(",")]
    with tempfile.TemporaryDirectory(prefix="openclaw-stream-events-") as tmp:
        stack = processes.Stack(tokenizer_dir, Path(tmp), reply_tokens=64, judge_votes=0, incremental=True,
                           proxy_args=["--stream-interval", str(ns.interval)], replay=False,
                                profile_proxy=ns.profile)
        async with httpx.AsyncClient(timeout=600, trust_env=False) as http:
            try:
                await stack.start(http)
                per: dict[int, tuple[float, float]] = {}
                sender: dict[int, tuple[float, float]] = {}
                for length in lengths:
                    await http.post(f"{stack.policy_url}/bench/latency", json={
                        "reply_tokens": length - 1, "ttft_ms": ns.ttft_ms, "tokens_per_s": ns.tokens_per_s})
                    await _stream_turn(http, stack.proxy_url, case, length, f"warm-{length}")
                    await stack.settle()
                    if length == lengths[0]:
                        stack.profile_reset()  # under --profile X.pstat: count the measured turns only
                    cpu0, runs0 = cpu_and_runs(stack.proxy_pid)
                    mock0 = cpu_and_runs(stack.procs[0].pid)  # the policy mock: it sends each event
                    for i in range(ns.reps):
                        await _stream_turn(http, stack.proxy_url, case, length, f"s{length}-{i}")
                    await stack.settle()
                    cpu1, runs1 = cpu_and_runs(stack.proxy_pid)
                    per[length] = ((cpu1 - cpu0) / ns.reps, (runs1 - runs0) / ns.reps)
                    mock1 = cpu_and_runs(stack.procs[0].pid)
                    sender[length] = ((mock1[0] - mock0[0]) / ns.reps, (mock1[1] - mock0[1]) / ns.reps)
                    print(f"{length}-token replies: {per[length][0] * 1e3:.2f} ms of proxy CPU and "
                          f"{per[length][1]:.1f} wake-ups per turn", flush=True)
                short, long = lengths[0], lengths[-1]
                events = (long - short) / max(ns.interval, 1)
                print(f"per event: {(per[long][0] - per[short][0]) / events * 1e6:.0f} us of CPU, "
                      f"{(per[long][1] - per[short][1]) / events:.2f} wake-ups; load average "
                      f"{tuple(round(x, 2) for x in os.getloadavg())} on {os.cpu_count()} CPUs")
                # a reference, not a floor: the mock (one Python process, uvicorn) only formats and sends each
                # event after a timer wakes it; the proxy also reads, checks and forwards it
                print(f"the policy mock, which sends them: {(sender[long][0] - sender[short][0]) / events * 1e6:.0f} "
                      f"us of CPU, {(sender[long][1] - sender[short][1]) / events:.2f} wake-ups per event")
            finally:
                stack.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="64,512")
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--interval", type=int, default=8, help="tokens per SGLang stream event")
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--tokens-per-s", type=float, default=500.0)
    p.add_argument("--profile", default="", help="profile the proxy (.pstat: yappi; .folded: py-spy)")
    asyncio.run(measure(p.parse_args()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
