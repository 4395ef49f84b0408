"""Slime hooks of the Combine mode (``--rollout-function-path openclaw_combine.rollout.generate_rollout_openclaw_combine``)."""

from __future__ import annotations

from typing import Any

from openclaw_rl.slime_hooks.bridge import eval_generate, eval_reward, rollout


def generate_rollout_openclaw_combine(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """Wait for ``args.rollout_batch_size`` turns with an RL and/or OPD signal and return them."""
    return rollout(args, rollout_id, evaluation, mode="combine")


generate = eval_generate
reward_func = eval_reward
