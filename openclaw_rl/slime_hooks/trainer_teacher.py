"""The teacher inside Slime's training actor: a frozen HF model that scores the hinted prompt + response.

Stage: rollout → **trainer** (Slime's actor, before the advantages / loss). ``openclaw_opd_teacher_source:
trainer`` (upstream PR #85, ``OPENCLAW_COMBINE_OPD_TEACHER_SOURCE=megatron``) on Slime, without forking it.

Transport. THUDM/slime forwards one per-sample teacher field from a ``Sample`` to the actor:
``teacher_log_probs`` (float32, per sample, only ``len == response_length`` is checked; ``topk.py`` already
sends [R, 1 + 2K] rows through it). A sample whose teacher is scored here carries instead a float32
[R, W] tensor with an EVEN width W (top-K rows are odd, plain log-probs 1-D), whose flattened rows hold
``[P, K, S, teacher_prompt_ids..., student ids (S = 1: R x K)..., 0 padding]`` (ids < 2**24 are exact in
float32; K: the top-K the loss reads, 0 for none; S = 1 with ``distill_subset: student``, the rollout
policy's own top-K ids per response position, ``TrainingSample.student_topk_indices``). The response ids are
the sample's own last R tokens on the actor.

Scoring. :func:`fill_trainer_teacher` (called by the opd advantage hook, by the
``--rollout-data-postprocess-path`` hook :func:`score_and_unpack`, and on a Slime without the advantage hook by
the postprocess hook :func:`score_opd_advantages`) replaces each such tensor by the
teacher's [R] log-probs of the response under ``teacher_prompt_ids + response`` (and, K > 0, hangs the
[R, K] top-K on it as ``topk.py`` does: the teacher's own top-K, or with S = 1 its log-probs at the student's
ids), with ``openclaw_rl.losses.teacher_scores`` (the embedded
trainer's maths). It is idempotent: once filled, nothing even-width is left.

The teacher: ``OPENCLAW_TEACHER_CHECKPOINT`` (an HF checkpoint whose tokenizer must map ids as the
policy's), else the policy's ``--hf-checkpoint`` (``HF_CKPT``): the initial policy. Loaded once per process
(``functools.lru_cache``: one frozen model per actor process is the point) on the actor's current device,
bf16 on CUDA, fp32 on CPU (``OPENCLAW_TEACHER_DTYPE`` overrides). Every training rank (TP, PP, CP and DP)
holds a whole copy and scores its own DP partition; TP and CP ranks repeat the same work (not sharded).
Context parallelism: Slime slices ``teacher_log_probs`` per CP rank before any hook (its
``slice_log_prob_with_cp``, rows of the response). With CP > 1 the CP ranks (which hold the same samples)
all-gather their slices of each packed prompt, each scores the whole sequence, then keeps the rows Slime's
own slice gives it (that function applied to the row numbers), so the teacher is split as the student's
log-probs are. A sliced packed prompt without a CP group is refused rather than misread.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import MutableMapping
from typing import Any

import torch

from .topk import EXACT_FLOAT32_IDS, INDICES_ATTR, LOG_PROBS_ATTR, unpack_teacher_topk

log = logging.getLogger(__name__)

CHECKPOINT_ENV = "OPENCLAW_TEACHER_CHECKPOINT"
DTYPE_ENV = "OPENCLAW_TEACHER_DTYPE"
_HEADER = 3  # P, K, S


def pack_teacher_prompt(prompt_ids: list[int], response_length: int, topk: int = 0,
                        student_ids: list[list[int]] | None = None) -> torch.Tensor:
    """``[P, K, S, ids..., student ids..., 0...]`` as float32 [R, W], W even and >= 2 (see the module docstring).
    ``student_ids``: [R, K] (K = ``topk``), the ids at which the teacher's top-K rows are read."""
    r = int(response_length)
    if r < 1:
        raise ValueError("a sample with no response token cannot carry a teacher prompt")
    if not prompt_ids:
        raise ValueError("an empty teacher prompt cannot predict the first response token")
    _check_ids(prompt_ids, "teacher prompt ids")
    flat_student: list[int] = []
    if student_ids is not None:
        if topk < 1 or len(student_ids) != r or any(len(row) != topk for row in student_ids):
            raise ValueError(f"student top-K ids must be [R={r}, K={topk}] with K > 0, got {len(student_ids)} rows "
                             f"of widths {sorted({len(row) for row in student_ids})}")
        flat_student = [i for row in student_ids for i in row]
        _check_ids(flat_student, "student top-K ids")
    values = [float(len(prompt_ids)), float(topk), float(student_ids is not None)] + [float(i) for i in prompt_ids]
    values += [float(i) for i in flat_student]
    width = max(2, math.ceil(len(values) / r))
    width += width % 2
    flat = torch.zeros(r * width, dtype=torch.float32)
    flat[: len(values)] = torch.tensor(values, dtype=torch.float32)
    return flat.reshape(r, width)


