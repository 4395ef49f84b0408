#!/usr/bin/env python3
"""Where the test suite's time goes, from a ``--cost-log`` file.

    bash scripts/run_tests.sh --cost-log runs/suite-cost.jsonl
    python scripts/suite_cost.py runs/suite-cost.jsonl [--top 25]

Prints the CPU and wall seconds per test module (largest CPU first), the most expensive tests, and each
pytest-xdist worker's busy span. CPU is the test process's own plus that of the child processes it reaped
(servers and CLIs the test started and stopped); a background process reaped later (the tiny-model build)
is charged to the test that happened to be running.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log", type=Path)
    p.add_argument("--top", type=int, default=25, help="rows per table")
    ns = p.parse_args()
    rows = [json.loads(line) for line in ns.log.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"{ns.log}: no tests recorded")
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        m = modules[r["test"].split("::")[0]]
        m[0] += r["cpu_s"]
        m[1] += r["wall_s"]
        m[2] += 1
    cpu, wall = sum(r["cpu_s"] for r in rows), sum(r["wall_s"] for r in rows)
    print(f"{len(rows)} tests: {cpu:.1f} CPU-s, {wall:.1f} wall-s summed over workers")
    print(f"\n{'CPU-s':>8} {'wall-s':>8} {'tests':>6}  module")
    for name, (c, w, n) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:ns.top]:
        print(f"{c:8.1f} {w:8.1f} {n:6d}  {name}")
    print(f"\n{'CPU-s':>8} {'wall-s':>8}  test")
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[:ns.top]:
        print(f"{r['cpu_s']:8.2f} {r['wall_s']:8.2f}  {r['test']}")
    t0 = min(r["start"] for r in rows)
    print(f"\n{'worker':<8} {'first':>7} {'last end':>9} {'busy wall-s':>12} {'CPU-s':>8}")
    for worker in sorted({r["worker"] for r in rows}):
        mine = [r for r in rows if r["worker"] == worker]
        print(f"{worker:<8} {min(r['start'] for r in mine) - t0:7.1f} "
              f"{max(r['start'] + r['wall_s'] for r in mine) - t0:9.1f} {sum(r['wall_s'] for r in mine):12.1f} "
              f"{sum(r['cpu_s'] for r in mine):8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
