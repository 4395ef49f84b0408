"""combine_loss_function: the advantage mix, its weights (args and env) and equivalence with PPO."""

from __future__ import annotations

import pytest
import torch
from loss_test_support import build_packed_batch, default_args, reference_token_log_probs

from openclaw_combine.loss import combine_loss_function, combine_weights, combined_advantages
from openclaw_rl.losses.policy_loss import ppo_policy_loss
from openclaw_rl.losses.policy_math import grpo_advantages, make_sum_of_sample_mean


@pytest.fixture(autouse=True)
def _no_weight_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENCLAW_COMBINE_W_RL", raising=False)
    monkeypatch.delenv("OPENCLAW_COMBINE_W_OPD", raising=False)


def _combine_batch():  # noqa: ANN202
    """Sample 0: RL-only (teacher = old, reward 1). Sample 1: OPD-only (reward 0). Sample 2: both."""
    batch, logits = build_packed_batch([3, 2, 2], vocab=4, seed=4)
    new = reference_token_log_probs(batch, logits, temperature=0.6)
    old = [torch.tensor(v, dtype=torch.float64) + 0.05 for v in new]
    batch["log_probs"] = old
    batch["teacher_log_probs"] = [old[0].clone(), old[1] + torch.tensor([0.5, -0.25], dtype=torch.float64),
                                  old[2] - 0.3]
    batch["advantages"] = grpo_advantages([1.0, 0.0, -1.0], batch["response_lengths"])
    return batch, logits


def test_rl_only_samples_have_no_teacher_term_and_opd_only_samples_no_rl_term() -> None:
    batch, _ = _combine_batch()
    mixed = combined_advantages(batch["advantages"], batch["log_probs"], batch["teacher_log_probs"],
                                w_rl=0.7, w_opd=2.0)
    assert mixed[0].tolist() == pytest.approx([0.7, 0.7, 0.7])  # teacher == old -> only w_rl * reward
    assert mixed[1].tolist() == pytest.approx([2.0 * 0.5, 2.0 * -0.25])  # reward 0 -> only w_opd * (t - old)
    assert mixed[2].tolist() == pytest.approx([2.0 * -0.3 - 0.7] * 2)


def test_combine_loss_is_ppo_on_the_combined_advantages() -> None:
    batch, logits = _combine_batch()
    args = default_args(rollout_temperature=0.6, openclaw_combine_w_rl=0.5, openclaw_combine_w_opd=1.5,
                        entropy_coef=0.01)
    reducer = make_sum_of_sample_mean(batch["response_lengths"], batch["loss_masks"])
    loss, metrics = combine_loss_function(args, batch, logits, reducer)
    manual = [1.5 * (t - o) + 0.5 * a for t, o, a in
              zip(batch["teacher_log_probs"], batch["log_probs"], batch["advantages"], strict=True)]
    expected, expected_metrics = ppo_policy_loss(args, batch, logits, reducer, advantages=manual)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    assert metrics.keys() == expected_metrics.keys() >= {"loss", "pg_loss", "entropy_loss", "pg_clipfrac", "ppo_kl"}


def test_gradcheck_combine_loss() -> None:
    batch, logits = _combine_batch()
    args = default_args(rollout_temperature=0.6, entropy_coef=0.02)
    reducer = make_sum_of_sample_mean(batch["response_lengths"], batch["loss_masks"])
    assert torch.autograd.gradcheck(lambda x: combine_loss_function(args, batch, x, reducer)[0], (logits,))


def test_weights_come_from_args_then_env_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert combine_weights(default_args()) == (1.0, 1.0)
    monkeypatch.setenv("OPENCLAW_COMBINE_W_RL", "0.25")
    monkeypatch.setenv("OPENCLAW_COMBINE_W_OPD", "0")
    assert combine_weights(default_args()) == (0.25, 0.0)
    assert combine_weights(default_args(openclaw_combine_w_rl=2.0, openclaw_combine_w_opd=None)) == (2.0, 0.0)
    monkeypatch.setenv("OPENCLAW_COMBINE_W_OPD", "")
    assert combine_weights(default_args()) == (0.25, 1.0)  # empty means unset, like upstream's `or 1.0`
    monkeypatch.setenv("OPENCLAW_COMBINE_W_OPD", "heavy")
    with pytest.raises(ValueError, match="OPENCLAW_COMBINE_W_OPD"):
        combine_weights(default_args())


def test_env_weights_reach_the_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    batch, logits = _combine_batch()
    reducer = make_sum_of_sample_mean(batch["response_lengths"], batch["loss_masks"])
    monkeypatch.setenv("OPENCLAW_COMBINE_W_RL", "0")
    monkeypatch.setenv("OPENCLAW_COMBINE_W_OPD", "0")
    _, metrics = combine_loss_function(default_args(rollout_temperature=0.6), batch, logits, reducer)
    assert metrics["pg_loss"].item() == 0.0  # all advantages are zero


def test_no_teacher_field_or_entry_means_zero_teacher_advantage() -> None:
    batch, logits = _combine_batch()
    teachers = batch.pop("teacher_log_probs")
    no_field = combined_advantages(batch["advantages"], batch["log_probs"], None, 1.0, 1.0)
    assert [a.tolist() for a in no_field] == [a.tolist() for a in batch["advantages"]]
    partial = combined_advantages(batch["advantages"], batch["log_probs"], [None, teachers[1], None], 1.0, 1.0)
    assert partial[0].tolist() == [1.0] * 3 and partial[2].tolist() == [-1.0] * 2
    reducer = make_sum_of_sample_mean(batch["response_lengths"], batch["loss_masks"])
    loss, _ = combine_loss_function(default_args(rollout_temperature=0.6), batch, logits, reducer)
    assert torch.isfinite(loss)


def test_missing_old_log_probs_raise_with_a_remedy() -> None:
    batch, logits = _combine_batch()
    del batch["log_probs"]
    reducer = make_sum_of_sample_mean(batch["response_lengths"], batch["loss_masks"])
    with pytest.raises(ValueError, match="use-rollout-logprobs"):
        combine_loss_function(default_args(), batch, logits, reducer)
