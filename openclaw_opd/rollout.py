"""Slime hooks of the OPD mode (``--rollout-function-path openclaw_opd.rollout.generate_rollout_openclaw_opd``)."""

from __future__ import annotations

from typing import Any

from openclaw_rl.slime_hooks.bridge import eval_generate, eval_reward, rollout


def generate_rollout_openclaw_opd(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """Wait for ``args.rollout_batch_size`` hint-accepted turns (with teacher log-probs) and return them."""
    return rollout(args, rollout_id, evaluation, mode="opd")


generate = eval_generate
reward_func = eval_reward
