#!/usr/bin/env python
"""Full-size load test on loopback: 200 sessions x 10 turns through the proxy with the judge on (m=3).

Starts the scripted SGLang-compatible policy and judge and the proxy in this process, drives them, and
prints the figures: errors, samples lost or duplicated, per-session order, latency, turns/s, and what is
left in memory after the idle sessions expire. Usage: .venv/bin/python scripts/load_test.py [--sessions N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support import judge_reply, policy_reply, scripted_server  # noqa: E402

from openclaw_rl.bench.load import run_load  # noqa: E402
from openclaw_rl.config import load_settings  # noqa: E402
from openclaw_rl.embedded.tiny_model import ensure_tiny_model  # noqa: E402
from openclaw_rl.server import Proxy  # noqa: E402
from openclaw_rl.servers import BackgroundServer  # noqa: E402
from openclaw_rl.turns import Turn  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--turns", type=int, default=10)
    ns = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ensure_tiny_model())
    spool = tempfile.mkdtemp(prefix="load-spool-")
    with scripted_server(tok, policy_reply) as policy, scripted_server(tok, judge_reply) as judge:
        settings = load_settings({"proxy_policy_url": policy.url, "judge_url": judge.url, "judge_votes": 3,
                                  "judge_max_new_tokens": 256, "spool_dir": spool, "proxy_session_ttl_s": 3600}, env={})
        proxy = Proxy.build(settings, tokenizer=tok)
        with BackgroundServer(proxy.app) as server:
            report = asyncio.run(run_load(server.url, sessions=ns.sessions, turns=ns.turns))
            expected = ns.sessions * (ns.turns - 1)
            proxy.spool.wait_ready(expected, 300)
            proxy.writer.flush()
            samples = list(proxy.spool.iter_samples())
            keys = [(s.session_id, s.turn) for s in samples]
            ordered = all([s.turn for s in samples if s.session_id == f"load-{i}"] == list(range(1, ns.turns))
                          for i in range(ns.sessions))
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), server.loop).result()
            expired = asyncio.run_coroutine_threadsafe(_sweep(proxy), server.loop).result(60)
            deadline = time.time() + 60
            while proxy.tracker.unsettled_turns and time.time() < deadline:
                time.sleep(0.05)
            proxy.writer.flush()
            gc.collect()
            left = sum(type(o) is Turn for o in gc.get_objects())
    print(f"sessions x turns      {ns.sessions} x {ns.turns} (judge m=3)")
    print(f"requests ok / errors  {report.ok} / {dict(report.errors) or 0}")
    print(f"turns/s               {report.turns_per_s:.1f}")
    print(f"latency p50/p95/p99   {report.percentile(.5)*1000:.1f} / {report.percentile(.95)*1000:.1f} / "
          f"{report.percentile(.99)*1000:.1f} ms")
    print(f"samples               {len(keys)} of {expected} expected; duplicates {len(keys) - len(set(keys))}; "
          f"lost {expected - len(set(keys))}; per-session order {'ok' if ordered else 'BROKEN'}")
    print(f"after idle expiry     {expired} sessions flushed; {len(proxy.tracker.sessions)} tracked; "
          f"{left} Turn objects in memory")
    return 0 if (not report.errors and len(set(keys)) == expected == len(keys) and ordered and left == 0) else 1


async def _sweep(proxy: Proxy) -> int:
    return proxy.tracker.sweep(now=float("inf"))


if __name__ == "__main__":
    sys.exit(main())
