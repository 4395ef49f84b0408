"""Per-token log-probabilities from Slime's packed logits, on one device and under Megatron TP.

Input: ``logits`` [1, T, V] packed over a micro-batch; sample i owns ``total_lengths[i]`` rows and the
rows that predict its R response tokens are [total - R - 1, total - 1) of its segment. Output: per
sample ``(logits_RV / rollout_temperature, tokens_R)``, and log-probs / entropies computed from them.

Why the vocab-parallel section exists: under Megatron tensor parallelism a rank holds only a vocab
shard [R, V/TP]; a plain log_softmax over one shard normalises over the wrong set and is silently
wrong. Everything that needs the full-vocabulary normaliser goes through the bottom section when a TP
group of size > 1 is active. That section is this project's own (all-reduces over the TP group), not
Slime's kernels: Slime removed ``compute_log_probs`` / ``compute_entropy_from_logits`` on 2026-06-29,
and a private kernel can go again. Context parallelism is delegated to Slime's public
``get_responses`` as a whole (the scripts run CP = 1).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from openclaw_rl.losses.policy_math import _accepts, at_least_fp32, entropy_from_log_probs


def _megatron_parallel_state() -> ModuleType | None:
    """Megatron's ``parallel_state`` if it is importable and initialised, else None (embedded path)."""
    try:
        from megatron.core import parallel_state
    except ImportError:
        return None
    return parallel_state if parallel_state.model_parallel_is_initialized() else None


def active_tp_group(tp_group: dist.ProcessGroup | None = None) -> dist.ProcessGroup | None:
    """The tensor-parallel group to normalise over, or None when the full vocabulary is local.

    An explicit ``tp_group`` wins; otherwise Megatron's TP group is used when Megatron is initialised.
    Groups of size 1 count as "no TP" so the cheap local path runs.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = tp_group
    if group is None:
        parallel_state = _megatron_parallel_state()
        if parallel_state is None:
            return None
        group = parallel_state.get_tensor_model_parallel_group()
    return group if dist.get_world_size(group) > 1 else None


def _context_parallel_size() -> int:
    parallel_state = _megatron_parallel_state()
    return 1 if parallel_state is None else int(parallel_state.get_context_parallel_world_size())


# --- Packed logits -> per-sample response logits ---------------------------------------------------------


def iter_response_logits(
    args: Any, batch: Mapping[str, Any], logits: torch.Tensor
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(logits_RV, tokens_R)`` per sample, logits divided by ``args.rollout_temperature``.

    Same slicing as Slime's ``get_responses`` for CP = 1 (``thd`` packing, or ``bshd`` padding to
    ``max_seq_lens``); under context parallelism Slime's own function is used. Unlike Slime, an R = 0
    sample yields empty tensors (Slime's ``tokens[-0:]`` returns the whole sequence), and a response
    with no prompt token before it is rejected instead of silently reading another sample's row.
    """
    unconcat_tokens = batch["unconcat_tokens"]
    total_lengths = batch["total_lengths"]
    response_lengths = batch["response_lengths"]
    max_seq_lens = batch.get("max_seq_lens")
    if _context_parallel_size() > 1:
        yield from _slime_context_parallel_responses(args, batch, logits)
        return

    temperature = float(getattr(args, "rollout_temperature", 1.0))
    if temperature <= 0:
        raise ValueError(f"rollout_temperature must be > 0, got {temperature}")
    bshd = getattr(args, "qkv_format", "thd") == "bshd"
    if logits.dim() != 3:
        raise ValueError(f"expected logits [1, T, V] (or [B, S, V] for bshd), got {tuple(logits.shape)}")
    if bshd:
        if max_seq_lens is None:
            raise ValueError("qkv_format 'bshd' needs batch['max_seq_lens']")
        flat_TV = logits.reshape(-1, logits.size(-1))
    else:
        if logits.size(0) != 1:
            raise ValueError(f"packed (thd) logits must have batch size 1, got {tuple(logits.shape)}")
        flat_TV = logits[0]

    segment_start = 0
    samples = zip(unconcat_tokens, total_lengths, response_lengths, strict=True)
    for i, (tokens, total_length, response_length) in enumerate(samples):
        total, resp = int(total_length), int(response_length)
        if tokens.numel() != total or not 0 <= resp <= total:
            raise ValueError(f"sample {i}: {tokens.numel()} tokens, total_length {total}, response {resp}")
        if resp > 0 and total - resp < 1:
            raise ValueError(f"sample {i}: a response with no prompt token before it cannot be scored")
        if bshd:
            segment_start = i * int(max_seq_lens[i])
        start = segment_start + total - resp - 1
        if start + resp > flat_TV.size(0):
            raise ValueError(f"sample {i}: rows [{start}, {start + resp}) exceed the {flat_TV.size(0)} logits")
        logits_RV = flat_TV[start : start + resp] if resp else flat_TV[:0]
        if temperature != 1.0:
            logits_RV = logits_RV / temperature
        yield logits_RV, tokens[total - resp :].to(device=logits.device)
        if not bshd:
            segment_start += total


