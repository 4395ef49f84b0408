"""``python -m openclaw_rl.bench.hint_picks RUN_DIR…``: which kind of hint a selection rule kept, per run.

Stage: measurement of scorer → teacher → **hint selection** on ``openclaw-rl local --judge-hints several``
runs (``openclaw_rl/embedded/hint_judge.py``: every corrected turn gets a precise, a vague and a verbose
candidate). Reads each run's judge records (``records/judge.jsonl``, one line per judged turn, written by
the proxy's writer) and counts, over the turns that made a sample:

- ``turns``: the kind of the hint each turn's sample names (``sequence_optimal``: the one candidate whose
  signal it keeps; ``token_optimal``: the candidate most of its tokens came from; ``shortest``: candidate 0);
- ``tokens``: for the scored rules, how many response tokens took their teacher values from each kind.

Prints one JSON object per run directory.
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m openclaw_rl.bench.hint_picks", description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", help="openclaw-rl local --out-dir directories")
    ns = p.parse_args(argv)
    for run in ns.run_dirs:
        path = Path(run) / "records" / "judge.jsonl"
        if not path.exists():
            print(f"{path}: no judge records", file=sys.stderr)
            return 1
        print(json.dumps({"run": run, **hint_picks(path)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
