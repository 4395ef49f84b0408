"""The teacher inside the trainer: a frozen model that scores the hinted prompt + the sampled response at train time.

Stage: rollout → **trainer** (before the loss). ``openclaw_opd_teacher_source: trainer`` (upstream PR #85,
``OPENCLAW_COMBINE_OPD_TEACHER_SOURCE=megatron``). Why: a teacher served by SGLang computes its log-probs
with other kernels (and dtype) than the trainer's student forward, so even a teacher identical to the student
gives a non-zero ``teacher − old`` advantage; here the teacher runs the very code path of the student's
forward (``trainer.response_logits`` + ``iter_response_logits``, the student's temperature), so that mismatch
is exactly 0 (docs/learning.md has the measurement).

What runs where: the proxy's scorer stores the hinted teacher prompt's exact ids in the sample
(``TrainingSample.teacher_prompt_ids``; the response is the sample's own ``response_ids``); this module, in
the trainer process, holds a frozen copy of the initial policy weights (or ``openclaw_opd_teacher_checkpoint``,
whose tokenizer must map every id as the policy's: refused otherwise) and, per training batch, fills the
batch's ``teacher_log_probs`` (and ``teacher_topk_log_probs`` / ``teacher_topk_indices`` when the loss trains
on the top-K) for those samples. Samples that carry their own teacher log-probs (server source, or combine's
RL-only samples whose "teacher" is their rollout) keep them. The loss code sees the same batch keys either
way: it never forks per source.

Upstream differences: upstream's Megatron teacher (or its HF fallback ``prm_teacher_postprocess.py``) is a
separate model on its own GPU; here it is a copy in the trainer's process and device. Upstream's RL-only
combine samples are scored by the teacher on the plain prompt; here they keep "teacher = rollout" (zero OPD
advantage), as with the server source.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import torch

from openclaw_rl.samples import TrainingSample

log = logging.getLogger(__name__)


def trainer_teacher_source(settings: Any) -> str:
    """The trainer's ``teacher_source``: the setting for a mode whose teacher can run in the trainer, else server."""
    from openclaw_rl.config import TRAINER_TEACHER_MODES

    return settings.opd.teacher_source if settings.mode in TRAINER_TEACHER_MODES else "server"


def trainer_topk(settings: Any, distill_topk: int) -> int:
    """The K of the top-K rows the trainer's teacher fills: OEL's ``oel.topk`` (its loss is always top-K), else
    ``distill_topk``."""
    return int(settings.oel.topk) if settings.mode == "oel" else distill_topk


class TeacherTokenizerMismatch(ValueError):
    """The teacher checkpoint's tokenizer does not map ids as the policy's (token-level OPD would be wrong)."""


def load_teacher_model(checkpoint: str, policy: torch.nn.Module, policy_tokenizer: Any) -> torch.nn.Module:
    """A checkpoint as the teacher, after checking its tokenizer against the policy's; raises
    ``TeacherTokenizerMismatch`` (a ValueError) with the first difference."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from openclaw_opd.teacher_server import tokenizer_mismatch

    path = Path(checkpoint)
    if not path.is_dir():
        raise ValueError(f"openclaw_opd_teacher_checkpoint: {checkpoint!r} is not a checkpoint directory")
    if policy_tokenizer is None:
        raise ValueError("openclaw_opd_teacher_checkpoint: the trainer has no policy tokenizer to compare the "
                         "teacher's with")
    try:
        teacher_tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise TeacherTokenizerMismatch(f"openclaw_opd_teacher_checkpoint {checkpoint}: no tokenizer to compare with "
                                       f"the policy's ({exc})") from exc
    problem = tokenizer_mismatch(policy_tokenizer, teacher_tokenizer)
    if problem:
        raise TeacherTokenizerMismatch(
            f"the teacher checkpoint {checkpoint} does not share the policy's tokenizer: {problem}. The in-trainer "
            "teacher scores the policy's sampled token ids, so both must use the same tokenizer")
    ref = next(policy.parameters())
    model = AutoModelForCausalLM.from_pretrained(path, dtype=ref.dtype).to(ref.device)
    return model


class FrozenTeacher:
    """A frozen model, and the batch fields it fills (see the module docstring)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        from .tail_forward import tail_forward_usable
        from .trainer import has_active_dropout

        self.tail = not has_active_dropout(self.model) and tail_forward_usable(self.model)

    @classmethod
    def build(cls, policy: torch.nn.Module, checkpoint: str = "", tokenizer: Any = None,
              initial_copy: torch.nn.Module | None = None) -> FrozenTeacher:
        """The initial policy weights (``initial_copy`` if the trainer already holds one, else a copy of
        ``policy`` as it is now), or ``checkpoint`` (its tokenizer checked against ``tokenizer``)."""
        if checkpoint:
            return cls(load_teacher_model(checkpoint, policy, tokenizer))
        return cls(initial_copy if initial_copy is not None else copy.deepcopy(policy))

    def score(self, args: Any, teacher_tokens: list[torch.Tensor], response_lengths: list[int], topk: int = 0,
              at_ids: list[torch.Tensor] | None = None,
              ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None, list[torch.Tensor] | None]:
        """Per sample, the teacher's log-probs of its last R tokens (logits / ``args.rollout_temperature``, as
        the student's) and, with ``topk`` > 0, the top-K log-probs [R, K] and ids [R, K] of those rows
        (``openclaw_rl.losses.teacher_scores``, shared with Slime's actor-side teacher)."""
        from openclaw_rl.losses.teacher_scores import score_teacher_tokens

        return score_teacher_tokens(self.model, teacher_tokens, response_lengths,
                                    float(getattr(args, "rollout_temperature", 1.0)), topk, self.tail, at_ids)


