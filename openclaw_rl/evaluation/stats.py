"""Scores with confidence intervals, and the before/after verdict, for ``openclaw-rl eval``.

Stage: **evaluation** → report. Every score is a rate of pass/fail outcomes (a reply in the person's
style, the right number, the right tool call), so its interval is the Wilson score interval (it stays
inside [0, 1] and is sane at 0 of n and n of n, where the normal approximation is not). A checkpoint is
called *better* or *worse* than the baseline only when the two 95% intervals do not overlap, which is
stricter than a two-proportion test at 5%: an evaluation that cannot tell says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054


@dataclass(frozen=True, slots=True)
class Score:
    passed: int
    total: int
    low: float
    high: float

    @property
    def rate(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def text(self) -> str:
        if not self.total:
            return "n/a"
        return f"{self.rate:.0%} [{self.low:.0%}, {self.high:.0%}] (n={self.total})"


def wilson(passed: int, total: int, z: float = Z95) -> Score:
    """The Wilson score interval of `passed` successes out of `total` trials."""
    if total <= 0:
        return Score(0, 0, 0.0, 1.0)
    if not 0 <= passed <= total:
        raise ValueError(f"{passed} passed out of {total}")
    p = passed / total
    denom = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    low = 0.0 if passed == 0 else max(0.0, centre - half)  # exact at the ends (the float sum is 1 - 1e-16)
    high = 1.0 if passed == total else min(1.0, centre + half)
    return Score(passed, total, low, high)


def verdict(before: Score, after: Score) -> str:
    """``better`` / ``worse`` when the 95% intervals are apart, else ``no clear change``."""
    if not before.total or not after.total:
        return "n/a"
    if after.low > before.high:
        return "better"
    if after.high < before.low:
        return "worse"
    return "no clear change"
