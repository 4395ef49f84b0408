"""Slime hooks of the OEL mode (``--rollout-function-path openclaw_oel.rollout.generate_rollout_openclaw_oel``)."""

from __future__ import annotations

from typing import Any

from openclaw_rl.slime_hooks.bridge import eval_generate, eval_reward, rollout


def generate_rollout_openclaw_oel(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """Wait for ``args.rollout_batch_size`` OEL samples (teacher top-K under the session's experience)."""
    return rollout(args, rollout_id, evaluation, mode="oel")


generate = eval_generate
reward_func = eval_reward
