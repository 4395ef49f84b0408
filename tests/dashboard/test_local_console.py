"""`openclaw-rl local`'s quiet console: step lines with drop counts per reason, a short summary; one log
line per dropped turn goes to the run's log file, not the console."""

from __future__ import annotations

import io
import logging
from collections import Counter

from openclaw_rl.embedded.local import (
    LocalReport,
    attach_run_log,
    configure_local_logging,
    detach_run_log,
    summary_text,
)
from openclaw_rl.embedded.local_console import drop_text
from openclaw_rl.metrics import ProxyMetrics
from openclaw_rl.turns import DropReason


def test_drop_counts_per_reason():
    assert drop_text(Counter()) == ""
    assert drop_text(Counter({"zero_score": 1, "no_next_state": 2})) == " | dropped 3 (no_next_state 2, zero_score 1)"


def test_dropped_turns_go_to_the_log_file_not_the_console(tmp_path):
    console = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    handler = logging.StreamHandler(console)
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    try:
        configure_local_logging()
        path = attach_run_log(tmp_path)
        ProxyMetrics().drop(DropReason.NO_HINT, "s1", 2, "1 votes, none with a usable hint")
        logging.getLogger("openclaw_rl.x").warning("a real problem")
        detach_run_log()
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    logged = path.read_text()
    assert "turn dropped: reason=no_hint session=s1 turn=2" in logged and "a real problem" in logged
    assert "turn dropped" not in console.getvalue() and "a real problem" in console.getvalue()


def test_the_summary_points_at_the_report_instead_of_printing_it(tmp_path):
    report = LocalReport("rl", 3, 40, preferred_prob_before=0.1, preferred_prob_after=0.4, seconds=12.0,
                         metrics_path=str(tmp_path / "metrics.jsonl"), report_path=str(tmp_path / "report.json"),
                         log_path=str(tmp_path / "local.log"))
    text = summary_text(report)
    assert "{" not in text and len(text.splitlines()) <= 6
    assert f"report: {tmp_path / 'report.json'}" in text and "10% -> 40%" in text and "3 steps" in text
