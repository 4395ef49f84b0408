"""Mode ``opd`` training signals: the token-level OPD advantage and the top-K distillation loss.

Token level (default): ``A_t = teacher_t - old_t`` on every response token, then the ordinary PPO loss
(``openclaw_rl.losses.policy_loss``). Top-K (``--loss-type custom_loss``): reverse KL from the
student to the teacher over the teacher's top-K tokens plus one tail bin holding the remaining mass.

Deviations from upstream OpenClaw-RL (``topk_distillation_loss.py`` and Slime's OPD estimator):
1) One log-softmax per sample and K gathers from it (upstream: K cross-entropy calls, each on a clone
   of the response logits, bug 23); under TP one sharded pass.
2) Tail bin ``log1mexp(min(logsumexp(top-K), -eps))`` with eps the dtype's machine epsilon and the
   stable two-branch log1mexp (upstream: a fixed -1e-7 and a naive ``log(1 - exp(x))``).
3) A teacher entry of -inf (no teacher mass) or an out-of-range id is folded into the tail bin on both
   sides instead of producing inf/NaN. A token whose teacher row is not a distribution (NaN/+inf, or
   mass above 1 + 1e-3 such as the zero-padded rows of bug 7) contributes 0 KL and 0 entropy, and is
   counted in the extra metric ``teacher_invalid_frac``.
4) Runs without Megatron (the embedded trainer); upstream imported ``mpu`` unconditionally.
5) ``opd_token_advantages`` aligns the teacher to the student's last tokens like Slime's ``[-R:]``,
   but an empty response gives an empty advantage (Slime's ``teacher[-0:]`` keeps the whole tensor).

Which K tokens the top-K loss compares (``openclaw_opd_distill_subset``, upstream PR #99's
``--distill-subset-mode``; ``DISTILL_SUBSETS``): ``teacher`` (default, upstream 0d034dd's loss) compares
the teacher's top-K ids; ``overlap`` only those of them that are also in the student's own top-K (K the
same, ranked on the logits being trained, ties at the K-th value included); the other teacher entries
fold into the tail bin on both sides, and a token with no common id contributes 0 (upstream masks it).
Upstream's ``student`` (the student's top-K, the teacher gathered there) needs the teacher inside the trainer
(``openclaw_opd_teacher_source: trainer``, ``openclaw_rl/embedded/frozen_teacher.py``), which fills the rows
with the student's top-K ids and the teacher's log-probs at them, so this loss compares them as given; with a
teacher server (its own top-K only) it is refused at configuration, and on Slime at launch (the proxy does not
record the rollout's top-K ids the actor-side hook would read).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from openclaw_rl.config import DISTILL_SUBSETS
from openclaw_rl.losses.logprobs import (
    ENTROPY_CHUNK_ROWS,
    active_tp_group,
    gather_log_probs,
    iter_response_logits,
)
from openclaw_rl.slime_hooks.topk import teacher_topk_from_batch

TEACHER_MASS_TOLERANCE = 1e-3  # a teacher top-K summing above 1 + this is not a distribution
_LN2 = math.log(2.0)


# --- Token-level OPD advantages -------------------------------------------------------------------------


def opd_token_advantages(
    teacher_log_probs: Sequence[torch.Tensor], student_log_probs: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """``teacher - student`` per response token, the teacher cut to the student's last tokens.

    Identical to the ``on_policy_distillation`` advantage estimator of OpenClaw's bundled Slime
    (``teacher[-R:] - student``), which current THUDM/slime replaced by ``--use-opd``.
    """
    if len(teacher_log_probs) != len(student_log_probs):
        raise ValueError(f"{len(teacher_log_probs)} teacher rows for {len(student_log_probs)} samples")
    advantages = []
    for i, (teacher, student) in enumerate(zip(teacher_log_probs, student_log_probs, strict=True)):
        teacher, n = teacher.reshape(-1), student.numel()
        if teacher.numel() < n:
            raise ValueError(f"sample {i}: {teacher.numel()} teacher log-probs for {n} response tokens")
        aligned = teacher[teacher.numel() - n :].to(device=student.device, dtype=student.dtype)
        advantages.append(aligned - student.reshape(-1))
    return advantages


def on_policy_distillation_advantages(args: Any, rollout_data: MutableMapping[str, Any]) -> None:
    """Slime ``--custom-advantage-function-path`` hook: sets ``advantages`` = ``returns`` = teacher - old.

    ``old`` is ``rollout_log_probs`` with ``--use-rollout-logprobs``, else the recomputed ``log_probs``,
    exactly as the bundled ``--advantage-estimator on_policy_distillation``; when Slime skipped that
    recompute (current THUDM/slime does for one step per rollout), the rollout log-probs the samples
    carry (the policy's own, token-exact). Rewards are ignored. Slime
    still applies ``--normalize-advantages`` (and ``--use-opd``) after this hook returns.
    """
    from openclaw_rl.slime_hooks.trainer_teacher import fill_trainer_teacher

    fill_trainer_teacher(args, rollout_data)  # teacher_source trainer: the actor's frozen teacher (no-op otherwise)
    key = "rollout_log_probs" if getattr(args, "use_rollout_logprobs", False) else "log_probs"
    if key == "log_probs" and not rollout_data.get(key):
        # Slime (since bf9b1a3) skips the old-log-prob recompute for one step per rollout with the built-in
        # loss and no KL; the sampled tokens' rollout log-probs are then the exact student log-probs.
        key = "rollout_log_probs"
    student, teacher = rollout_data.get(key), rollout_data.get("teacher_log_probs")
    if not student:
        raise ValueError(f"on-policy distillation needs rollout_data[{key!r}] (the student log-probs)")
    if teacher is None:
        raise ValueError("on-policy distillation needs rollout_data['teacher_log_probs']")
    advantages = opd_token_advantages(teacher, student)
    rollout_data["advantages"] = advantages
    rollout_data["returns"] = advantages


# --- Top-K reverse KL -----------------------------------------------------------------------------------


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for x <= 0, accurate on both sides of -ln 2 (Maechler 2012).

    Near 0 ``log(-expm1(x))`` keeps the tiny difference; far below ``log1p(-exp(x))`` does. Both branches
    are finite for x in [-inf, -eps], so the unselected one never leaks NaN into the gradient.
    """
    return torch.where(x > -_LN2, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def _tail_log_mass(log_probs_RK: torch.Tensor, valid_RK: torch.Tensor) -> torch.Tensor:
    """log of the probability outside the valid top-K bins, clamped so the bins never claim all mass."""
    neg_inf = torch.full_like(log_probs_RK, -math.inf)
    head_R = torch.logsumexp(torch.where(valid_RK, log_probs_RK, neg_inf), dim=-1)
    return log1mexp(head_R.clamp(max=-torch.finfo(log_probs_RK.dtype).eps))


def topk_reverse_kl(
    student_RK: torch.Tensor, teacher_RK: torch.Tensor, valid_RK: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``sum_bins p_s (log p_s - log p_t)`` and the student's bin entropy over K + 1 bins.

    Bins are the valid top-K entries plus one tail bin; invalid entries drop out of the head on both
    sides, so their mass lands in the tail. Returns ``(kl_R, entropy_R)``.
    """
    bins_ok = torch.cat([valid_RK, valid_RK.new_ones((valid_RK.size(0), 1))], dim=-1)
    zero = torch.zeros((), dtype=student_RK.dtype, device=student_RK.device)
    teacher_RK = torch.where(valid_RK, teacher_RK.to(student_RK.dtype), zero)
    student_bins = torch.cat([student_RK, _tail_log_mass(student_RK, valid_RK).unsqueeze(-1)], dim=-1)
    teacher_bins = torch.cat([teacher_RK, _tail_log_mass(teacher_RK, valid_RK).unsqueeze(-1)], dim=-1)
    # Substitute 0 in dropped bins before any arithmetic, so no inf * 0 appears forward or backward.
    student_bins = torch.where(bins_ok, student_bins, zero)
    teacher_bins = torch.where(bins_ok, teacher_bins, zero)
    p_student = student_bins.exp()
    kl_R = torch.where(bins_ok, p_student * (student_bins - teacher_bins), zero).sum(dim=-1)
    entropy_R = -torch.where(bins_ok, p_student * student_bins, zero).sum(dim=-1)
    return kl_R, entropy_R


@torch.no_grad()
def in_student_topk(logits_RV: torch.Tensor, ids_RK: torch.Tensor, k: int,
                    tp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """[R, K] True where ``ids_RK`` is among the row's ``k`` largest logits (global ids; ties at the k-th
    value count as in). Logits, not log-probs: the ranking is the same at any temperature.

    Row by row, so ``ENTROPY_CHUNK_ROWS`` rows at a time: bf16 logits (the bundled Slime's) are compared in
    fp32, and that copy is then one [chunk, V] tensor, not [R, V] (a 4096 x 32K bf16 sample: 512 MiB more at
    the peak on CPU, 128 MiB in chunks; fp32 logits are not copied). Chunking changes no value: each row's
    k-th value and picked entries are the same whatever rows come with it. Under TP the collectives run
    once, on the [R, k] and [R, K] results."""
    rows, vocab_local = logits_RV.shape
    source = logits_RV.detach()
    width = min(k, vocab_local)
    top_Rk = torch.empty((rows, width), dtype=torch.float32, device=source.device)  # compared in fp32, as before
    offset = 0 if tp_group is None else dist.get_rank(tp_group) * vocab_local
    local_RK = ids_RK - offset
    picked_RK = torch.empty(ids_RK.shape, dtype=top_Rk.dtype, device=source.device)
    for start in range(0, rows, ENTROPY_CHUNK_ROWS):
        logits_CV = source[start : start + ENTROPY_CHUNK_ROWS].float()
        top_Rk[start : start + ENTROPY_CHUNK_ROWS] = logits_CV.topk(width, dim=-1).values
        picked_RK[start : start + ENTROPY_CHUNK_ROWS] = logits_CV.gather(
            -1, local_RK[start : start + ENTROPY_CHUNK_ROWS].clamp(0, vocab_local - 1))
        del logits_CV
    if tp_group is None:
        return picked_RK >= top_Rk[:, -1:]
    world = dist.get_world_size(tp_group)
    shards = [torch.empty_like(top_Rk) for _ in range(world)]
    dist.all_gather(shards, top_Rk, group=tp_group)
    kth_R = torch.cat(shards, dim=-1).topk(min(k, vocab_local * world), dim=-1).values[:, -1]
    in_shard_RK = (local_RK >= 0) & (local_RK < vocab_local)
    picked_RK = torch.where(in_shard_RK, picked_RK, torch.full_like(picked_RK, -math.inf))
    dist.all_reduce(picked_RK, op=dist.ReduceOp.MAX, group=tp_group)
    return picked_RK >= kth_R.unsqueeze(-1)


def distill_subset(args: Any) -> str:
    """The subset the top-K loss compares: ``args.openclaw_opd_distill_subset`` (the run config), else teacher."""
    subset = getattr(args, "openclaw_opd_distill_subset", None) or "teacher"
    if subset not in DISTILL_SUBSETS:
        raise ValueError(f"openclaw_opd_distill_subset: {subset!r} is not one of {', '.join(DISTILL_SUBSETS)}")
    return subset


def teacher_rows_valid(teacher_RK: torch.Tensor) -> torch.Tensor:
    """True where a teacher row can be a (truncated) distribution: no NaN/+inf, mass <= 1 + tolerance."""
    broken_R = (teacher_RK.isnan() | teacher_RK.isposinf()).any(dim=-1)
    safe_RK = torch.where(teacher_RK.isfinite(), teacher_RK, torch.full_like(teacher_RK, -math.inf))
    mass_ok_R = torch.logsumexp(safe_RK, dim=-1) <= math.log1p(TEACHER_MASS_TOLERANCE)
    return ~broken_R & mass_ok_R


def teacher_topk_rows(i: int, logits_RV: torch.Tensor, lp: torch.Tensor, ids: torch.Tensor, tp_size: int,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Sample ``i``'s teacher top-K rows on the logits' device, checked against its response rows:
    (log-probs [R, K], ids [R, K], usable entries [R, K]: finite and inside the whole vocabulary, the
    vocabulary's size over the TP shards). Shared by the top-K distillation loss and ``topk_select``."""
    rows = logits_RV.size(0)
    if lp.dim() != 2 or lp.size(0) != rows:
        raise ValueError(f"sample {i}: teacher top-K log-probs {tuple(lp.shape)} for {rows} response rows")
    teacher_RK = lp.to(device=logits_RV.device).reshape(rows, -1)
    ids_RK = ids.to(device=logits_RV.device, dtype=torch.long).reshape(rows, -1)
    if teacher_RK.shape != ids_RK.shape:
        raise ValueError(f"sample {i}: teacher log-probs {tuple(teacher_RK.shape)} vs ids {tuple(ids_RK.shape)}")
    vocab = logits_RV.size(-1) * tp_size
    return teacher_RK, ids_RK, teacher_RK.isfinite() & (ids_RK >= 0) & (ids_RK < vocab), vocab


def topk_distillation_loss_function(
    args: Any,
    batch: Mapping[str, Any],
    logits: torch.Tensor,
    sum_of_sample_mean: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Slime custom loss: top-K + tail reverse KL to the teacher, minus ``entropy_coef`` x bin entropy.

    Reads the teacher's top-K ([R, K] log-probs and ids per sample) through
    ``openclaw_rl.slime_hooks.topk.teacher_topk_from_batch`` (batch keys, or the transport that today's
    Slime needs); the student log-probs come from the temperature-scaled logits at the teacher's ids.
    """
    topk = teacher_topk_from_batch(batch)
    if topk is None:
        raise ValueError("top-K distillation needs the teacher's top-K: batch keys teacher_topk_log_probs / "
                         "teacher_topk_indices, or teacher_log_probs unpacked by --rollout-data-postprocess-path "
                         "openclaw_rl.slime_hooks.topk.unpack_teacher_topk (run the opd proxy with distill_topk > 0)")
    teacher_lp, teacher_ids = topk
    subset = distill_subset(args)
    entropy_coef = float(getattr(args, "entropy_coef", 0.0) or 0.0)
    tp_group = active_tp_group()
    tp_size = 1 if tp_group is None else dist.get_world_size(tp_group)

    kls, entropies, invalid, sizes = [], [], [], []
    responses = iter_response_logits(args, batch, logits)
    for i, ((logits_RV, _), lp, ids) in enumerate(zip(responses, teacher_lp, teacher_ids, strict=True)):
        rows = logits_RV.size(0)
        if rows == 0:
            continue
        teacher_RK, ids_RK, valid_RK, vocab = teacher_topk_rows(i, logits_RV, lp, ids, tp_size)
        if subset == "overlap":
            valid_RK = valid_RK & in_student_topk(logits_RV, ids_RK.clamp(0, vocab - 1), ids_RK.size(-1), tp_group)
        student_RK = gather_log_probs(logits_RV, ids_RK.clamp(0, vocab - 1), tp_group)
        kl_R, entropy_R = topk_reverse_kl(student_RK, teacher_RK, valid_RK)
        if entropy_coef == 0.0:
            entropy_R = entropy_R.detach()  # metric only; its graph is [R, K + 1], never [R, V]
        row_ok_R = teacher_rows_valid(teacher_RK)
        kls.append(torch.where(row_ok_R, kl_R, torch.zeros_like(kl_R)))
        entropies.append(torch.where(row_ok_R, entropy_R, torch.zeros_like(entropy_R)))
        invalid.append((~row_ok_R).to(kl_R.dtype))
        sizes.append(valid_RK.sum(dim=-1).to(kl_R.dtype))

    dtype = logits.dtype if logits.dtype == torch.float64 else torch.float32
    kl_T, entropy_T, invalid_T, size_T = (_cat_tokens(values, logits.device, dtype)
                                          for values in (kls, entropies, invalid, sizes))

    kl_loss = sum_of_sample_mean(kl_T)
    entropy_loss = sum_of_sample_mean(entropy_T)
    loss = kl_loss - entropy_coef * entropy_loss
    if not kls:
        loss = loss + 0 * logits.sum()  # keep every parameter in the graph for an all-empty micro-batch
    return loss, {
        "loss": loss.detach().clone(),
        "kl_loss": kl_loss.detach().clone(),
        "entropy_loss": entropy_loss.detach().clone(),
        "teacher_invalid_frac": sum_of_sample_mean(invalid_T).detach(),
        "distill_subset_size": sum_of_sample_mean(size_T).detach(),  # ids compared per token (K for teacher)
    }


def _cat_tokens(per_sample: list[torch.Tensor], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Concatenate per-token values; skipped empty samples own no tokens, so the order still matches."""
    if not per_sample:
        return torch.zeros((0,), device=device, dtype=dtype)
    return torch.cat(per_sample).to(dtype)