def student_topk_ids(student: torch.nn.Module, samples: list[TrainingSample], args: Any, topk: int,
                     device: torch.device, tail: bool) -> list[torch.Tensor]:
    """``distill_subset: student`` (upstream's default ``S_t = S^q_t``): per sample, the [R, K] ids of the
    student's own top-K at each response position, from a no-grad eval-mode forward of its sampled prompt +
    response with the policy as it is before this step (the old policy of a one-step-per-batch trainer)."""
    from openclaw_rl.losses.teacher_scores import score_teacher_tokens

    was_training = student.training
    student.eval()
    try:
        tokens = [torch.tensor([*s.prompt_ids, *s.response_ids], dtype=torch.long, device=device) for s in samples]
        _, _, ids = score_teacher_tokens(student, tokens, [s.response_length for s in samples],
                                         float(getattr(args, "rollout_temperature", 1.0)), topk, tail)
    finally:
        student.train(was_training)
    assert ids is not None
    return ids


def fill_teacher_fields(batch: dict[str, Any], samples: list[TrainingSample], teacher: FrozenTeacher | None,
                        args: Any, topk: int, student: torch.nn.Module | None = None,
                        student_tail: bool = False) -> dict[str, float]:
    """Set the batch's teacher keys for samples that carry ``teacher_prompt_ids`` (scored now by ``teacher``),
    keeping every other sample's own; returns metrics. A no-op when no sample carries prompt ids. With
    ``student`` (``distill_subset: student``) the top-K rows are the teacher's log-probs at the student's
    top-K ids (``student_topk_ids``) instead of the teacher's own top-K."""
    wanted = [i for i, s in enumerate(samples) if s.teacher_prompt_ids is not None]
    if not wanted:
        return {}
    if teacher is None:
        raise ValueError("samples carry teacher prompt ids (openclaw_opd_teacher_source: trainer) but this trainer "
                         "holds no teacher: start it with teacher_source trainer")
    device = batch["unconcat_tokens"][0].device
    tokens = [torch.tensor(samples[i].teacher_prompt_ids + samples[i].response_ids, dtype=torch.long, device=device)
              for i in wanted]
    at_ids = (student_topk_ids(student, [samples[i] for i in wanted], args, topk, device, student_tail)
              if student is not None and topk > 0 else None)
    lps, top_lp, top_ids = teacher.score(args, tokens, [samples[i].response_length for i in wanted], topk, at_ids)
    n = len(samples)
    own_lp = batch.get("teacher_log_probs") or [None] * n
    merged: list[Any] = [own_lp[i] if i < len(own_lp) else None for i in range(n)]
    if "teacher_log_probs" not in batch:  # build_batch sets the key only when every sample carries log-probs
        merged = [torch.tensor(s.teacher_log_probs, dtype=torch.float32, device=device)
                  if s.teacher_log_probs is not None else None for s in samples]
    for k, i in enumerate(wanted):
        merged[i] = lps[k].to(device)
    missing = [i for i, v in enumerate(merged) if v is None]
    if missing:
        raise ValueError(f"samples {missing} carry no teacher signal (neither log-probs nor prompt ids)")
    batch["teacher_log_probs"] = merged
    if top_lp is not None and top_ids is not None:
        rows_lp: list[Any] = [None] * n
        rows_id: list[Any] = [None] * n
        for i, s in enumerate(samples):
            if s.teacher_topk_log_probs is not None and s.teacher_topk_indices is not None:
                rows_lp[i] = torch.tensor(s.teacher_topk_log_probs, dtype=torch.float32, device=device).reshape(
                    s.response_length, -1)
                rows_id[i] = torch.tensor(s.teacher_topk_indices, dtype=torch.long, device=device).reshape(
                    s.response_length, -1)
        for k, i in enumerate(wanted):
            rows_lp[i], rows_id[i] = top_lp[k], top_ids[k]
        if all(v is not None for v in rows_lp):
            batch["teacher_topk_log_probs"], batch["teacher_topk_indices"] = rows_lp, rows_id
    return {"train/trainer_teacher_samples": float(len(wanted))}
