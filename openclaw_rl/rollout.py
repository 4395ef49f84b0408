"""Slime hooks of the Binary RL mode (``--rollout-function-path openclaw_rl.rollout.generate_rollout_openclaw``).

Thin by design: the bridge in ``openclaw_rl.slime_hooks.bridge`` does the work for every mode.
"""

from __future__ import annotations

from typing import Any

from openclaw_rl.slime_hooks.bridge import eval_generate, eval_reward, rollout


def generate_rollout_openclaw(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """Wait for ``args.rollout_batch_size`` judged turns from live traffic and return them to Slime."""
    return rollout(args, rollout_id, evaluation, mode="rl")


generate = eval_generate  # --custom-generate-function-path openclaw_rl.rollout.generate
reward_func = eval_reward  # --custom-rm-path openclaw_rl.rollout.reward_func
