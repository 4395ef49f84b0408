"""The loss the embedded trainer runs for mode ``opd``: what the Slime scripts configure, as one function.

Slime picks the OPD loss with launch flags (token level: the OPD advantage then the built-in PPO loss;
``--distill-topk K``: the top-K custom loss). The embedded trainer has no flags, so this function makes
the same choice from ``args.distill_topk`` and calls the very functions the Slime path uses.
"""

from __future__ import annotations

from typing import Any

from openclaw_opd.loss import on_policy_distillation_advantages, topk_distillation_loss_function
from openclaw_rl.losses.policy_loss import policy_loss_function


def opd_loss_function(args: Any, batch: dict[str, Any], logits: Any, sum_of_sample_mean: Any) -> Any:
    if (getattr(args, "distill_topk", 0) or 0) > 0:
        return topk_distillation_loss_function(args, batch, logits, sum_of_sample_mean)
    on_policy_distillation_advantages(args, batch)  # A = teacher − old, Slime's estimator
    return policy_loss_function(args, batch, logits, sum_of_sample_mean)
