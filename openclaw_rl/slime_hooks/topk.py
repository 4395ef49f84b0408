"""Carry the teacher's top-K through today's Slime, which forwards no ``teacher_topk_*`` field to the loss.

THUDM/slime moves exactly one teacher field from a ``Sample`` to the loss batch: ``teacher_log_probs``
(``_convert_samples_to_train_data`` → ``_split_train_data_by_dp`` → ``tensorize`` as float32 →
``_get_rollout_data``, which only checks ``len == response_length`` → ``get_batch``). A 2-D float32
tensor of R rows passes every one of those steps unchanged, so the rollout side packs, per response
token, ``[teacher log-prob, K top-K log-probs, K top-K ids]`` into a [R, 1 + 2K] tensor (ids are exact
in float32 below 2**24; Qwen3's vocabulary is 151,936).

On the actor, Slime calls ``--rollout-data-postprocess-path`` after the advantages and *before* it logs
the rollout data or trains, and its data iterator reads the dict lazily. :func:`unpack_teacher_topk`
(that hook) puts the plain [R] teacher log-probs back under ``teacher_log_probs`` (so Slime's rollout
metrics stay per-token) and hangs the top-K on each tensor as attributes, which the top-K loss reads
through :func:`teacher_topk_from_batch`. Nothing of Slime is forked or patched.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import torch

EXACT_FLOAT32_IDS = 2**24  # every integer below this is exact in float32
LOG_PROBS_ATTR = "openclaw_teacher_topk_log_probs"
INDICES_ATTR = "openclaw_teacher_topk_indices"


def pack_teacher_topk(token_R: torch.Tensor | None, log_probs_RK: torch.Tensor, indices_RK: torch.Tensor) -> torch.Tensor:
    """``[token, top-K log-probs, top-K ids]`` per row as float32 [R, 1 + 2K]; no token → the top-1 log-prob."""
    if log_probs_RK.shape != indices_RK.shape or log_probs_RK.dim() != 2:
        raise ValueError(f"top-K log-probs {tuple(log_probs_RK.shape)} and ids {tuple(indices_RK.shape)} must be [R, K]")
    if indices_RK.numel() and int(indices_RK.max()) >= EXACT_FLOAT32_IDS:
        raise ValueError(f"token id {int(indices_RK.max())} is not exact in float32; top-K transport needs ids < 2**24")
    rows = log_probs_RK.size(0)
    if token_R is None:
        token_R = log_probs_RK[:, 0] if log_probs_RK.size(1) else torch.zeros(rows)
    token_R = token_R.reshape(-1)
    if token_R.numel() != rows:
        raise ValueError(f"{token_R.numel()} teacher log-probs for {rows} top-K rows")
    return torch.cat([token_R.reshape(rows, 1).float(), log_probs_RK.float(), indices_RK.float()], dim=-1)


def _unpack(packed: torch.Tensor) -> torch.Tensor:
    width = packed.size(-1)
    if packed.dim() != 2 or width % 2 == 0:
        raise ValueError(f"packed teacher top-K must be [R, 1 + 2K], got {tuple(packed.shape)}")
    k = (width - 1) // 2
    token_R = packed[:, 0].contiguous()
    setattr(token_R, LOG_PROBS_ATTR, packed[:, 1 : 1 + k].contiguous())
    setattr(token_R, INDICES_ATTR, packed[:, 1 + k :].round().long())
    return token_R


def unpack_teacher_topk(args: Any, rollout_id: int | None = None,
                        rollout_data: MutableMapping[str, Any] | None = None) -> None:
    """Slime ``--rollout-data-postprocess-path`` hook: packed [R, 1 + 2K] → [R] plus top-K attributes.

    The Slime bundled in OpenClaw-RL calls this hook with ``args`` only; it forwards ``teacher_topk_*``
    to the loss itself, so nothing was packed (``samples.py``) and there is nothing to unpack.
    """
    if rollout_data is None:
        return
    per_sample = rollout_data.get("teacher_log_probs")
    if not per_sample:
        return
    rollout_data["teacher_log_probs"] = [_unpack(t) if t.dim() == 2 else t for t in per_sample]


def teacher_topk_from_batch(batch: Mapping[str, Any]) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    """``(log_probs [R, K], ids [R, K])`` per sample: Slime-native batch keys, else the unpacked attributes."""
    log_probs, ids = batch.get("teacher_topk_log_probs"), batch.get("teacher_topk_indices")
    if log_probs is not None and ids is not None:
        return list(log_probs), list(ids)
    carriers = batch.get("teacher_log_probs")
    if not carriers or not all(hasattr(t, LOG_PROBS_ATTR) for t in carriers):
        return None
    return [getattr(t, LOG_PROBS_ATTR) for t in carriers], [getattr(t, INDICES_ATTR) for t in carriers]
