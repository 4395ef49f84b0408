"""``scripts/bench_stream_events.py`` takes the cost per event from two reply lengths: a single length (or lengths
out of order) is refused at once with one line, exit 2, instead of a ZeroDivisionError after the whole run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_stream_events.py"


@pytest.mark.parametrize("lengths", ["512", "512,64", "64,x"])
def test_lengths_that_give_no_per_event_cost_are_refused_before_anything_starts(lengths: str):
    done = subprocess.run([sys.executable, str(SCRIPT), "--lengths", lengths], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "two or more increasing positive token counts" in done.stderr
