"""Combine's ``topk_select`` loss (trainer stage): GRPO on the sampled token plus a PPO-style surrogate over
the teacher's top-K ids, upstream's recommended combine method (issue #28; upstream PR #109,
``openclaw-combine/openclaw_topk_select_loss.py`` at ngquochuy0101/OpenClaw-RL f48ac35).

Per response token t and id v of the subset S_t (the teacher's valid top-K ids, or with
``openclaw_opd_distill_subset: overlap`` those also in the student's top-K, or with ``student`` the student's
own top-K ids, which the trainer's teacher fills; ``openclaw_opd.loss``):

    w_v   = softmax_{u in S_t}(l_old(u))                      detached importance weight
    A_v   = clip(l_T(v) - l_old(v), -c, +c) * w_v              detached, c = openclaw_combine_topk_adv_diff_clip
    rho_v = exp(clamp(l_cur(v) - l_old(v), -20, 20))           l from the full (global) log-softmax
    L_v   = max(-A_v * rho_v, -A_v * clip(rho_v, 1 - eps_lo, 1 + eps_hi))
    L_t   = sum_{v in S_t} L_v                                  a sum over the subset, not a mean

and the loss is ``w_rl * GRPO + w_opd * sum_of_sample_mean(L_t)`` (+ the entropy bonus and KL term of the
shared PPO loss, once). The GRPO half is exactly ``openclaw_rl.losses.policy_loss.ppo_policy_loss`` on
``w_rl * A_grpo``. Shared by the embedded trainer (``openclaw_combine.loss.combine_loss_function``
dispatches here on ``openclaw_combine_loss: topk_select``) and Slime (``--custom-loss-function-path
openclaw_combine.topk_select.topk_select_loss_function``). Under Megatron tensor parallelism the log-probs at
the K ids come from one sharded pass (``gather_log_probs``), as the top-K OPD loss.

Deviations from upstream (written down in ``docs/differences.md``):
1) The teacher is an SGLang server (the judge's, or ``openclaw_opd_teacher_url``) that returns its own
   top-K, or, with ``openclaw_opd_teacher_source: trainer`` in the embedded trainer, a frozen copy there that
   fills the same top-K fields (``openclaw_rl/embedded/frozen_teacher.py``; upstream's
   ``OPENCLAW_COMBINE_OPD_TEACHER_SOURCE=megatron`` runs a Megatron teacher on its own GPU). Either way the
   loss gets the teacher's own top-K, so upstream's ``student`` subset is refused, and hint selection runs in
   the proxy (``openclaw_opd/selection.py``) before the sample is written, not in the loss.
2) ``l_old`` at the K ids is the current forward's, detached (no old-actor pass over the K ids is
   stored): with one optimiser step per rollout (our scripts' ``--num-steps-per-rollout 1``, the embedded
   trainer's one step per batch) that is the old policy exactly, so rho_v = 1 and the clip is inactive,
   as upstream's first step. The GRPO half keeps Slime's recomputed old log-probs.
3) A token whose teacher row is not a distribution (``teacher_rows_valid``) or that has no id in S_t
   contributes 0 and is counted; a negative ``w_rl`` is refused (the clipped loss is not linear in it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from openclaw_opd.loss import (
    _cat_tokens,
    distill_subset,
    in_student_topk,
    teacher_rows_valid,
    teacher_topk_rows,
)
from openclaw_rl.config import ENV_FALLBACKS, PREFIX, load_settings
from openclaw_rl.losses.logprobs import active_tp_group, gather_log_probs, iter_response_logits
from openclaw_rl.losses.policy_loss import ppo_policy_loss
from openclaw_rl.slime_hooks.topk import teacher_topk_from_batch

LOG_RATIO_CLAMP = 20.0  # |l_cur - l_old| before exp, as upstream's _PPO_KL_CLAMP


def topk_select_surrogate(
    cur_RK: torch.Tensor,
    old_RK: torch.Tensor,
    teacher_RK: torch.Tensor,
    valid_RK: torch.Tensor,
    eps_lo: float,
    eps_hi: float,
    diff_clip: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L_R, clipfrac_R)``: the per-token surrogate summed over the valid ids, and the fraction of them
    whose ratio was clipped. ``diff_clip`` None or <= 0: the teacher - old difference is not clipped."""
    zero = torch.zeros((), dtype=cur_RK.dtype, device=cur_RK.device)
    neg_inf = torch.full_like(cur_RK, -math.inf)
    old_RK = old_RK.detach().to(cur_RK.dtype)
    teacher_RK = teacher_RK.detach().to(cur_RK.dtype)
    any_R = valid_RK.any(dim=-1, keepdim=True)
    # softmax over the subset; a row with no valid id gets all -inf -> replace by zeros before softmax
    masked_old = torch.where(valid_RK, old_RK, neg_inf)
    w_RK = torch.softmax(torch.where(any_R, masked_old, torch.zeros_like(masked_old)), dim=-1)
    w_RK = torch.where(valid_RK, w_RK, zero)
    diff_RK = torch.where(valid_RK, teacher_RK - old_RK, zero)
    if diff_clip is not None and diff_clip > 0:
        diff_RK = diff_RK.clamp(-diff_clip, diff_clip)
    adv_RK = (diff_RK * w_RK).detach()
    log_ratio_RK = torch.where(valid_RK, cur_RK - old_RK, zero).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio_RK = log_ratio_RK.exp()
    unclipped = -adv_RK * ratio_RK
    clipped = -adv_RK * ratio_RK.clamp(1.0 - eps_lo, 1.0 + eps_hi)
    loss_RK = torch.where(valid_RK, torch.maximum(unclipped, clipped), zero)
    clipfrac_RK = torch.where(valid_RK, (clipped > unclipped).to(cur_RK.dtype), zero)
    n_R = valid_RK.sum(dim=-1).clamp(min=1).to(cur_RK.dtype)
    return loss_RK.sum(dim=-1), clipfrac_RK.sum(dim=-1) / n_R


