"""PPO policy loss in Slime's custom-loss signature, shared by the Slime path and the embedded trainer.

``fn(args, batch, logits, sum_of_sample_mean) -> (loss, metrics)``, called once per micro-batch:
recompute the current log-probs of the response tokens, take the clipped surrogate against the old
log-probs, add the entropy bonus and the optional KL-to-reference term, and report the keys Slime's
built-in policy loss reports. The per-token advantages come from the batch (plain GRPO) or from the
caller (the combine mode builds its own).

Deviations from Slime's built-in ``policy_loss_function``:
1) TIS/ICEPOP, OPSM, score centering, custom pg-loss reducers and the GSPO/CISPO variants are not
   implemented; enabling one raises instead of being ignored.
2) ``train_rollout_logprob_abs_diff`` compares the current (detached) log-probs with the rollout ones.
   With one optimiser step per rollout these equal the recomputed old log-probs.
3) ``--use-kl-loss`` with a non-zero coefficient but no ``ref_log_probs`` raises; with coefficient 0 the
   KL is only a detached metric (as in current Slime) and is skipped when no reference exists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from openclaw_rl.losses.logprobs import iter_response_logits, log_probs_and_entropy
from openclaw_rl.losses.policy_math import compute_approx_kl, compute_policy_loss

Reducer = Callable[[torch.Tensor], torch.Tensor]

_UNSUPPORTED_FLAGS = ("use_tis", "use_opsm", "use_score_centering", "custom_pg_loss_reducer_function_path")
_UNSUPPORTED_ESTIMATORS = ("gspo", "cispo")


def _check_supported(args: Any) -> None:
    for flag in _UNSUPPORTED_FLAGS:
        if getattr(args, flag, None):
            raise ValueError(f"--{flag.replace('_', '-')} is not supported by the openclaw policy loss; unset it")
    estimator = getattr(args, "advantage_estimator", None)
    if estimator in _UNSUPPORTED_ESTIMATORS:
        raise ValueError(f"--advantage-estimator {estimator} needs Slime's built-in policy loss, not this one")


def _has_values(per_sample: Sequence[torch.Tensor] | None) -> bool:
    return per_sample is not None and len(per_sample) > 0


def cat_like(per_sample: Sequence[torch.Tensor], like_T: torch.Tensor, name: str) -> torch.Tensor:
    """Concatenate per-sample tensors onto ``like_T``'s device and dtype, checking the token count."""
    if len(per_sample) == 0:
        values_T = like_T.new_zeros((0,))
    else:
        values_T = torch.cat([v.reshape(-1).to(device=like_T.device, dtype=like_T.dtype) for v in per_sample])
    if values_T.numel() != like_T.numel():
        raise ValueError(f"{name}: {values_T.numel()} values for {like_T.numel()} response tokens")
    return values_T


