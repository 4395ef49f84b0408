"""Token-level OPD advantages: teacher - old, aligned like the bundled Slime estimator, as an advantage hook."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from openclaw_opd.loss import on_policy_distillation_advantages, opd_token_advantages


def test_advantage_is_teacher_minus_student_per_token() -> None:
    teacher = [torch.tensor([-0.5, -1.0, -2.0]), torch.tensor([-0.1])]
    student = [torch.tensor([-1.0, -1.0, -0.5]), torch.tensor([-0.4])]
    got = opd_token_advantages(teacher, student)
    assert [a.tolist() for a in got] == [pytest.approx([0.5, 0.0, -1.5]), pytest.approx([0.3])]


def test_a_longer_teacher_is_aligned_to_the_last_response_tokens_like_slimes_minus_r_slice() -> None:
    got = opd_token_advantages([torch.tensor([9.0, 9.0, -1.0, -2.0])], [torch.tensor([-1.5, -1.5])])
    assert got[0].tolist() == [0.5, -0.5]


def test_an_empty_response_gets_an_empty_advantage_and_a_short_teacher_raises() -> None:
    """Slime's teacher[-0:] would keep the whole teacher row for R = 0; we return nothing."""
    assert opd_token_advantages([torch.tensor([-1.0, -2.0])], [torch.zeros(0)])[0].numel() == 0
    with pytest.raises(ValueError, match="2 teacher log-probs for 3"):
        opd_token_advantages([torch.zeros(2)], [torch.zeros(3)])


@pytest.mark.parametrize("use_rollout_logprobs", [False, True])
def test_hook_writes_advantages_and_returns_from_the_chosen_old_policy(use_rollout_logprobs: bool) -> None:
    data = {
        "log_probs": [torch.tensor([-1.0, -2.0])],
        "rollout_log_probs": [torch.tensor([-1.5, -2.5])],
        "teacher_log_probs": [torch.tensor([-0.5, -0.5])],
        "rewards": [123.0],  # ignored, as by the bundled on_policy_distillation estimator
    }
    on_policy_distillation_advantages(SimpleNamespace(use_rollout_logprobs=use_rollout_logprobs), data)
    expected = [1.0, 2.0] if use_rollout_logprobs else [0.5, 1.5]
    assert data["advantages"][0].tolist() == expected
    assert data["returns"][0].tolist() == expected


def test_hook_names_the_missing_field() -> None:
    with pytest.raises(ValueError, match="teacher_log_probs"):
        on_policy_distillation_advantages(SimpleNamespace(), {"log_probs": [torch.zeros(1)]})
    with pytest.raises(ValueError, match="log_probs"):
        on_policy_distillation_advantages(SimpleNamespace(), {"teacher_log_probs": [torch.zeros(1)]})


def test_without_a_recompute_the_hook_uses_the_rollout_log_probs_the_samples_carry() -> None:
    """Current Slime skips the old-log-prob recompute for one step per rollout with the built-in loss
    (actor.py ``can_reuse_log_probs_in_loss``): ``log_probs`` is then absent, not an error."""
    data = {"rollout_log_probs": [torch.tensor([-1.5, -2.5])], "teacher_log_probs": [torch.tensor([-0.5, -0.5])]}
    on_policy_distillation_advantages(SimpleNamespace(use_rollout_logprobs=False), data)
    assert data["advantages"][0].tolist() == [1.0, 2.0]
