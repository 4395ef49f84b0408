"""policy_math against closed forms and plain-Python loops; Slime delegation checked with a fake module."""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace

import pytest
import torch
from loss_test_support import python_sample_mean_sum

from openclaw_rl.losses import policy_math
from openclaw_rl.losses.policy_math import (
    compute_approx_kl,
    compute_policy_loss,
    entropy_from_logits,
    grpo_advantages,
    make_sum_of_sample_mean,
    torch_compute_approx_kl,
    torch_compute_policy_loss,
)

LOGP = [-0.1, -2.0, -0.7, -30.0, -0.01]
REF = [-0.3, -0.5, -0.7, -0.2, -25.0]


def _expected_kl(kl_type: str, logp: float, ref: float) -> float:
    log_ratio = logp - ref
    if kl_type == "k1":
        return log_ratio
    if kl_type == "k2":
        return log_ratio**2 / 2
    k3 = math.exp(-log_ratio) - 1 + log_ratio
    return min(max(k3, -10.0), 10.0) if kl_type == "low_var_kl" else k3


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3", "low_var_kl"])
def test_approx_kl_matches_schulman_estimators(kl_type: str) -> None:
    got = compute_approx_kl(torch.tensor(LOGP, dtype=torch.float64), torch.tensor(REF, dtype=torch.float64), kl_type)
    expected = [_expected_kl(kl_type, a, b) for a, b in zip(LOGP, REF, strict=True)]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))


def test_low_var_kl_clamps_at_ten_while_k3_does_not() -> None:
    logp, ref = torch.tensor([-30.0]), torch.tensor([-0.2])
    assert compute_approx_kl(logp, ref, "low_var_kl").item() == 10.0
    assert compute_approx_kl(logp, ref, "k3").item() > 1e12


def test_importance_ratio_scales_before_the_low_var_clamp() -> None:
    logp, ref, ratio = torch.tensor([-1.0, -30.0]), torch.tensor([-1.5, -0.2]), torch.tensor([2.0, 0.5])
    unscaled = torch_compute_approx_kl(logp, ref, "k3")
    got = compute_approx_kl(logp, ref, "low_var_kl", importance_ratio=ratio)
    torch.testing.assert_close(got, (ratio * unscaled).clamp(-10, 10))


def test_unknown_kl_type_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown kl_type"):
        compute_approx_kl(torch.zeros(2), torch.zeros(2), "k4")


def test_half_precision_kl_is_computed_in_float32() -> None:
    got = compute_approx_kl(torch.tensor([-1.0], dtype=torch.bfloat16), torch.tensor([-2.0]), "k1")
    assert got.dtype == torch.float32


def _python_pg(log_ratio: float, adv: float, lo: float, hi: float, c: float | None) -> tuple[float, float]:
    ratio = math.exp(log_ratio)
    unclipped, clipped = -ratio * adv, -min(max(ratio, 1 - lo), 1 + hi) * adv
    loss = max(unclipped, clipped)
    if c is not None and adv < 0:
        loss = min(loss, -c * adv)
    return loss, float(clipped > unclipped)


@pytest.mark.parametrize("eps_clip_c", [None, 3.0])
def test_policy_loss_matches_python_loop_on_both_clip_bounds(eps_clip_c: float | None) -> None:
    # new - old log-ratios: inside, above 1 + hi, below 1 - lo, and far above for the dual clip.
    log_ratios = [0.05, 0.6, -0.6, 0.6, -0.6, 2.0, 0.0]
    advantages = [1.0, 1.0, -1.0, -1.0, 1.0, -2.0, 0.0]
    ppo_kl = -torch.tensor(log_ratios, dtype=torch.float64)
    pg, clipfrac = compute_policy_loss(ppo_kl, torch.tensor(advantages, dtype=torch.float64), 0.2, 0.28, eps_clip_c)
    expected = [_python_pg(r, a, 0.2, 0.28, eps_clip_c) for r, a in zip(log_ratios, advantages, strict=True)]
    torch.testing.assert_close(pg, torch.tensor([e[0] for e in expected], dtype=torch.float64))
    assert clipfrac.tolist() == [e[1] for e in expected] == [0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_dual_clip_needs_a_bound_above_one() -> None:
    with pytest.raises(ValueError, match="eps_clip_c"):
        torch_compute_policy_loss(torch.zeros(1), torch.ones(1), 0.2, 0.2, eps_clip_c=0.9)


def test_entropy_matches_python_and_ignores_masked_vocab() -> None:
    rows = [[0.5, -1.0, 2.0, 0.0], [3.0, 3.0, -4.0, 1.0]]
    got = entropy_from_logits(torch.tensor(rows, dtype=torch.float64))
    expected = []
    for row in rows:
        norm = math.log(sum(math.exp(v) for v in row))
        expected.append(-sum(math.exp(v - norm) * (v - norm) for v in row))
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))

    masked = torch.tensor([[0.5, -math.inf, 2.0]], dtype=torch.float64, requires_grad=True)
    entropy = entropy_from_logits(masked)
    entropy.sum().backward()
    assert torch.isfinite(entropy).all() and torch.isfinite(masked.grad).all()
    torch.testing.assert_close(entropy, entropy_from_logits(torch.tensor([[0.5, 2.0]], dtype=torch.float64)))


