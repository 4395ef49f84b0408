"""Compatibility re-exports only; nothing the launch scripts name lives here.

A Slime checkout owns a regular ``slime_plugins`` package that wins the name whenever it comes first
on ``sys.path`` (Ray puts it there), so the hooks and the loss maths live in ``openclaw_rl.slime_hooks``
and ``openclaw_rl.losses``. This module re-exports them for code that imported the old location while
our ``slime_plugins`` portion happens to be importable.
"""

from openclaw_rl.losses.policy_loss import policy_loss_function, ppo_policy_loss
from openclaw_rl.slime_hooks.bridge import eval_generate, eval_reward, rollout

__all__ = ["eval_generate", "eval_reward", "policy_loss_function", "ppo_policy_loss", "rollout"]
