"""Smoke test of the proxy benchmark: ``--quick`` runs end to end and writes every metric and the chart.

It checks shape, not speed: a benchmark's numbers depend on the machine, so no time is asserted here.
The two correctness checks that are asserted make the numbers meaningful: the proxy answered every
turn, and it rendered exactly the token ids the benchmark sent straight to the mock.

The script runs in the test's own interpreter (``runpy``, as ``python scripts/bench_proxy.py`` would run it):
a new one would import torch and transformers once more for nothing; the mocks and the proxy under test are
still separate processes.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from openclaw_rl.bench.mock import ensure_tokenizer
from openclaw_rl.bench.report import METRIC_KEYS, TARGETS

ROOT = Path(__file__).resolve().parents[2]


def test_quick_bench_writes_every_metric_and_the_chart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "results.json", tmp_path / "bench.png"
    tokenizer_dir = ensure_tokenizer(tmp_path / "cache")  # the tokenizer alone: no model build (pre-training)
    script = ROOT / "scripts" / "bench_proxy.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--quick", "--out", str(out), "--plot", str(png),
                                      "--tokenizer", str(tokenizer_dir)])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the repository first on it
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    stdout, stderr = capsys.readouterr()
    assert exit_.value.code == 0, stdout[-2000:] + stderr[-4000:]
    results = json.loads(out.read_text())
    assert set(METRIC_KEYS) <= set(results["metrics"]), set(METRIC_KEYS) - set(results["metrics"])
    assert not [k for k in METRIC_KEYS if results["metrics"][k] is None]  # every one was measured
    assert [row["metric"] for row in results["targets"]] == [t[0] for t in TARGETS]
    assert all(set(row) == {"metric", "value", "target", "pass", "meaning"} for row in results["targets"])
    assert results["metrics"]["a_turns"] > 0 and results["metrics"]["stream_pairs"] > 0
    assert results["metrics"]["a_errors"] == results["metrics"]["b_errors"] == results["metrics"]["c_errors"] == 0
    assert results["checks"].get("prompt_token_mismatches", 0) == 0, results["checks"]
    assert results["checks"].get("content_mismatches", 0) == 0, results["checks"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "PASS" in stdout or "MISS" in stdout  # the target table was printed
