"""`openclaw-rl eval --through-openclaw` with real stock OpenClaw (Node 24, openclaw 2026.9.6).

Optional and slow (each OpenClaw turn carries its ~15.6K-token prompt through the CPU engine): skipped,
like ``test_openclaw_real.py``, unless Node >= 24 and the `openclaw` CLI are found on PATH or where
``scripts/openclaw_chat_demo.sh`` installs them (the repository's gitignored .openclaw-demo/).
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from dataclasses import replace

import pytest

from openclaw_rl.evaluation.runner import EvalOptions, served_checkpoint
from openclaw_rl.evaluation.suite import load_suite
from openclaw_rl.evaluation.through_openclaw import evaluate_through_openclaw, find_openclaw

FOUND = find_openclaw()


def _turns(metrics: str, kind: str) -> float:
    match = re.search(rf'openclaw_turns_total\{{type="{kind}"\}} ([0-9.e+]+)', metrics)
    return float(match.group(1)) if match else 0.0


@pytest.mark.slow
@pytest.mark.skipif(FOUND is None, reason="needs Node >= 24 and openclaw on PATH or in .openclaw-demo/ "
                                           "(bash scripts/openclaw_chat_demo.sh installs both)")
def test_eval_through_stock_openclaw_scores_its_replies_and_trains_nothing() -> None:
    assert FOUND is not None
    from openclaw_rl.embedded.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(openclaw=True)  # what `eval --through-openclaw --target untrained` serves
    full = load_suite("default")
    suite = replace(full, people=full.people[:1], homework=full.homework[:1], file_edits=())
    opts = EvalOptions(conversations=1, turns=2, concurrency=1, max_tokens=48, timeout_s=900)
    with served_checkpoint(str(model), max_new_tokens=opts.max_tokens) as proxy:
        outcomes = asyncio.run(evaluate_through_openclaw(proxy.url, suite, opts, FOUND, label="untrained"))
        metrics = urllib.request.urlopen(f"{proxy.url}/metrics", timeout=30).read().decode()
    for outcome in outcomes:
        print(f"{outcome.task:>16} | exit {outcome.detail['openclaw_exit']} | passed {outcome.passed} | "
              f"{outcome.prompt!r} -> {outcome.reply[-200:]!r}")
    print(f"proxy turns: main {_turns(metrics, 'main'):.0f}, side {_turns(metrics, 'side'):.0f}")
    assert len(outcomes) == 3, outcomes  # 2 person turns, 1 homework question
    assert [o.task for o in outcomes].count("homework") == 1
    assert sorted(o.turn for o in outcomes if o.subject == suite.people[0].name) == [0, 1]
    assert any(o.detail["openclaw_exit"] == 0 and o.reply for o in outcomes), outcomes
    # every model request OpenClaw made carried X-Turn-Type: side (its provider `headers`): nothing trains
    assert _turns(metrics, "side") >= 3, metrics
    assert _turns(metrics, "main") == 0, metrics
