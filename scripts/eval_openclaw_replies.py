"""What the tiny model answers to the recorded OpenClaw prompts (tests/data/openclaw-golden, held out).

    python scripts/eval_openclaw_replies.py [--n 16] [--preset h128] [--model openclaw|plain]

Prints, per recorded request, the prompt's token count and the style of n sampled replies, then the
totals: replies with visible text in one of the task's styles (what OpenClaw shows instead of "Agent
couldn't generate a response") and the share of each style (untrained: about 1/K each).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "data" / "openclaw-golden"


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from openclaw_rl.embedded import task
    from openclaw_rl.embedded.openclaw_golden import golden_prompt_ids, recorded_bodies, reply_styles
    from openclaw_rl.embedded.tiny_model import ensure_tiny_model

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--preset", default="h128")
    p.add_argument("--model", choices=("openclaw", "plain"), default="openclaw",
                   help="the tiny-model variant (openclaw: pre-trained on OpenClaw-shaped prompts too)")
    p.add_argument("--model-dir", default="")
    p.add_argument("--max-prompts", type=int, default=0, help="stop after this many recorded requests (0: all)")
    ns = p.parse_args()
    torch.set_num_threads(1)
    model_dir = ns.model_dir or ensure_tiny_model(ns.preset, openclaw=ns.model == "openclaw", log=print)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    total: Counter[str | None] = Counter()
    for name, body in recorded_bodies(GOLDEN)[:ns.max_prompts or None]:
        t0 = time.perf_counter()
        replies = reply_styles(model, tok, body, ns.n, seed=int(name.rsplit("#", 1)[1]))
        styles = Counter(style for style, _ in replies)
        total.update(styles)
        print(f"{name}: {len(golden_prompt_ids(tok, body))} prompt tokens, {time.perf_counter() - t0:.1f}s, "
              f"styles {dict(styles)}")
        print("   e.g.", repr(replies[0][1][:120]))
    n = sum(total.values())
    styled = n - total[None]
    shares = ", ".join(f"{s} {total[s] / n:.0%}" for s in task.STYLE_NAMES)
    print(f"total: {styled}/{n} replies styled ({styled / n:.0%}); {shares}; no style {total[None] / n:.0%}")

if __name__ == "__main__":
    main()
