"""``--cost-log`` (tests/conftest.py) records every test's CPU and wall time, and scripts/suite_cost.py sums them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_cost_log_has_one_line_per_test_and_the_summary_sums_them(tmp_path: Path) -> None:
    log = tmp_path / "cost.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # a plain run, not a worker's
    plugins_not_needed = ["-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:hypothesispytest", "-p", "no:anyio"]
    run = subprocess.run([sys.executable, "-m", "pytest", "tests/core/test_identity.py", "-q", *plugins_not_needed,
                          "--cost-log", str(log)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    outcome = run.stdout.strip().splitlines()[-1].split()  # e.g. "8 passed in 0.30s" or "7 passed, 1 skipped ..."
    ran = sum(int(n) for n, what in zip(outcome, outcome[1:]) if what.rstrip(",") in ("passed", "skipped"))
    assert ran > 0 and len(rows) == ran and all(r["test"].startswith("tests/core/test_identity.py::") for r in rows)
    assert all(r["cpu_s"] >= 0 and r["wall_s"] >= 0 and r["worker"] == "main" for r in rows)
    starts = [r["start"] for r in rows]
    assert starts == sorted(starts)  # in the order they ran

    summary = subprocess.run([sys.executable, str(REPO / "scripts" / "suite_cost.py"), str(log), "--top", "3"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    module_row = next(line for line in summary.splitlines() if line.endswith("  tests/core/test_identity.py"))
    cpu, wall, count = module_row.split()[:3]
    assert int(count) == ran
    assert abs(float(cpu) - sum(r["cpu_s"] for r in rows)) < 0.1 and abs(float(wall) - sum(r["wall_s"] for r in rows)) < 0.1
    assert summary.count("tests/core/test_identity.py::") == 3  # --top 3 most expensive tests
