"""Mode ``combine`` loss: one PPO step on a per-token mix of the OPD and GRPO advantages.

``A_t = w_opd * (teacher_t - old_t) + w_rl * A_grpo_t``, then exactly the shared PPO loss
(``openclaw_rl.losses.policy_loss.ppo_policy_loss``), so combine composes the opd advantage and the
rl loss instead of copying them. ``A_grpo`` is Slime's advantage from ``--advantage-estimator grpo
--disable-rewards-normalization`` (the eval score broadcast over the response).

Deviations from upstream ``openclaw-combine``:
1) The weights may come from ``args.openclaw_combine_w_rl`` / ``args.openclaw_combine_w_opd`` (the
   embedded trainer's config); the environment variables ``OPENCLAW_COMBINE_W_RL`` /
   ``OPENCLAW_COMBINE_W_OPD`` are the fallback, 1.0 the default. A non-numeric value raises.
2) A sample whose ``teacher_log_probs`` entry is missing gets a zero teacher advantage instead of a
   crash; a batch without the field gets zeros for every sample, as upstream.
3) Missing old log-probs raise with a remedy instead of a ``TypeError`` deep inside the loss.
4) The PPO loss itself carries the deviations listed in ``policy_loss`` (no TIS/OPSM, R = 0 safe).

Kept as upstream: RL-only samples use the rollout log-probs as their "teacher", so their teacher
advantage is ``rollout - recomputed`` (training/inference drift), not exactly 0.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from openclaw_opd.loss import opd_token_advantages
from openclaw_rl.config import ENV_FALLBACKS, PREFIX, load_settings
from openclaw_rl.losses.policy_loss import ppo_policy_loss


def combine_weights(args: Any) -> tuple[float, float]:
    """``(w_rl, w_opd)`` resolved by the one config path (``openclaw_rl.config``): the run config's
    ``args.openclaw_combine_w_*`` if set, else ``OPENCLAW_COMBINE_W_*``, else ``CombineSettings``' default."""
    keys = ("combine_w_rl", "combine_w_opd")
    values = {k: getattr(args, PREFIX + k) for k in keys if getattr(args, PREFIX + k, None) is not None}
    env = {var: os.environ[var] for var, key in ENV_FALLBACKS.items() if key in keys and var in os.environ}
    combine = load_settings(values, env=env).combine
    return combine.w_rl, combine.w_opd


def combined_advantages(
    grpo_advantages: Sequence[torch.Tensor],
    old_log_probs: Sequence[torch.Tensor],
    teacher_log_probs: Sequence[torch.Tensor | None] | None,
    w_rl: float,
    w_opd: float,
) -> list[torch.Tensor]:
    """``w_opd * (teacher - old) + w_rl * A_grpo`` per sample; no teacher means a zero teacher term."""
    if len(grpo_advantages) != len(old_log_probs):
        raise ValueError(f"{len(grpo_advantages)} advantage rows for {len(old_log_probs)} samples")
    teachers = teacher_log_probs if teacher_log_probs is not None else [None] * len(old_log_probs)
    # A missing teacher row stands in as "teacher = old", which makes its teacher advantage exactly 0.
    teachers = [old if teacher is None else teacher for teacher, old in zip(teachers, old_log_probs, strict=True)]
    teacher_advantages = opd_token_advantages(teachers, old_log_probs)
    return [
        w_opd * teacher_adv + w_rl * grpo_adv.to(device=teacher_adv.device, dtype=teacher_adv.dtype)
        for teacher_adv, grpo_adv in zip(teacher_advantages, grpo_advantages, strict=True)
    ]


def combine_loss_function(
    args: Any,
    batch: Mapping[str, Any],
    logits: torch.Tensor,
    sum_of_sample_mean: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Slime custom loss for ``combine``: the shared PPO loss on the combined advantages, or with
    ``openclaw_combine_loss: topk_select`` (the run config) the top-K select loss
    (``openclaw_combine.topk_select``), so the embedded trainer and a Slime run configured either way agree."""
    if (getattr(args, PREFIX + "combine_loss", None) or "ppo") == "topk_select":
        from openclaw_combine.topk_select import topk_select_loss_function

        return topk_select_loss_function(args, batch, logits, sum_of_sample_mean)
    w_rl, w_opd = combine_weights(args)
    use_rollout = bool(getattr(args, "use_rollout_logprobs", False))
    key = "rollout_log_probs" if use_rollout else "log_probs"
    old_log_probs = batch.get(key)
    if old_log_probs is None or len(old_log_probs) != len(batch["response_lengths"]):
        raise ValueError(f"combine needs batch[{key!r}] for every sample (the 'old' policy); keep Slime's "
                         "log-prob recompute on, or pass --use-rollout-logprobs")
    advantages = combined_advantages(
        batch["advantages"], old_log_probs, batch.get("teacher_log_probs"), w_rl, w_opd
    )
    return ppo_policy_loss(args, batch, logits, sum_of_sample_mean, advantages=advantages)
