"""The driver's reports on the teacher log-probs the loss read (``slime_cpu_driver.main``, after training).

Stage: Slime's trainer → **teacher checks** → the result JSON ``test_slime_cpu.py`` asserts on. Kept apart
from the driver because each recomputes, independently of Slime, what the loss should have read: the
teacher table's own scores under ``--use-opd --opd-type megatron``, and a plain full forward of the frozen
HF teacher on the packed (hinted) prompt for ``teacher_source trainer``.
"""

from __future__ import annotations

import torch


def megatron_teacher_report(rollout_data: dict, sample_teacher: list, teacher_table: torch.Tensor) -> dict:
    """What the loss got as teacher log-probs under --use-opd --opd-type megatron, against (a) the teacher table
    scoring each Sample's own tokens and (b) the hinted teacher log-probs the Sample carried."""
    def max_diff(a: list, b: list) -> float:
        return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))

    own = []
    for tokens, r in zip(rollout_data["tokens"], rollout_data["response_lengths"], strict=True):
        tokens = torch.as_tensor(tokens)
        logp = torch.log_softmax(teacher_table[tokens[:-1]].float(), dim=-1)[-r:]
        own.append(logp.gather(-1, tokens[-r:].unsqueeze(-1)).squeeze(-1))
    slime = rollout_data["teacher_log_probs"]
    return {"vs_own_tokens": max_diff(slime, own), "vs_sample": max_diff(slime, sample_teacher),
            "sample_vs_own_tokens": max_diff(sample_teacher, own), "n": len(slime)}


@torch.no_grad()
def trainer_teacher_report(args, rollout_data: dict, sample_teacher: list, loss_teacher: dict) -> dict:
    """teacher_source trainer: the teacher log-probs the loss read against a plain full forward of the frozen
    HF teacher (the policy's checkpoint) on the packed prompt (prompt + hint) + the sampled response."""
    from transformers import AutoModelForCausalLM

    from openclaw_rl.slime_hooks.trainer_teacher import (
        is_packed_prompt,
        unpack_teacher_prompt_and_student_ids,
    )

    model = AutoModelForCausalLM.from_pretrained(args.hf_checkpoint, dtype=torch.float32).eval()
    temperature = float(args.rollout_temperature)
    diffs, top_diffs, ids_equal, hinted, own, at_student, not_own_topk = [], [], True, 0, 0, 0, 0
    for tokens, r, carried in zip(rollout_data["tokens"], rollout_data["response_lengths"], sample_teacher, strict=True):
        tokens = [int(t) for t in torch.as_tensor(tokens).tolist()]
        if not is_packed_prompt(carried):
            own += 1
            continue
        prompt, k, student = unpack_teacher_prompt_and_student_ids(carried)
        hinted += prompt != tokens[: len(tokens) - r]  # the hinted prompt, not the sample's own
        ids = torch.tensor([prompt + tokens[len(tokens) - r:]])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + r].float()
                                 / temperature, dim=-1)
        want = logp.gather(-1, ids[0, len(prompt):].unsqueeze(-1)).squeeze(-1)
        got, top_lp, top_ids = loss_teacher[tuple(tokens)]
        values, ids = logp.topk(max(k, 1), dim=-1)
        if student is not None:  # distill_subset student: the teacher read at the student's ids, not its own top-K
            at_student += 1
            not_own_topk += int(not torch.equal(student, ids))
            values, ids = logp.gather(-1, student), student
        if got.numel() != r:  # context parallelism: this rank's rows, by Slime's own slice of the student's
            from slime.backends.megatron_utils.cp_utils import slice_log_prob_with_cp

            want, values, ids = (slice_log_prob_with_cp(x, len(tokens), r) for x in (want, values, ids))
        diffs.append(float((got.float() - want).abs().max()))
        if k:
            top_diffs.append(float((top_lp.float() - values).abs().max()))
            ids_equal = ids_equal and bool(torch.equal(top_ids.long(), ids))
    return {"n_scored": len(diffs), "n_hinted_prompt": hinted, "n_own_teacher": own,
            "max_abs_diff": max(diffs) if diffs else None,
            "topk_max_abs_diff": max(top_diffs) if top_diffs else None, "topk_ids_equal": ids_equal,
            "n_at_student_ids": at_student, "n_student_ids_not_teacher_topk": not_own_topk}