def test_sum_of_sample_mean_matches_loops_with_empty_and_masked_samples() -> None:
    lengths = [3, 0, 2, 4]
    masks = [torch.tensor([1, 0, 1]), torch.zeros(0), torch.zeros(2), torch.tensor([1, 1, 1, 0])]
    values = torch.arange(9, dtype=torch.float64) - 4
    reducer = make_sum_of_sample_mean(lengths, masks)
    per_sample = [chunk.tolist() for chunk in values.split(lengths)]
    expected = python_sample_mean_sum(per_sample, [m.tolist() for m in masks])
    assert reducer(values).item() == pytest.approx(expected)
    with pytest.raises(ValueError, match="per-token values"):
        reducer(values[:-1])
    with pytest.raises(ValueError, match="loss mask has 2 entries"):
        make_sum_of_sample_mean([3], [torch.ones(2)])


def test_grpo_without_normalisation_broadcasts_the_raw_reward() -> None:
    advantages = grpo_advantages([1.0, -1.0, 0.0], [2, 0, 3])
    assert [a.tolist() for a in advantages] == [[1.0, 1.0], [], [0.0, 0.0, 0.0]]
    assert all(a.dtype == torch.float32 for a in advantages)


@pytest.mark.parametrize("std_normalize", [False, True])
def test_grpo_normalises_per_group_index_and_std_divides_only_real_groups(std_normalize: bool) -> None:
    rewards, groups, lengths = [1.0, 0.0, 5.0, 2.0, -1.0, 3.0], [7, 7, 9, 7, 3, 3], [1, 2, 1, 3, 1, 2]
    advantages = grpo_advantages(rewards, lengths, groups, normalize=True, std_normalize=std_normalize)
    expected = []
    for reward, group in zip(rewards, groups, strict=True):
        members = [r for r, g in zip(rewards, groups, strict=True) if g == group]
        value = reward - statistics.fmean(members)
        if std_normalize and len(members) > 1:
            value /= statistics.stdev(members) + 1e-6
        expected.append(value)
    for adv, value, n in zip(advantages, expected, lengths, strict=True):
        torch.testing.assert_close(adv, torch.full((n,), value, dtype=torch.float32))
    assert advantages[2].tolist() == [0.0]  # singleton group centres to 0 and is never divided


def test_grpo_normalisation_needs_group_indices() -> None:
    with pytest.raises(ValueError, match="group_indices"):
        grpo_advantages([1.0], [1], normalize=True)
    with pytest.raises(ValueError, match="std_normalize"):
        grpo_advantages([1.0], [1], std_normalize=True)


def test_functions_delegate_to_slime_when_it_is_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fake_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor, kl_loss_type: str) -> torch.Tensor:
        calls.append(f"kl:{kl_loss_type}")
        return torch_compute_approx_kl(log_probs, log_probs_base, kl_loss_type)

    def fake_pg(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c=None):  # noqa: ANN001, ANN202
        calls.append(f"pg:{eps_clip}:{eps_clip_high}:{eps_clip_c}")
        return torch_compute_policy_loss(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c)

    def fake_returns(rewards: torch.Tensor, kl: list[torch.Tensor]) -> list[torch.Tensor]:
        calls.append("grpo")
        return [torch.ones_like(k) * r for k, r in zip(kl, rewards, strict=True)]

    fake = SimpleNamespace(compute_approx_kl=fake_kl, compute_policy_loss=fake_pg, get_grpo_returns=fake_returns)
    monkeypatch.setattr(policy_math, "_SLIME_PPO", fake)
    compute_approx_kl(torch.zeros(2), torch.ones(2), "k2")
    compute_policy_loss(torch.zeros(2), torch.ones(2), 0.2, 0.3, 4.0)
    assert [a.tolist() for a in grpo_advantages([2.0], [2])] == [[2.0, 2.0]]
    # This fake predates importance_ratio, so the call falls back to the twin instead of dropping it.
    compute_approx_kl(torch.zeros(2), torch.ones(2), "k3", importance_ratio=torch.ones(2))
    assert calls == ["kl:k2", "pg:0.2:0.3:4.0", "grpo"]


@pytest.mark.skipif(policy_math._load_slime_ppo_utils() is None, reason="Slime is not installed here")
def test_real_slime_and_the_torch_twins_agree() -> None:
    slime = policy_math._load_slime_ppo_utils()
    logp, ref = torch.tensor(LOGP), torch.tensor(REF)
    for kl_type in policy_math.KL_TYPES:
        torch.testing.assert_close(slime.compute_approx_kl(logp, ref, kl_loss_type=kl_type),
                                   torch_compute_approx_kl(logp, ref, kl_type))
    ppo_kl, adv = torch.tensor([0.5, -0.5, 0.0]), torch.tensor([1.0, -1.0, 2.0])
    for got, want in zip(slime.compute_policy_loss(ppo_kl, adv, 0.2, 0.28, eps_clip_c=3.0),
                         torch_compute_policy_loss(ppo_kl, adv, 0.2, 0.28, 3.0), strict=True):
        torch.testing.assert_close(got, want)
