"""Smoke test of the proxy benchmark: ``--quick`` runs end to end and writes every metric and the chart.

It checks shape, not speed: a benchmark's numbers depend on the machine, so no time is asserted here.
The two correctness checks that are asserted make the numbers meaningful: the proxy answered every
turn, and it rendered exactly the token ids the benchmark sent straight to the mock.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from openclaw_rl.bench.mock import ensure_tokenizer
from openclaw_rl.bench.proxy_bench import METRIC_KEYS, TARGETS

ROOT = Path(__file__).resolve().parents[2]


def test_quick_bench_writes_every_metric_and_the_chart(tmp_path: Path) -> None:
    out, png = tmp_path / "results.json", tmp_path / "bench.png"
    tokenizer_dir = ensure_tokenizer(tmp_path / "cache")  # the tokenizer alone: no model build (pre-training)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_proxy.py"), "--quick", "--out", str(out),
                           "--plot", str(png), "--tokenizer", str(tokenizer_dir)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    results = json.loads(out.read_text())
    assert set(METRIC_KEYS) <= set(results["metrics"]), set(METRIC_KEYS) - set(results["metrics"])
    assert [row["metric"] for row in results["targets"]] == [t[0] for t in TARGETS]
    assert all(set(row) == {"metric", "value", "target", "pass", "meaning"} for row in results["targets"])
    assert results["metrics"]["a_turns"] > 0 and results["metrics"]["stream_pairs"] > 0
    assert results["metrics"]["a_errors"] == results["metrics"]["b_errors"] == results["metrics"]["c_errors"] == 0
    assert results["checks"].get("prompt_token_mismatches", 0) == 0, results["checks"]
    assert results["checks"].get("content_mismatches", 0) == 0, results["checks"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "PASS" in proc.stdout or "MISS" in proc.stdout  # the target table was printed