def ppo_policy_loss(
    args: Any,
    batch: Mapping[str, Any],
    logits: torch.Tensor,
    sum_of_sample_mean: Reducer,
    advantages: Sequence[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped loss + entropy bonus + optional KL penalty; ``advantages`` defaults to the batch's.

    ``old`` is ``batch['log_probs']`` (or ``rollout_log_probs`` with ``args.use_rollout_logprobs``);
    when the batch carries no old log-probs the current ones, detached, stand in (ratio 1), as in Slime.
    """
    _check_supported(args)
    entropy_coef = float(getattr(args, "entropy_coef", 0.0) or 0.0)

    log_probs, entropies = [], []
    for logits_RV, tokens_R in iter_response_logits(args, batch, logits):
        log_probs_R, entropy_R = log_probs_and_entropy(logits_RV, tokens_R, entropy_grad=entropy_coef != 0.0)
        log_probs.append(log_probs_R)
        entropies.append(entropy_R)
    float_dtype = logits.dtype if logits.dtype == torch.float64 else torch.float32
    empty_T = logits.new_zeros((0,), dtype=float_dtype)
    log_probs_T = torch.cat(log_probs) if log_probs else empty_T
    entropy_T = torch.cat(entropies) if entropies else empty_T

    use_rollout = bool(getattr(args, "use_rollout_logprobs", False))
    old_per_sample = batch.get("rollout_log_probs") if use_rollout else batch.get("log_probs")
    if use_rollout and not _has_values(old_per_sample):
        raise ValueError("use_rollout_logprobs is set but the batch has no rollout_log_probs")
    if _has_values(old_per_sample):
        old_T = cat_like(old_per_sample, log_probs_T, "old log_probs")
    else:
        old_T = log_probs_T.detach()
    per_sample_advantages = batch["advantages"] if advantages is None else advantages
    advantages_T = cat_like(per_sample_advantages, log_probs_T, "advantages")

    eps_clip = float(args.eps_clip)
    eps_clip_high = getattr(args, "eps_clip_high", None)
    eps_clip_high = eps_clip if eps_clip_high is None else float(eps_clip_high)
    ppo_kl_T = old_T - log_probs_T
    pg_T, clipfrac_T = compute_policy_loss(
        ppo_kl_T, advantages_T, eps_clip, eps_clip_high, eps_clip_c=getattr(args, "eps_clip_c", None)
    )
    pg_loss = sum_of_sample_mean(pg_T)
    entropy_loss = sum_of_sample_mean(entropy_T)
    loss = pg_loss - entropy_coef * entropy_loss

    kl_loss = None
    if getattr(args, "use_kl_loss", False):
        kl_loss_coef = float(getattr(args, "kl_loss_coef", 0.0) or 0.0)
        ref_per_sample = batch.get("ref_log_probs")
        if _has_values(ref_per_sample):
            ref_T = cat_like(ref_per_sample, log_probs_T, "ref_log_probs")
            # A zero coefficient keeps KL as a metric only: no graph, no NaN leaking into the gradient.
            kl_input_T = log_probs_T if kl_loss_coef != 0.0 else log_probs_T.detach()
            ratio_T = (kl_input_T - old_T).exp() if getattr(args, "use_unbiased_kl", False) else None
            kl_T = compute_approx_kl(kl_input_T, ref_T, getattr(args, "kl_loss_type", "k1"), ratio_T)
            kl_loss = sum_of_sample_mean(kl_T)
            if kl_loss_coef != 0.0:
                loss = loss + kl_loss_coef * kl_loss
        elif kl_loss_coef != 0.0:
            raise ValueError("use_kl_loss with kl_loss_coef != 0 needs ref_log_probs in the batch")

    logprob_abs_diff = None
    rollout_per_sample = batch.get("rollout_log_probs")
    if _has_values(rollout_per_sample):
        rollout_T = cat_like(rollout_per_sample, log_probs_T, "rollout_log_probs")
        logprob_abs_diff = sum_of_sample_mean((log_probs_T.detach() - rollout_T).abs())

    if log_probs_T.numel() == 0:
        loss = loss + 0 * logits.sum()  # keep every parameter in the graph for an all-empty micro-batch

    metrics = {
        "loss": loss.detach().clone(),
        "pg_loss": pg_loss.detach().clone(),
        "entropy_loss": entropy_loss.detach().clone(),
        "pg_clipfrac": sum_of_sample_mean(clipfrac_T).detach(),
        "ppo_kl": sum_of_sample_mean(ppo_kl_T).detach(),
    }
    if kl_loss is not None:
        metrics["kl_loss"] = kl_loss.detach().clone()
    if logprob_abs_diff is not None:
        metrics["train_rollout_logprob_abs_diff"] = logprob_abs_diff
    return loss, metrics


def policy_loss_function(
    args: Any, batch: Mapping[str, Any], logits: torch.Tensor, sum_of_sample_mean: Reducer
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The plain GRPO path: :func:`ppo_policy_loss` on ``batch['advantages']``."""
    return ppo_policy_loss(args, batch, logits, sum_of_sample_mean)