def adv_diff_clip(args: Any) -> float:
    """The run config's ``openclaw_combine_topk_adv_diff_clip``, else ``OPENCLAW_TOPK_ADV_DIFF_CLIP``, else 1.0."""
    key = "combine_topk_adv_diff_clip"
    value = getattr(args, PREFIX + key, None)
    env = {var: os.environ[var] for var, k in ENV_FALLBACKS.items() if k == key and var in os.environ}
    return load_settings({key: value} if value is not None else {}, env=env).combine.topk_adv_diff_clip


def topk_select_loss_function(
    args: Any,
    batch: Mapping[str, Any],
    logits: torch.Tensor,
    sum_of_sample_mean: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Slime custom loss: ``w_rl`` x GRPO (shared PPO loss) + ``w_opd`` x the top-K select surrogate."""
    from openclaw_combine.loss import combine_weights

    w_rl, w_opd = combine_weights(args)
    if w_rl < 0:
        raise ValueError(f"topk_select: w_rl must be >= 0, got {w_rl} (the clipped PPO loss is not linear in a "
                         "negative weight)")
    topk = teacher_topk_from_batch(batch)
    if topk is None:
        raise ValueError("topk_select needs the teacher's top-K: batch keys teacher_topk_log_probs / "
                         "teacher_topk_indices, or teacher_log_probs unpacked by --rollout-data-postprocess-path "
                         "openclaw_rl.slime_hooks.topk.unpack_teacher_topk (run the combine proxy with "
                         "openclaw_opd_distill_topk > 0)")
    rl_loss, metrics = ppo_policy_loss(args, batch, logits, sum_of_sample_mean,
                                       advantages=[w_rl * a for a in batch["advantages"]])

    teacher_lp, teacher_ids = topk
    subset = distill_subset(args)
    eps_lo = float(args.eps_clip)
    eps_hi = getattr(args, "eps_clip_high", None)
    eps_hi = eps_lo if eps_hi is None else float(eps_hi)
    clip = adv_diff_clip(args)
    tp_group = active_tp_group()
    tp_size = 1 if tp_group is None else dist.get_world_size(tp_group)
    losses, clipfracs, sizes, invalid, diffs = [], [], [], [], []
    responses = iter_response_logits(args, batch, logits)
    for i, ((logits_RV, _), lp, ids) in enumerate(zip(responses, teacher_lp, teacher_ids, strict=True)):
        rows = logits_RV.size(0)
        if rows == 0:
            continue
        teacher_RK, ids_RK, valid_RK, vocab = teacher_topk_rows(i, logits_RV, lp, ids, tp_size)
        row_ok_R = teacher_rows_valid(teacher_RK)
        valid_RK = valid_RK & row_ok_R.unsqueeze(-1)
        safe_ids = ids_RK.clamp(0, vocab - 1)
        if subset == "overlap":
            valid_RK = valid_RK & in_student_topk(logits_RV, safe_ids, ids_RK.size(-1), tp_group)
        cur_RK = gather_log_probs(logits_RV, safe_ids, tp_group)
        loss_R, clipfrac_R = topk_select_surrogate(cur_RK, cur_RK.detach(), teacher_RK, valid_RK, eps_lo, eps_hi, clip)
        losses.append(loss_R)
        clipfracs.append(clipfrac_R.detach())
        sizes.append(valid_RK.sum(dim=-1).to(loss_R.dtype))
        invalid.append((~row_ok_R).to(loss_R.dtype))
        zero = torch.zeros((), dtype=loss_R.dtype, device=loss_R.device)
        n_R = valid_RK.sum(dim=-1).clamp(min=1).to(loss_R.dtype)
        diffs.append(torch.where(valid_RK, teacher_RK.to(loss_R.dtype) - cur_RK.detach(), zero).sum(-1) / n_R)

    dtype = logits.dtype if logits.dtype == torch.float64 else torch.float32
    opd_T, clipfrac_T, size_T, invalid_T, diff_T = (_cat_tokens(v, logits.device, dtype)
                                                    for v in (losses, clipfracs, sizes, invalid, diffs))
    opd_loss = sum_of_sample_mean(opd_T)
    loss = rl_loss + w_opd * opd_loss
    metrics.update({
        "loss": loss.detach().clone(),
        "opd_loss": opd_loss.detach().clone(),
        "opd_clipfrac": sum_of_sample_mean(clipfrac_T).detach(),
        "distill_subset_size": sum_of_sample_mean(size_T).detach(),
        "teacher_invalid_frac": sum_of_sample_mean(invalid_T).detach(),
        "teacher_student_logp_diff": sum_of_sample_mean(diff_T).detach(),
    })
    return loss, metrics
