"""A frozen teacher's scores of a sampled response: the maths shared by both in-trainer teachers.

Stage: **trainer** (before the loss). ``openclaw_opd_teacher_source: trainer`` has two hosts: the embedded
trainer (``openclaw_rl.embedded.frozen_teacher``) and Slime's training actor
(``openclaw_rl.slime_hooks.trainer_teacher``). Both score ``teacher_prompt_ids + response_ids`` with a whole
HF model on one device and must give the same numbers, so the forward and the row maths live here once.

Row j of the R + 1 kept logits predicts response token j (position len(teacher_prompt_ids) - 1 + j); the
log-probs are ``log_softmax(logits / rollout_temperature)`` over the FULL vocabulary (the teacher is never
a tensor-parallel shard, so no vocab-parallel normaliser applies, even inside a Megatron TP group). The ops
are those of ``losses.logprobs`` on one device (divide, ``log_softmax`` in fp32, gather), so a teacher equal
to the student reproduces the student's log-probs bit for bit in the embedded trainer.
"""

from __future__ import annotations

import torch

from openclaw_rl.losses.policy_math import at_least_fp32

TeacherScores = tuple[list[torch.Tensor], list[torch.Tensor] | None, list[torch.Tensor] | None]


def response_row_scores(logits_RV: torch.Tensor, tokens_R: torch.Tensor, temperature: float, topk: int = 0,
                        at_ids_RK: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(log-probs [R], top-K log-probs [R, K] | None, top-K ids [R, K] | None)`` of full-vocabulary rows;
    with ``at_ids_RK`` the rows' log-probs at those ids (the student's top-K, ``distill_subset: student``)."""
    if temperature <= 0:
        raise ValueError(f"rollout_temperature must be > 0, got {temperature}")
    if temperature != 1.0:
        logits_RV = logits_RV / temperature
    log_probs_RV = torch.log_softmax(at_least_fp32(logits_RV), dim=-1)
    token_R = log_probs_RV.gather(-1, tokens_R.long().unsqueeze(-1)).squeeze(-1).float()
    if at_ids_RK is not None:
        ids_RK = at_ids_RK.to(log_probs_RV.device).long()
        return token_R, log_probs_RV.gather(-1, ids_RK).float(), ids_RK
    if topk <= 0:
        return token_R, None, None
    values, ids = log_probs_RV.float().topk(min(topk, log_probs_RV.size(-1)), dim=-1)
    return token_R, values, ids


@torch.no_grad()
def score_teacher_tokens(model: torch.nn.Module, teacher_tokens: list[torch.Tensor], response_lengths: list[int],
                         temperature: float, topk: int = 0, tail: bool = False,
                         at_ids: list[torch.Tensor] | None = None) -> TeacherScores:
    """Per sample, the teacher's scores of the last R tokens of ``teacher_tokens`` (hinted prompt + response);
    one unpadded forward per sample, the head on the R + 1 kept rows only. ``tail``: the model passed
    ``tail_forward_usable`` (its last layer runs on those rows only too). ``at_ids``: per sample [R, K] ids
    at which the rows are read instead of their own top-K."""
    from openclaw_rl.embedded.tail_forward import response_rows_logits

    lps: list[torch.Tensor] = []
    top_lp: list[torch.Tensor] = []
    top_ids: list[torch.Tensor] = []
    for i, (tokens, r) in enumerate(zip(teacher_tokens, response_lengths, strict=True)):
        r = int(r)
        if not 0 <= r < tokens.numel():
            raise ValueError(f"sample {i}: {tokens.numel()} teacher tokens cannot hold a prompt and {r} response tokens")
        logits_RV = response_rows_logits(model, tokens, r + 1, tail).float()[:r]  # row j predicts token T - r + j
        lp, values, ids = response_row_scores(logits_RV, tokens[tokens.numel() - r:], temperature, topk,
                                              None if at_ids is None else at_ids[i])
        lps.append(lp)
        if values is not None and ids is not None:
            top_lp.append(values)
            top_ids.append(ids)
    scored = topk > 0 or at_ids is not None
    return lps, (top_lp if scored else None), (top_ids if scored else None)
