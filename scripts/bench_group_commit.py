"""What ``synchronous=FULL`` costs the proxy's throughput: ``--spool-sync full`` against ``normal``, side by side.

Runs the bench's stack (policy and judge mocks, ``openclaw-rl serve`` with the judge on, m = 3) once per sync
mode and repetition, interleaved (full, normal, normal, full, ...) so load changes hit both alike, and drives
the same multi-turn sessions (~4K-token last prompts) through the proxy at concurrency 1 and 16 (zero-latency mocks, plain replies).
Prints turns/s and p50 per mode, the ratio full / normal, the writer's group commits (from ``/metrics``)
and the load average. A benchmark: nothing is asserted. Usage: ``python scripts/bench_group_commit.py [--reps 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from openclaw_rl.bench import mock, processes  # noqa: E402
from openclaw_rl.bench.loadclient import LoadClient  # noqa: E402


async def drive(load: LoadClient, url: str, cases: list[list[mock.Case]], concurrency: int, tag: str,
                reply: int) -> tuple[float, float, int]:
    """(turns/s, p50 seconds, errors) of ``concurrency`` workers running whole sessions through the proxy."""
    lat: list[float] = []
    errors = 0
    sessions = iter(range(len(cases)))

    async def worker() -> None:
        nonlocal errors
        for s in sessions:
            for t, case in enumerate(cases[s]):
                headers = {**mock.JSON_HEADERS, "X-Session-Id": f"{tag}-{s}",
                           **({"X-Session-Done": "1"} if t == len(cases[s]) - 1 else {})}
                start = time.perf_counter()
                try:
                    await load.post(f"{url}/v1/chat/completions", mock.chat_body(case, reply, False), headers)
                except Exception:
                    errors += 1
                    continue
                lat.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    return len(lat) / wall, statistics.median(lat), errors


def group_counts(text: str) -> tuple[float, float]:
    values = {}
    for line in text.splitlines():
        for name in ("openclaw_spool_group_commits_total", "openclaw_spool_group_writes_total"):
            if line.startswith(name + " "):
                values[name] = float(line.split()[1])
    return (values.get("openclaw_spool_group_commits_total", 0.0), values.get("openclaw_spool_group_writes_total", 0.0))


async def one(tokenizer_dir: str, workdir: Path, sync: str, cases: dict[int, list[list[mock.Case]]], reply: int
              ) -> dict[str, object]:
    stack = processes.Stack(tokenizer_dir, workdir, reply_tokens=reply, judge_votes=3, proxy_args=["--spool-sync", sync],
                       replay=False)
    out: dict[str, object] = {"sync": sync}
    async with httpx.AsyncClient(timeout=120, trust_env=False) as http, LoadClient(120.0) as load:
        try:
            await stack.start(http)
            await drive(load, stack.proxy_url, cases[1][:2], 1, "warm", reply)
            for c in (1, 16):
                await stack.settle()
                tps, p50, errors = await drive(load, stack.proxy_url, cases[c], c, f"c{c}", reply)
                out[f"c{c}"] = {"turns_per_s": round(tps, 1), "p50_ms": round(p50 * 1e3, 2), "errors": errors}
            await stack.settle()
            out["group_commits"], out["group_writes"] = group_counts((await http.get(f"{stack.proxy_url}/metrics")).text)
        finally:
            stack.stop()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--sessions", type=int, default=48, help="sessions per concurrency level (c=1 runs a quarter)")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--out", default="")
    ns = p.parse_args()
    from transformers import AutoTokenizer

    tokenizer_dir = str(mock.ensure_tokenizer())
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    reply = 64
    cases = {c: mock.build_workload(tokenizer, sessions=ns.sessions if c == 16 else max(2, ns.sessions // 4),
                                    turns=ns.turns, reply_tokens=reply, max_history_tokens=4096, seed=c)
             for c in (1, 16)}
    load_start = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory(prefix="openclaw-group-commit-") as tmp:
        for rep in range(ns.reps):
            for sync in (("full", "normal") if rep % 2 == 0 else ("normal", "full")):
                work = Path(tmp) / f"{sync}{rep}"
                work.mkdir()
                runs.append(asyncio.run(one(tokenizer_dir, work, sync, cases, reply)))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    load_end = os.getloadavg()
    summary = {}
    for c in (1, 16):
        for sync in ("full", "normal"):
            rs = [r[f"c{c}"] for r in runs if r["sync"] == sync]
            summary[(c, sync)] = (statistics.mean(r["turns_per_s"] for r in rs), statistics.mean(r["p50_ms"] for r in rs),
                                  sum(r["errors"] for r in rs))
    print(f"{'config':<8}{'full t/s':>10}{'normal t/s':>12}{'full/normal':>13}{'full p50 ms':>13}{'normal p50 ms':>15}")
    for c in (1, 16):
        f, n = summary[(c, "full")], summary[(c, "normal")]
        print(f"{'c=' + str(c):<8}{f[0]:>10.1f}{n[0]:>12.1f}{f[0] / n[0]:>13.3f}{f[1]:>13.2f}{n[1]:>15.2f}"
              + (f"  errors {f[2]}/{n[2]}" if f[2] or n[2] else ""))
    commits = sum(float(r["group_commits"]) for r in runs)
    writes = sum(float(r["group_writes"]) for r in runs)
    print(f"group commits: {commits:.0f}, holding {writes:.0f} writes ({writes / commits if commits else 0:.1f} per group)")
    print(f"load average (1/5/15 min) at start {tuple(round(x, 2) for x in load_start)}, end "
          f"{tuple(round(x, 2) for x in load_end)} on {os.cpu_count()} CPUs")
    if ns.out:
        Path(ns.out).write_text(json.dumps({"runs": runs, "load_start": load_start, "load_end": load_end}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
