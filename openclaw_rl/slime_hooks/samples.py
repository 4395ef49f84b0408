"""Our ``TrainingSample`` → Slime's ``Sample``, and Slime's rollout output types (or stand-ins).

With Slime importable the real ``slime.utils.types.Sample`` and ``RolloutFnTrainOutput`` are used;
without it, field-compatible dataclasses with the same names and defaults, so the embedded trainer
feeds the loss functions exactly what Slime's actor would. Teacher fields are not Sample fields in
Slime's stand-in: they ride as attributes (``teacher_log_probs`` float32 [R], ``teacher_topk_*`` [R, K]).
Current Slime has a ``teacher_log_probs`` field and forwards only that one, so with a top-K teacher it
carries the packed [R, 1 + 2K] rows of ``topk.py``; ``teacher_topk_*`` stay as attributes for a Slime
that forwards them itself (OpenClaw-RL's bundled one, upstream §2.5), and there ``teacher_log_probs``
stays the plain [R] (which of the two the installed Slime does is probed once, ``features.py``).
A sample with ``teacher_prompt_ids`` (teacher_source trainer) carries instead its hinted prompt packed as an
even-width [R, W] tensor, scored on the actor by ``trainer_teacher.py`` (with ``student_topk_indices``,
``distill_subset: student``, the student's ids packed beside it: the teacher is read there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from openclaw_rl.samples import TrainingSample

from .topk import pack_teacher_topk
from .trainer_teacher import pack_teacher_prompt

try:  # pragma: no cover - exercised only where Slime is installed
    from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
    from slime.utils.types import Sample

    SLIME_AVAILABLE = True
except ImportError:
    SLIME_AVAILABLE = False

    @dataclass
    class Sample:  # type: ignore[no-redef]
        """Field-compatible stand-in for ``slime.utils.types.Sample`` (same names, order and defaults)."""

        class Status(Enum):
            PENDING = "pending"
            COMPLETED = "completed"
            TRUNCATED = "truncated"
            ABORTED = "aborted"
            FAILED = "failed"

        group_index: int | None = None
        index: int | None = None
        prompt: str | list[dict[str, str]] = ""
        tokens: list[int] = field(default_factory=list)
        multimodal_inputs: Any = None
        multimodal_train_inputs: Any = None
        response: str = ""
        response_length: int = 0
        label: str | None = None
        reward: float | dict[str, Any] | None = None
        loss_mask: list[int] | None = None
        weight_versions: list[str] = field(default_factory=list)
        rollout_log_probs: list[float] | None = None
        rollout_routed_experts: Any = None
        remove_sample: bool = False
        teacher_log_probs: Any = None
        status: Sample.Status = None  # type: ignore[assignment]
        metadata: dict = field(default_factory=dict)
        generate_function_path: str | None = None
        train_metadata: dict | None = None
        non_generation_time: float = 0.0
        spec_info: Any = None
        prefix_cache_info: Any = None

        def __post_init__(self) -> None:
            if self.status is None:
                self.status = Sample.Status.PENDING

        def get_reward_value(self, args: Any) -> float:
            key = getattr(args, "reward_key", None)
            return self.reward[key] if key and isinstance(self.reward, dict) else self.reward  # type: ignore[return-value]

        @property
        def effective_response_length(self) -> int:
            return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    @dataclass
    class RolloutFnTrainOutput:  # type: ignore[no-redef]
        samples: list[list[Sample]]
        metrics: dict[str, Any] | None = None

    @dataclass
    class RolloutFnEvalOutput:  # type: ignore[no-redef]
        data: dict[str, dict[str, Any]]
        metrics: dict[str, Any] | None = None


def _slime_forwards_topk() -> bool:
    """Whether the installed Slime carries ``teacher_topk_*`` attributes to the loss itself (the bundled one)."""
    if not SLIME_AVAILABLE:
        return False  # the embedded trainer reads the packed rows like current Slime's actor
    from .features import forwarded_teacher_attributes

    return {"teacher_topk_log_probs", "teacher_topk_indices"} <= forwarded_teacher_attributes()


def to_slime_sample(ts: TrainingSample, teacher_topk: int = 0) -> Sample:
    """``teacher_topk``: the K the in-trainer teacher (``trainer_teacher.py``) computes for a sample that
    carries ``teacher_prompt_ids`` (its teacher_log_probs are then the packed prompt, scored on the actor)."""
    status = Sample.Status.TRUNCATED if ts.status == "truncated" else Sample.Status.COMPLETED
    sample = Sample(group_index=ts.index, index=ts.index, prompt="", tokens=ts.tokens, response=ts.response_text,
                    response_length=ts.response_length, reward={"score": ts.reward}, loss_mask=list(ts.loss_mask),
                    rollout_log_probs=list(ts.rollout_log_probs), status=status,
                    metadata={**ts.metadata, "session_id": ts.session_id, "turn": ts.turn, "kind": ts.kind,
                              "sample_id": ts.sample_id})
    if ts.metadata.get("weight_version"):
        sample.weight_versions = [str(ts.metadata["weight_version"])]
    teacher_R = None if ts.teacher_log_probs is None else torch.tensor(ts.teacher_log_probs, dtype=torch.float32)
    if ts.teacher_topk_log_probs is not None and ts.teacher_topk_indices is not None:
        rows = ts.response_length
        k = len(ts.teacher_topk_log_probs[0]) if rows else 0
        lp_RK = torch.tensor(ts.teacher_topk_log_probs, dtype=torch.float32).reshape(rows, k)
        ids_RK = torch.tensor(ts.teacher_topk_indices, dtype=torch.int64).reshape(rows, k)
        # Packed where today's Slime forwards only teacher_log_probs, and always beside the in-trainer teacher's
        # top-K (teacher_topk > 0): a batch then mixes packed prompts with these rows, and the bundled Slime
        # forwards teacher_topk_* only if the batch's first sample has them (for every sample, or fails).
        if teacher_topk > 0 or not _slime_forwards_topk():
            teacher_R = pack_teacher_topk(teacher_R, lp_RK, ids_RK)
        if teacher_topk == 0:
            sample.teacher_topk_log_probs, sample.teacher_topk_indices = lp_RK, ids_RK
    if ts.teacher_prompt_ids is not None:  # teacher_source trainer: the actor's frozen teacher scores it
        teacher_R = pack_teacher_prompt(list(ts.teacher_prompt_ids), ts.response_length, teacher_topk,
                                        ts.student_topk_indices if teacher_topk > 0 else None)
    if teacher_R is not None:
        sample.teacher_log_probs = teacher_R
    return sample


def to_slime_groups(samples: list[TrainingSample], teacher_topk: int = 0) -> list[list[Sample]]:
    """One singleton group per sample (a user's turn has no siblings), ordered by spool index."""
    return [[to_slime_sample(s, teacher_topk)] for s in sorted(samples, key=lambda s: s.index)]
