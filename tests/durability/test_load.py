"""Load: many concurrent multi-turn sessions with the judge on; nothing lost, duplicated or reordered.

Reduced here (CI); ``OPENCLAW_TEST_FULL=1`` (scripts/run_full_tests.sh) runs 200 sessions x 10 turns.
"""

from __future__ import annotations

import asyncio
import gc
import os

import pytest
from support import on_loop, settle, wait_for_samples

from openclaw_rl.bench.load import run_load
from openclaw_rl.turns import Turn

FULL = os.environ.get("OPENCLAW_TEST_FULL") == "1"
SESSIONS, TURNS = (200, 10) if FULL else (40, 5)


@pytest.mark.slow
def test_concurrent_sessions_lose_nothing(policy_server, judge_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, judge_server.url, judge_votes=3, proxy_session_ttl_s=3600)
    report = asyncio.run(run_load(url, sessions=SESSIONS, turns=TURNS))
    assert report.ok == SESSIONS * TURNS and not report.errors, report.errors
    expected = SESSIONS * (TURNS - 1)  # every turn but each session's last has a next state ("thanks")
    samples = wait_for_samples(proxy, expected, timeout=120)
    keys = [(s.session_id, s.turn) for s in samples]
    assert len(keys) == len(set(keys)) == expected
    for i in range(SESSIONS):  # per-session spool order is turn order
        turns = [s.turn for s in samples if s.session_id == f"load-{i}"]
        assert turns == list(range(1, TURNS))
    assert all(s.reward == 1.0 for s in samples)
    # idle sessions expire: their last turns are flushed and nothing stays in memory
    assert on_loop(proxy, lambda: proxy.tracker.sweep(now=float("inf"))) == SESSIONS
    settle(proxy)
    assert not proxy.tracker.sessions and proxy.tracker.unsettled_turns == 0
    gc.collect()
    assert sum(type(o) is Turn for o in gc.get_objects()) == 0
