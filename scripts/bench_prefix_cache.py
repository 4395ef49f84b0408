"""Benchmark the engine's prefix cache on OpenClaw-shaped requests (~15.7K tokens, one shared head).

Sends ``--requests`` fresh OpenClaw-shaped first requests (tests/data/openclaw-golden's system prompt,
tools, Runtime line and context block; only the person's words differ) one after another to a
``TorchModel`` without and with the prefix cache, alternating, and prints the seconds per reply side by
side plus the largest |Δ log-prob| between the two cores' greedy replies (the cache must not change them).

    python scripts/bench_prefix_cache.py [--requests 4] [--new-tokens 16] [--model openclaw]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openclaw_rl.embedded.openclaw_golden import golden_prompt_ids  # noqa: E402
from openclaw_rl.embedded.openclaw_replay import OpenClawShape, shaped_prompts  # noqa: E402
from openclaw_rl.embedded.tiny_model import ensure_tiny_model  # noqa: E402
from openclaw_rl.engine.model import SamplingConfig, TokenStep  # noqa: E402
from openclaw_rl.engine.torch_core import TorchModel  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "data" / "openclaw-golden" / "conversation_B.jsonl"


def reply(core: TorchModel, prompt: list[int], new_tokens: int) -> tuple[float, list[TokenStep]]:
    config = SamplingConfig(temperature=0.0, top_p=1.0, top_k=-1, min_p=0.0, max_new_tokens=new_tokens)

    async def run() -> list[TokenStep]:
        return [step async for step in core.generate(prompt, config)]

    started = time.perf_counter()
    steps = asyncio.run(run())
    return time.perf_counter() - started, steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--model", choices=("openclaw", "plain"), default="openclaw")
    p.add_argument("--out", default=None, help="write the figures as JSON here too")
    ns = p.parse_args()
    from transformers import AutoTokenizer

    model_dir = ensure_tiny_model("h128", openclaw=ns.model == "openclaw", log=print)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    shape = OpenClawShape.from_recording(GOLDEN)
    prompts = [golden_prompt_ids(tokenizer, body) for body in shaped_prompts(shape, ns.requests)]
    cores = {name: TorchModel.from_pretrained(model_dir, context_length=65536, prefix_cache_entries=entries)
             for name, entries in (("no cache", 0), ("prefix cache", 4))}
    times: dict[str, list[float]] = {name: [] for name in cores}
    gap = 0.0
    for prompt in prompts:
        outs = {}
        for name, core in cores.items():
            seconds, steps = reply(core, prompt, ns.new_tokens)
            times[name].append(seconds)
            outs[name] = steps
        a, b = outs.values()
        assert [s.token_id for s in a] == [s.token_id for s in b], "the cache changed a greedy reply"
        gap = max(gap, *(abs(x.logprob - y.logprob) for x, y in zip(a, b)))
    cached = cores["prefix cache"].prefixes.stats
    result = {"prompt_tokens": [len(x) for x in prompts], "new_tokens": ns.new_tokens,
              "seconds_per_reply": {name: [round(t, 2) for t in ts] for name, ts in times.items()},
              "median_after_first": {name: round(statistics.median(ts[1:] or ts), 2) for name, ts in times.items()},
              "max_abs_logprob_diff": gap, "reused_tokens": cached.reused_tokens, "hits": cached.hits}
    print(json.dumps(result, indent=2))
    slow, fast = result["median_after_first"].values()
    print(f"OpenClaw-shaped reply ({statistics.mean(result['prompt_tokens']):.0f} prompt tokens, {ns.new_tokens} "
          f"new): {slow:.2f}s without the prefix cache, {fast:.2f}s with it ({slow / fast:.1f}x); "
          f"max |dlogprob| {gap:.1e}")
    if ns.out:
        Path(ns.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