def _check_ids(ids: list[int], what: str) -> None:
    if max(ids) >= EXACT_FLOAT32_IDS or min(ids) < 0:
        raise ValueError(f"{what} must lie in [0, 2**24) to ride in float32, got {min(ids)}..{max(ids)}")


def is_packed_prompt(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() == 2 and t.size(-1) % 2 == 0


def unpack_teacher_prompt(packed: torch.Tensor) -> tuple[list[int], int]:
    """``(teacher_prompt_ids, K)`` of a :func:`pack_teacher_prompt` tensor."""
    prompt, k, _ = unpack_teacher_prompt_and_student_ids(packed)
    return prompt, k


def unpack_teacher_prompt_and_student_ids(packed: torch.Tensor) -> tuple[list[int], int, torch.Tensor | None]:
    """``(teacher_prompt_ids, K, student top-K ids [R, K] or None)`` of a :func:`pack_teacher_prompt` tensor."""
    if not is_packed_prompt(packed):
        raise ValueError(f"a packed teacher prompt is [R, even W], got {tuple(packed.shape)}")
    flat = packed.reshape(-1).double()
    if flat.numel() < _HEADER:
        raise ValueError(f"corrupt packed teacher prompt: {flat.numel()} values hold no header")
    p, k, s = (int(v) for v in flat[:_HEADER].round().tolist())
    r = packed.size(0)
    need = _HEADER + p + (r * k if s else 0)
    if p <= 0 or need > flat.numel() or k < 0 or s not in (0, 1) or (s and k < 1):
        raise ValueError(f"corrupt packed teacher prompt: P={p}, K={k}, S={s} in {flat.numel()} values")
    prompt = [int(v) for v in flat[_HEADER : _HEADER + p].round().long().tolist()]
    student = flat[_HEADER + p : need].round().long().reshape(r, k) if s else None
    return prompt, k, student


def teacher_checkpoint(args: Any) -> str:
    """The frozen teacher's HF checkpoint: ``OPENCLAW_TEACHER_CHECKPOINT``, else the policy's."""
    path = os.environ.get(CHECKPOINT_ENV, "").strip() or str(getattr(args, "hf_checkpoint", None) or "")
    path = path or os.environ.get("HF_CKPT", "").strip()
    if not path:
        raise ValueError(f"the in-trainer teacher needs {CHECKPOINT_ENV} or the policy's --hf-checkpoint")
    return path


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


@functools.lru_cache(maxsize=2)
def load_frozen_teacher(checkpoint: str, policy_checkpoint: str, device: str, dtype: str) -> torch.nn.Module:
    """The frozen teacher, loaded once per process and device; its tokenizer checked against the policy's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if policy_checkpoint and os.path.realpath(checkpoint) != os.path.realpath(policy_checkpoint):
        from openclaw_opd.teacher_server import tokenizer_mismatch

        problem = tokenizer_mismatch(AutoTokenizer.from_pretrained(policy_checkpoint),
                                     AutoTokenizer.from_pretrained(checkpoint))
        if problem:
            raise ValueError(f"{CHECKPOINT_ENV}={checkpoint} does not share the policy's tokenizer: {problem}. The "
                             "in-trainer teacher scores the policy's sampled token ids, so both must use one tokenizer")
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=getattr(torch, dtype)).to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    log.info("in-trainer teacher: %s on %s (%s)", checkpoint, device, dtype)
    return model


def actor_teacher(args: Any) -> torch.nn.Module:
    device = _device()
    dtype = os.environ.get(DTYPE_ENV, "").strip() or ("bfloat16" if device.type == "cuda" else "float32")
    policy = str(getattr(args, "hf_checkpoint", None) or os.environ.get("HF_CKPT", "") or "")
    return load_frozen_teacher(teacher_checkpoint(args), policy, str(device), dtype)


def fill_trainer_teacher(args: Any, rollout_data: MutableMapping[str, Any],
                         model: torch.nn.Module | None = None) -> int:
    """Score every packed teacher prompt of ``rollout_data`` (see the module docstring); returns how many.
    ``model``: the teacher to use (tests), else :func:`actor_teacher`."""
    from openclaw_rl.losses.teacher_scores import score_teacher_tokens

    per_sample = rollout_data.get("teacher_log_probs")
    wanted = [i for i, t in enumerate(per_sample or []) if is_packed_prompt(t)]
    if not wanted:
        return 0
    cp_group = _context_parallel_group()
    own_rows = _cp_rows(rollout_data, wanted, cp_group) if cp_group is not None else None
    teacher = model if model is not None else actor_teacher(args)
    device = next(teacher.parameters()).device
    tokens, lengths, ks = [], [], set()
    students: list[torch.Tensor | None] = []
    for n, i in enumerate(wanted):
        r = int(rollout_data["response_lengths"][i])
        packed = per_sample[i] if own_rows is None else _cp_whole_rows(per_sample[i], own_rows[n], r, cp_group)
        if packed.size(0) != r:
            raise ValueError(f"sample {i}: a packed teacher prompt of {packed.size(0)} rows for {r} response "
                             "tokens (context parallelism sliced it and no context-parallel group is initialised)")
        prompt, k, student = unpack_teacher_prompt_and_student_ids(packed)
        students.append(student)
        sample_tokens = torch.as_tensor(rollout_data["tokens"][i]).long().reshape(-1)
        tokens.append(torch.cat([torch.tensor(prompt, dtype=torch.long), sample_tokens[sample_tokens.numel() - r:].cpu()])
                      .to(device))
        lengths.append(r)
        ks.add(k)
    if len(ks) != 1:
        raise ValueError(f"packed teacher prompts ask for different top-K sizes {sorted(ks)}")
    topk = ks.pop()
    at_ids = _student_ids(args, students, topk)
    lps, top_lp, top_ids = score_teacher_tokens(teacher, tokens, lengths,
                                                float(getattr(args, "rollout_temperature", 1.0) or 1.0), topk,
                                                at_ids=at_ids)
    for n, i in enumerate(wanted):
        home = per_sample[i].device
        rows = slice(None) if own_rows is None else own_rows[n].to(lps[n].device)  # this CP rank's rows only
        lp = lps[n][rows].to(home)
        if top_lp is not None and top_ids is not None:
            setattr(lp, LOG_PROBS_ATTR, top_lp[n][rows].to(home))
            setattr(lp, INDICES_ATTR, top_ids[n][rows].to(home))
        per_sample[i] = lp
    return len(wanted)


def _student_ids(args: Any, students: list[torch.Tensor | None], topk: int) -> list[torch.Tensor] | None:
    """The [R, K] ids at which each sample's teacher top-K rows are read (``distill_subset: student``), or None
    (the teacher's own top-K). All packed prompts of a batch carry them or none does; with the run's subset
    ``student`` (``args.openclaw_opd_distill_subset``) a prompt without them is refused rather than read at the
    teacher's own top-K."""
    have = [s is not None for s in students]
    if any(have) and not all(have):
        raise ValueError(f"{sum(have)} of {len(have)} packed teacher prompts carry the student's top-K ids: a batch "
                         "reads the teacher at the student's ids for every sample or for none")
    if not any(have):
        if getattr(args, "openclaw_opd_distill_subset", None) == "student" and topk > 0:
            raise ValueError("openclaw_opd_distill_subset student: the packed teacher prompts carry no student top-K "
                             "ids (TrainingSample.student_topk_indices, the rollout's own top-K)")
        return None
    return [s for s in students if s is not None]


def _context_parallel_group() -> Any:
    """Megatron's context-parallel group when it has more than one rank, else None (no Megatron: None)."""
    try:
        from megatron.core import parallel_state as mpu
    except ImportError:
        return None
    if not mpu.model_parallel_is_initialized() or mpu.get_context_parallel_world_size() == 1:
        return None
    return mpu.get_context_parallel_group()


def _cp_rows(rollout_data: MutableMapping[str, Any], wanted: list[int], group: Any) -> list[torch.Tensor]:
    """Per wanted sample, which of its R response rows this CP rank holds: Slime's own ``slice_log_prob_with_cp``
    (the slice it applied to ``teacher_log_probs``) applied to the row numbers 0..R-1."""
    from slime.backends.megatron_utils.cp_utils import slice_log_prob_with_cp

    out = []
    for i in wanted:
        r, total = int(rollout_data["response_lengths"][i]), int(rollout_data["total_lengths"][i])
        out.append(slice_log_prob_with_cp(torch.arange(r, dtype=torch.float64), total, r).round().long())
    return out


def _cp_whole_rows(local: torch.Tensor, rows: torch.Tensor, r: int, group: Any) -> torch.Tensor:
    """The whole [R, W] packed prompt from every CP rank's slice (each rank holds the same samples)."""
    import torch.distributed as dist

    if local.size(0) != rows.numel():
        raise ValueError(f"a CP slice of {local.size(0)} packed rows where Slime's slice holds {rows.numel()}")
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (rows.cpu(), local.detach().cpu()), group=group)
    whole = torch.full((r, local.size(1)), float("nan"), dtype=torch.float32)
    for their_rows, their_local in gathered:
        whole[their_rows] = their_local.float()
    if torch.isnan(whole).any():
        raise ValueError("the context-parallel ranks' slices do not cover the packed teacher prompt")
    return whole


def _hook_data(rollout_id: Any, rollout_data: MutableMapping[str, Any] | None) -> MutableMapping[str, Any]:
    """The rollout data of a postprocess call: THUDM/slime calls ``fn(args, rollout_id, rollout_data)``; the Slime
    bundled in OpenClaw-RL since PR #85 (f48ac35) calls ``fn(args, rollout_data)`` for a hook of >= 2 parameters
    (so the data lands in ``rollout_id``); 0d034dd's calls ``fn(args)`` and gives the hook nothing to score."""
    if rollout_data is None and isinstance(rollout_id, MutableMapping):
        return rollout_id
    if rollout_data is None:
        raise ValueError("the in-trainer teacher needs a Slime that passes rollout_data to "
                         "--rollout-data-postprocess-path (THUDM/slime, or the Slime bundled in OpenClaw-RL since "
                         "f48ac35; the bundled Slime of 0d034dd passes args only)")
    return rollout_data


def score_and_unpack(args: Any, rollout_id: Any = None, rollout_data: MutableMapping[str, Any] | None = None) -> None:
    """Slime ``--rollout-data-postprocess-path`` hook: the in-trainer teacher, then ``topk.py``'s unpacking.
    Runs after Slime's advantages and before it logs the rollout data or trains."""
    data = _hook_data(rollout_id, rollout_data)
    fill_trainer_teacher(args, data)
    unpack_teacher_topk(args, None, data)


def score_opd_advantages(args: Any, rollout_id: Any = None,
                         rollout_data: MutableMapping[str, Any] | None = None) -> None:
    """Slime ``--rollout-data-postprocess-path`` hook for token-level OPD on a Slime without
    ``--custom-advantage-function-path`` (the bundled one): the launch runs Slime's ``grpo`` estimator (rewards
    unused) and this hook, after it, scores the teacher and replaces ``advantages`` = ``returns`` with
    teacher - old, what Slime's ``on_policy_distillation`` estimator computes (which would read the packed
    prompt as log-probs, before any hook). No ``--normalize-advantages`` applies after it (the launch sets none)."""
    from openclaw_opd.loss import on_policy_distillation_advantages

    on_policy_distillation_advantages(args, _hook_data(rollout_id, rollout_data))