def _slime_context_parallel_responses(
    args: Any, batch: Mapping[str, Any], logits: torch.Tensor
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Context parallelism splits each sequence in zigzag chunks; only Slime knows that layout."""
    from slime.backends.megatron_utils.loss import get_responses

    kwargs: dict[str, Any] = {
        "args": args,
        "unconcat_tokens": batch["unconcat_tokens"],
        "total_lengths": batch["total_lengths"],
        "response_lengths": batch["response_lengths"],
    }
    if _accepts(get_responses, "max_seq_lens"):  # OpenClaw's bundled Slime; upstream dropped it
        kwargs["max_seq_lens"] = batch.get("max_seq_lens")
    yield from get_responses(logits, **kwargs)


# --- Log-probs and entropy ------------------------------------------------------------------------------


def log_probs_and_entropy(
    logits_RV: torch.Tensor,
    tokens_R: torch.Tensor,
    *,
    entropy_grad: bool,
    tp_group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each response token and the policy entropy per position, in at least float32.

    The entropy carries a gradient only when ``entropy_grad`` (entropy_coef != 0); otherwise it is a
    detached metric, so no backward graph is kept for it.
    """
    group = active_tp_group(tp_group)
    if group is not None:
        return _vocab_parallel_log_probs_and_entropy(logits_RV, tokens_R, group, entropy_grad=entropy_grad)
    log_probs_RV = torch.log_softmax(at_least_fp32(logits_RV), dim=-1)
    log_probs_R = log_probs_RV.gather(-1, tokens_R.long().unsqueeze(-1)).squeeze(-1)
    if entropy_grad:
        return log_probs_R, entropy_from_log_probs(log_probs_RV)
    return log_probs_R, _detached_entropy(log_probs_RV)


ENTROPY_CHUNK_ROWS = 1024
"""Rows per chunk of the detached (metric-only) entropy.

Why: a response has up to ``--rollout-max-response-len`` (8192) rows over a ~150K vocabulary, and the
entropy's elementwise temporaries over all of them at once would be several [R, V] fp32 tensors (about
5 GB each at 8192 x 152K) beyond what the loss keeps for backward. In chunks of 1024 rows (the chunk the
launch scripts give Slime's own chunked log-prob/entropy pass: ``--log-probs-chunk-size 1024``,
``launch/slime_args.py``) the peak extra is two [1024, V] fp32 temporaries (about 1.2 GB at V = 152K, split
by TP), whatever R. ``openclaw_rl/launch/memory.py`` counts exactly that (``ENTROPY_CHUNK_BYTES``)."""


def _detached_entropy(log_probs_RV: torch.Tensor) -> torch.Tensor:
    """Entropy per row of a full-vocabulary log-softmax, no gradient, ``ENTROPY_CHUNK_ROWS`` rows at a time.

    Same arithmetic as :func:`entropy_from_log_probs` (a -inf entry adds 0, not NaN); per chunk it keeps
    two [chunk, V] temporaries (the clamped log-probs and their exponential, multiplied in place).
    """
    with torch.no_grad():
        source_RV = log_probs_RV.detach()
        entropy_R = source_RV.new_empty(source_RV.shape[:-1])
        lowest = torch.finfo(source_RV.dtype).min
        for start in range(0, source_RV.size(0), ENTROPY_CHUNK_ROWS):
            finite_CV = source_RV[start : start + ENTROPY_CHUNK_ROWS].clamp(min=lowest)
            weighted_CV = finite_CV.exp().mul_(finite_CV)
            entropy_R[start : start + ENTROPY_CHUNK_ROWS] = weighted_CV.sum(dim=-1).neg_()
            del finite_CV, weighted_CV
    return entropy_R


def token_log_probs(
    logits_RV: torch.Tensor, tokens_R: torch.Tensor, tp_group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """log softmax(logits)[token] per row (fp32 or wider), vocab-parallel aware."""
    group = active_tp_group(tp_group)
    if group is not None:
        return _vocab_parallel_gather_log_probs(logits_RV, tokens_R.long().unsqueeze(-1), group).squeeze(-1)
    log_probs_RV = torch.log_softmax(at_least_fp32(logits_RV), dim=-1)
    return log_probs_RV.gather(-1, tokens_R.long().unsqueeze(-1)).squeeze(-1)


def gather_log_probs(
    logits_RV: torch.Tensor, indices_RK: torch.Tensor, tp_group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """log softmax(logits) at K vocabulary ids per row -> [R, K], from ONE normalisation pass.

    Upstream's top-K loss made K separate cross-entropy calls, each on a clone of the full response
    logits (upstream bug 23: K x [R, V] kept for backward). Here one log-softmax [R, V] is computed and
    K columns are gathered from it; under TP one sharded pass does the same. ``indices_RK`` must lie in
    [0, V) (global ids under TP).
    """
    group = active_tp_group(tp_group)
    if group is not None:
        return _vocab_parallel_gather_log_probs(logits_RV, indices_RK.long(), group)
    return torch.log_softmax(at_least_fp32(logits_RV), dim=-1).gather(-1, indices_RK.long())


# --- Vocab-parallel (Megatron TP) -----------------------------------------------------------------------


class _ReduceFromTensorParallel(torch.autograd.Function):
    """All-reduce SUM forward, identity backward (Megatron's reduce-from-TP-region semantics).

    The loss downstream is computed identically on every TP rank, so the gradient each rank receives
    is already the full one; summing it again (torch.distributed.nn's all_reduce) would scale it by TP.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        reduced = x.clone()
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM, group=group)
        return reduced

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def _shifted_shard(logits_RV: torch.Tensor, group: dist.ProcessGroup) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits - global row max, log Z)`` of a vocab shard; log Z is the full-vocabulary normaliser.

    The max is taken without gradient (log-softmax does not depend on it); the sum of exponentials is
    reduced with :class:`_ReduceFromTensorParallel`, so gradients reach every shard exactly once.
    """
    logits = at_least_fp32(logits_RV)
    with torch.no_grad():
        max_R = logits.max(dim=-1).values if logits.size(0) else logits.new_zeros((0,))
        dist.all_reduce(max_R, op=dist.ReduceOp.MAX, group=group)
    shifted_RV = logits - max_R.unsqueeze(-1)
    log_norm_R = _ReduceFromTensorParallel.apply(shifted_RV.exp().sum(dim=-1), group).log()
    return shifted_RV, log_norm_R


def _vocab_parallel_gather_log_probs(
    logits_RV: torch.Tensor, indices_RK: torch.Tensor, group: dist.ProcessGroup
) -> torch.Tensor:
    """Log-probs at K global vocabulary ids per row, in one pass over the shard.

    Rank r owns ids [r * V_local, (r + 1) * V_local). One normaliser, K gathers, so the top-K loss
    keeps one [R, V_local] tensor for backward (the exponential of the shifted shard), not K copies; the
    sampled-token log-prob is K = 1. The K entries are picked by advanced indexing, whose backward keeps
    only the indices: ``torch.gather`` saves its whole input, which kept the shifted shard too (a second
    [R, V_local] fp32 tensor per sample until backward).
    """
    shifted_RV, log_norm_R = _shifted_shard(logits_RV, group)
    vocab_local = shifted_RV.size(-1)
    local_RK = indices_RK - dist.get_rank(group) * vocab_local
    in_shard_RK = (local_RK >= 0) & (local_RK < vocab_local)
    rows_R1 = torch.arange(shifted_RV.size(0), device=shifted_RV.device).unsqueeze(-1)
    picked_RK = shifted_RV[rows_R1, local_RK.clamp(0, vocab_local - 1)]
    picked_RK = _ReduceFromTensorParallel.apply(torch.where(in_shard_RK, picked_RK, 0.0), group)
    return picked_RK - log_norm_R.unsqueeze(-1)


def _vocab_parallel_log_probs_and_entropy(
    logits_RV: torch.Tensor, tokens_R: torch.Tensor, group: dist.ProcessGroup, *, entropy_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled-token log-probs and the full-vocabulary entropy from a vocab shard.

    ``H = log Z - sum_v exp(s_v) s_v / Z`` with ``s`` the max-shifted logits: both sums are all-reduced
    over the TP group. The entropy is detached unless ``entropy_grad``.
    """
    log_probs_R = _vocab_parallel_gather_log_probs(logits_RV, tokens_R.long().unsqueeze(-1), group).squeeze(-1)
    if not entropy_grad:
        return log_probs_R, _vocab_parallel_detached_entropy(logits_RV, group)
    shifted_RV, log_norm_R = _shifted_shard(logits_RV, group)
    finite_RV = shifted_RV.clamp(min=torch.finfo(shifted_RV.dtype).min)  # a -inf logit adds 0, not NaN
    weighted_R = _ReduceFromTensorParallel.apply((shifted_RV.exp() * finite_RV).sum(dim=-1), group)
    entropy_R = log_norm_R - weighted_R / log_norm_R.exp()
    return log_probs_R, entropy_R


def _vocab_parallel_detached_entropy(logits_RV: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The full-vocabulary entropy from a vocab shard, no gradient, ``ENTROPY_CHUNK_ROWS`` rows at a time.

    Two all-reduces for all R rows (not one per chunk): the local row maxima (MAX), then, from one pass
    over the shard's row chunks, the two local sums ``Z = sum_v exp(s_v)`` and
    ``W = sum_v exp(s_v) s_v`` of the shifted logits ``s``, stacked into one [2, R] SUM. ``H = log Z - W / Z``.
    Per chunk it keeps two [chunk, V_local] fp32 temporaries (the shifted logits and their exponential).
    """
    with torch.no_grad():
        source_RV = logits_RV.detach()
        rows = source_RV.size(0)
        dtype = torch.promote_types(source_RV.dtype, torch.float32)  # fp32, or fp64 for fp64 logits
        max_R = source_RV.amax(dim=-1).to(dtype)  # a reduction: no [R, V] temporary
        dist.all_reduce(max_R, op=dist.ReduceOp.MAX, group=group)
        sums_2R = source_RV.new_empty((2, rows), dtype=dtype)
        lowest = torch.finfo(dtype).min
        for start in range(0, rows, ENTROPY_CHUNK_ROWS):
            stop = start + ENTROPY_CHUNK_ROWS
            shifted_CV = source_RV[start:stop] - max_R[start:stop].unsqueeze(-1)  # promotes bf16 to fp32
            exp_CV = shifted_CV.exp()
            sums_2R[0, start:stop] = exp_CV.sum(dim=-1)
            sums_2R[1, start:stop] = exp_CV.mul_(shifted_CV.clamp_(min=lowest)).sum(dim=-1)  # -inf adds 0
            del shifted_CV, exp_CV
        dist.all_reduce(sums_2R, op=dist.ReduceOp.SUM, group=group)
        return sums_2R[0].log() - sums_2R[1] / sums_2R[0]
