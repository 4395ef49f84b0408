"""Weight-version staleness: how many trainer steps behind the weights that sampled a turn are.

Stage: spool → **staleness check** → trainer. The proxy records, per turn, the ``weight_version`` the
policy server reported while sampling it (SGLang's ``meta_info.weight_version``; ``mixed:a,b`` when an
update landed mid-generation). The trainers label every sync ``step-N``; SGLang reports ``default``
until its first update, i.e. the weights the server was started with (step 0). A sample from step N,
trained at step S, is S − N steps stale. Slime's asynchronous loop trains at staleness 1 by design, and
turns that finish after their batch closed wait one more batch (2); anything older (a slow session,
samples left in the spool by an earlier run) is refused beyond the bound, and every refusal is counted. A label that names no step (a server that reports no versions,
or a foreign label) cannot be checked: such samples are kept and counted as ``unversioned``.
"""

from __future__ import annotations

import logging
import re

from openclaw_rl.samples import TrainingSample

log = logging.getLogger(__name__)

_STEP = re.compile(r"step-(\d+)$")


def version_label(step: int) -> str:
    """The label a sync after ``step`` optimizer steps gives the served weights."""
    return f"step-{step}"


def version_step(label: object) -> int | None:
    """Trainer step of a version label; the oldest one of a ``mixed:`` label; None if it names none."""
    if label is None:
        return None
    text = str(label)
    if text == "default":
        return 0
    if text.startswith("mixed:"):
        steps = [version_step(part) for part in text[len("mixed:"):].split(",")]
        known = [s for s in steps if s is not None]
        return min(known) if known and len(known) == len(steps) else None
    match = _STEP.fullmatch(text)
    return int(match.group(1)) if match else None


def admit(samples: list[TrainingSample], step: int, max_staleness: int) -> tuple[list[TrainingSample], dict[str, float]]:
    """Split a batch at the staleness bound (``max_staleness < 0``: no bound); returns kept + metrics."""
    kept: list[TrainingSample] = []
    ages: list[int] = []
    refused = unversioned = foreign = 0
    for sample in samples:
        born = version_step(sample.metadata.get("weight_version"))
        if born is None:
            unversioned += 1
            kept.append(sample)
            continue
        age = step - born
        if age < 0:  # sampled by weights from a step this trainer has not reached: another run's samples
            foreign += 1
            log.warning("refusing sample %s (session %s turn %d): sampled by %s, a step this trainer (at step %d) "
                        "has not reached: another run's sample", sample.sample_id, sample.session_id, sample.turn,
                        sample.metadata.get("weight_version"), step)
            continue
        ages.append(age)
        if 0 <= max_staleness < age:
            refused += 1
            log.warning("refusing sample %s (session %s turn %d): sampled by %s, %d steps old > bound %d",
                        sample.sample_id, sample.session_id, sample.turn, sample.metadata.get("weight_version"),
                        age, max_staleness)
            continue
        kept.append(sample)
    metrics = {"train/stale_samples_refused": float(refused), "train/unversioned_samples": float(unversioned),
               "train/foreign_samples_refused": float(foreign)}
    if ages:
        metrics.update({"train/staleness_mean": sum(ages) / len(ages), "train/staleness_min": float(min(ages)),
                        "train/staleness_max": float(max(ages))})
    return kept, metrics
