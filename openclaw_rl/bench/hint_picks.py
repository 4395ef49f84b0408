"""``python -m openclaw_rl.bench.hint_picks RUN_DIR…``: which kind of hint a selection rule kept, per run.

Stage: measurement of scorer → teacher → **hint selection** on ``openclaw-rl local --judge-hints several``
runs (``openclaw_rl/embedded/hint_judge.py``: every corrected turn gets a precise, a vague and a verbose
candidate). Reads each run's judge records (``records/judge.jsonl``, one line per judged turn, written by
the proxy's writer) and counts, over the turns that made a sample:

- ``turns``: the kind of the hint each turn's sample names (``sequence_optimal``: the one candidate whose
  signal it keeps; ``token_optimal``: the candidate most of its tokens came from; ``shortest``: candidate 0);
- ``tokens``: for the scored rules, how many response tokens took their teacher values from each kind.

Prints one JSON object per run directory. ``--teacher-openers`` instead prints how informative each kind is
as a teacher: the untrained tiny model's (the frozen teacher's) exact probability of each style's opener
on 32 requests with that kind of hint appended as the teacher sees it (the correction "formal").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from openclaw_rl.embedded.hint_judge import KINDS, hint_kind


def hint_picks(judge_records: Path) -> dict[str, Any]:
    """{"samples", "turns": {kind: n}, "tokens": {kind: n}} over the accepted turns of one judge.jsonl."""
    turns: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    samples = 0
    with open(judge_records, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if not record.get("accepted"):
                continue
            samples += 1
            turns[hint_kind(record.get("hint", ""))] += 1
            for c in record.get("candidates", ()):
                tokens[hint_kind(c["hint"])] += int(c["tokens"])
    return {"samples": samples, "turns": {k: turns[k] for k in KINDS},
            "tokens": {k: tokens[k] for k in KINDS} if tokens else None}


def teacher_openers(preset: str = "h128", seed: int = 0, style: str = "formal") -> dict[str, dict[str, float]]:
    """{hint kind (and "none"): {style: P(opener)}} for the untrained tiny model, the frozen OPD teacher."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from openclaw_rl.embedded import task
    from openclaw_rl.embedded.hint_judge import kind_hint
    from openclaw_rl.embedded.pretrain import style_probabilities
    from openclaw_rl.embedded.tiny_model import ensure_tiny_model

    model_dir = ensure_tiny_model(preset, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32").eval()
    precise = task.STYLES[style].instruction
    out = {}
    for kind in ("none", *KINDS):
        prompts = []
        for r in task.REQUESTS[:32]:
            hint = "" if kind == "none" else kind_hint(kind, precise, task.correction(style, r.text), seed)
            prompts.append([{"role": "user", "content": task.with_hint(r.text, hint) if hint else r.text}])
        out[kind] = {k: round(v, 4) for k, v in style_probabilities(model, tokenizer, prompts).items()}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m openclaw_rl.bench.hint_picks", description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="*", help="openclaw-rl local --out-dir directories")
    p.add_argument("--teacher-openers", action="store_true", help="P(opener) of the frozen teacher per hint kind")
    p.add_argument("--seed", type=int, default=0, help="--teacher-openers: the tiny model's seed")
    ns = p.parse_args(argv)
    if ns.teacher_openers:
        print(json.dumps({"seed": ns.seed, **teacher_openers(seed=ns.seed)}))
        return 0
    for run in ns.run_dirs:
        path = Path(run) / "records" / "judge.jsonl"
        if not path.exists():
            print(f"{path}: no judge records", file=sys.stderr)
            return 1
        print(json.dumps({"run": run, **hint_picks(path)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
