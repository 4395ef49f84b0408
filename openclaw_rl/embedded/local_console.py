"""What ``openclaw-rl local`` shows on the console: batch-fill progress, one line per step, drop counts.

Stage: trainer (reporting). Kept apart from the run itself (``local.py``) so the loop reads as a loop;
the line formats are pinned by tests/dashboard/test_local_console.py.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any


class PlainProgress:
    """Batch-fill progress for a log file: one plain line when the count changes, at most every
    `every_s` seconds (a tqdm bar writes a ``\r`` update per refresh, thousands into a redirected log)."""

    def __init__(self, every_s: float = 30.0, out: Any = None, clock: Any = time.monotonic):
        self.every_s, self.out, self.clock = every_s, out, clock
        self._last: tuple[int, int] | None = None
        self._at = -float("inf")

    def update(self, ready: int, total: int) -> None:
        now = self.clock()
        if (ready, total) == self._last or now - self._at < self.every_s:
            return
        self._last, self._at = (ready, total), now
        print(f"next batch: {min(ready, total)}/{total} samples ready", file=self.out or sys.stdout, flush=True)

    def write(self, line: str) -> None:
        print(line, file=self.out or sys.stdout, flush=True)

    def close(self) -> None:
        pass


class TqdmProgress:
    """Batch-fill progress as a live tqdm bar, for an interactive terminal."""

    def __init__(self) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=1, desc="next batch", unit="sample", leave=False, dynamic_ncols=True)

    def update(self, ready: int, total: int) -> None:
        self.bar.total = total
        self.bar.n = min(ready, total)
        self.bar.refresh()

    def write(self, line: str) -> None:
        self.bar.write(line)

    def close(self) -> None:
        self.bar.close()


def make_progress(enabled: bool, stream: Any = None) -> PlainProgress | TqdmProgress | None:
    """A tqdm bar on a terminal, periodic plain lines otherwise (a log file, a pipe), None if disabled."""
    if not enabled:
        return None
    stream = stream if stream is not None else sys.stderr
    if getattr(stream, "isatty", lambda: False)():
        try:
            return TqdmProgress()
        except ImportError:
            pass
    return PlainProgress()



def add_simulation_metrics(metrics: dict[str, float], sim: dict[str, Any]) -> None:
    """The simulated users' learning curve so far, logged with the step (the dashboard plots it)."""
    live = sim.get("live")
    if live is not None and live.matches:
        metrics["sim/preferred_rate"] = live.rate_curve(32)[-1]
        metrics["sim/replies"] = float(len(live.matches))


def drop_text(drops: Counter[str]) -> str:
    """`` | dropped 3 (no_next_state 2, zero_score 1)``: the turns dropped since the last step line, by reason
    (one line per turn, with its session and detail, goes to the log file)."""
    total = sum(drops.values())
    if not total:
        return ""
    return f" | dropped {total} (" + ", ".join(f"{k} {v}" for k, v in sorted(drops.items())) + ")"


def _print_step(step: int, m: dict[str, float], sim: dict[str, Any], bar: Any = None,
                drops: Counter[str] | None = None) -> None:
    """One line per optimizer step, printed as soon as the step is done (the weights reach the engine
    once the next batch is full; ``perf/sync_ms`` is in metrics.jsonl)."""
    from .trainer import metric_text  # loaded by then: the step was trained

    live = sim.get("live")
    rate = f" | preferred {live.rate_curve(32)[-1]:.0%} after {len(live.matches)} replies" if live and live.matches else ""
    line = (f"step {step:4d} | reward {m.get('rollout/reward_mean', 0):+.2f} | batch filled in "
          f"{m.get('rollout/batch_fill_seconds', 0):.1f}s | loss {m.get('train/loss', 0):+.4f} | "
          f"|Δlogprob| {metric_text(m, 'train/rollout_fidelity_abs_diff')} "
          f"(stale {metric_text(m, 'train/train_rollout_logprob_abs_diff')}) | "
          f"{int(m.get('rollout/samples', 0))} samples in {m.get('perf/train_seconds', 0):.1f}s{rate}"
          f"{drop_text(drops or Counter())}")
    if bar is not None:
        bar.write(line)
    else:
        print(line, flush=True)
