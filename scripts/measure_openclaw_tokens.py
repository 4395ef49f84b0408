"""Tokens of the recorded OpenClaw requests (tests/data/openclaw-golden) under the tiny tokenizer.

Usage: python scripts/measure_openclaw_tokens.py [MODEL_DIR]   (default: build the tokenizer into a temp dir)
The recordings are held-out data: the tokenizer's corpus is synthetic (openclaw_like.py).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "data" / "openclaw-golden"


def main() -> None:
    from transformers import AutoTokenizer

    from openclaw_rl.embedded.openclaw_golden import golden_prompt_ids

    if len(sys.argv) > 1:
        tok = AutoTokenizer.from_pretrained(sys.argv[1])
    else:
        from openclaw_rl.embedded.tiny_model import build_tokenizer

        t0 = time.perf_counter()
        tok = build_tokenizer(Path(tempfile.mkdtemp()))
        print(f"tokenizer built in {time.perf_counter() - t0:.1f}s")
    for path in sorted(GOLDEN.glob("*.jsonl")):
        body = json.loads(path.read_text().splitlines()[0])["body"]
        ids = golden_prompt_ids(tok, body)
        text, n = tok.decode(ids), len(ids)
        print(f"{path.name}: {len(text)} characters -> {n} tokens ({len(text) / n:.2f} chars/token)")


if __name__ == "__main__":
    main()
