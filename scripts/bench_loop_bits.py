"""The event loop's sixth pass (docs/performance.md), in-process: the chat route's parse of an ~8K-token request
with the bench's twelve tools, one dump of its tools, a turn's ids and its metric updates. Best of 9 repeats,
µs. A benchmark: nothing is asserted.

Run it in the tree to measure (cwd and PYTHONPATH), e.g. an export of an older commit beside this one:
``cd /tmp/before && PYTHONPATH=/tmp/before python /path/to/scripts/bench_loop_bits.py``. A tree whose
``parse_chat_request`` takes no tool cache is measured the old way (no cache, ``uuid4``, ``labels()``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.getcwd())

from openclaw_rl.bench import mock  # noqa: E402
from openclaw_rl.metrics import ProxyMetrics  # noqa: E402
from openclaw_rl.routes import parse_chat_request, parse_json_body  # noqa: E402

ROUTE = "/v1/chat/completions"


def best(f: Callable[[], Any], n: int = 2000, reps: int = 9) -> float:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(n):
            f()
        out.append((time.perf_counter() - t) / n * 1e6)
    return min(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools", type=int, default=12, help="the first N of the bench's tools (its ~1K sessions send 2)")
    ap.add_argument("--chars", type=int, default=30000, help="the user message's characters (30000: ~8K tokens)")
    ns = ap.parse_args()
    new = "tools" in inspect.signature(parse_chat_request).parameters
    print("tree", os.getcwd(), "(tool cache, UniqueIds, bound children)" if new else "(before them)")
    cache = None
    if new:
        from openclaw_rl.toolcache import ToolsCache
        cache = ToolsCache()
    messages = [{"role": "system", "content": mock.SYSTEM},
                {"role": "user", "content": " ".join(mock.WORDS * 200)[:ns.chars]}]
    body = json.dumps({"model": "policy", "messages": messages, "tools": mock.TOOLS[:ns.tools], "max_tokens": 72,
                       "stream": False}).encode()

    def parse() -> Any:
        raw = parse_json_body(body)
        return parse_chat_request(raw, 10000, cache) if new else parse_chat_request(raw, 10000)

    req = parse()
    print(f"1. parse_json_body + parse_chat_request ({len(body)} B body, {len(req.tools)} tools): {best(parse):.2f}")
    print(f"1. parse_json_body alone: {best(lambda: parse_json_body(body)):.2f}")
    dump = best(lambda: [t.model_dump(exclude_none=True) for t in req.tools])
    print(f"1. one dump of the tools ([t.model_dump(exclude_none=True) for t in req.tools]): {dump:.2f}")
    if new:
        from openclaw_rl.ids import UniqueIds
        ids = UniqueIds()
        completion, epoch = best(lambda: f"chatcmpl-{ids.hex()}", 20000), best(lambda: ids.hex(12), 20000)
    else:
        completion = best(lambda: f"chatcmpl-{uuid.uuid4().hex}", 20000)
        epoch = best(lambda: uuid.uuid4().hex[:12], 20000)
    print(f"2. a completion id: {completion:.3f}; a session epoch: {epoch:.3f}")
    m = ProxyMetrics()
    if new:
        requests, latency, votes, samples = (m.requests.children, m.latency.children, m.judge_votes.children,
                                             m.samples.children)

        def turn() -> None:  # the middleware's two, three judge votes, the writer's sample
            requests[(ROUTE, str(200))].inc()
            latency[(ROUTE,)].observe(0.01)
            for _ in range(3):
                votes[("ok",)].inc()
            samples[("rl",)].inc()
    else:
        def turn() -> None:
            m.requests.labels(ROUTE, str(200)).inc()
            m.latency.labels(ROUTE).observe(0.01)
            for _ in range(3):
                m.judge_votes.labels("ok").inc()
            m.samples.labels("rl").inc()
    print(f"3. a turn's six metric updates at the bound sites: {best(turn, 20000):.3f}")
    print(f"3. an unbound m.turns.labels('main').inc(): {best(lambda: m.turns.labels('main').inc(), 20000):.3f}")


if __name__ == "__main__":
    main()
