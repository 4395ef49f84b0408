"""ppo_policy_loss against a plain-Python PPO computation, gradcheck, clipping and empty-sample edges."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from loss_test_support import (
    build_packed_batch,
    default_args,
    python_log_softmax,
    python_sample_mean_sum,
    reference_response_rows,
    reference_token_log_probs,
)

from openclaw_rl.losses.policy_loss import policy_loss_function, ppo_policy_loss
from openclaw_rl.losses.policy_math import make_sum_of_sample_mean


def _reducer(batch: dict[str, Any]):  # noqa: ANN202
    return make_sum_of_sample_mean(batch["response_lengths"], batch["loss_masks"])


def _per_sample(values: list[list[float]]) -> list[torch.Tensor]:
    return [torch.tensor(v, dtype=torch.float64) for v in values]


def _offset(values: list[list[float]], offsets: list[float]) -> list[list[float]]:
    flat = iter(offsets * 10)
    return [[v + next(flat) for v in sample] for sample in values]


def _python_ppo(batch: dict[str, Any], logits: torch.Tensor, args: Any) -> dict[str, float]:
    """The whole loss by loops over tokens: PPO clip, entropy bonus, low-var KL, drift metric."""
    temperature = args.rollout_temperature
    new = reference_token_log_probs(batch, logits, temperature)
    rows = reference_response_rows(batch, logits, temperature)
    old = [t.tolist() for t in batch["log_probs"]]
    adv = [t.tolist() for t in batch["advantages"]]
    ref = [t.tolist() for t in batch["ref_log_probs"]]
    rollout = [t.tolist() for t in batch["rollout_log_probs"]]
    masks = [m.tolist() for m in batch["loss_masks"]]
    per_token: dict[str, list[list[float]]] = {
        name: [[] for _ in new]
        for name in ("pg_loss", "pg_clipfrac", "kl_loss", "entropy_loss", "ppo_kl", "train_rollout_logprob_abs_diff")
    }
    for s, sample in enumerate(new):
        for t, logp in enumerate(sample):
            ratio, a = math.exp(logp - old[s][t]), adv[s][t]
            unclipped = -ratio * a
            clipped = -min(max(ratio, 1 - args.eps_clip), 1 + args.eps_clip_high) * a
            x = ref[s][t] - logp
            log_p = python_log_softmax(rows[s][t])
            per_token["pg_loss"][s].append(max(unclipped, clipped))
            per_token["pg_clipfrac"][s].append(float(clipped > unclipped))
            per_token["kl_loss"][s].append(min(max(math.exp(x) - 1 - x, -10), 10))
            per_token["entropy_loss"][s].append(-sum(math.exp(v) * v for v in log_p))
            per_token["ppo_kl"][s].append(old[s][t] - logp)
            per_token["train_rollout_logprob_abs_diff"][s].append(abs(logp - rollout[s][t]))
    out = {name: python_sample_mean_sum(values, masks) for name, values in per_token.items()}
    out["loss"] = out["pg_loss"] - args.entropy_coef * out["entropy_loss"] + args.kl_loss_coef * out["kl_loss"]
    return out


def _full_batch(response_lengths: list[int], log_ratio_offsets: list[float], seed: int = 0, temperature: float = 0.7):
    batch, logits = build_packed_batch(response_lengths, prompt_lengths=[2, 1, 3, 2][: len(response_lengths)],
                                       vocab=4, seed=seed)
    new = reference_token_log_probs(batch, logits, temperature)
    batch["log_probs"] = _per_sample(_offset(new, log_ratio_offsets))
    batch["rollout_log_probs"] = _per_sample(_offset(new, [0.03, -0.02]))
    batch["ref_log_probs"] = _per_sample(_offset(new, [0.4, -0.3, 0.1]))
    generator = torch.Generator().manual_seed(seed + 1)
    batch["advantages"] = [torch.randn(r, generator=generator, dtype=torch.float64) for r in response_lengths]
    return batch, logits


def test_loss_and_every_metric_match_the_python_reference() -> None:
    batch, logits = _full_batch([3, 2, 4], [0.6, -0.6, 0.05, -0.05, 0.0])
    batch["loss_masks"][2] = torch.tensor([1, 0, 1, 1], dtype=torch.int32)
    args = default_args(rollout_temperature=0.7, entropy_coef=0.01, use_kl_loss=True, kl_loss_coef=0.1)
    loss, metrics = ppo_policy_loss(args, batch, logits, _reducer(batch))
    expected = _python_ppo(batch, logits, args)
    assert set(metrics) == set(expected)
    for key, value in expected.items():
        rel = 1e-6 if key == "pg_clipfrac" else 1e-9  # Slime's clip indicator is float32
        assert metrics[key].item() == pytest.approx(value, rel=rel, abs=1e-12), key
    assert loss.item() == pytest.approx(expected["loss"], rel=1e-9)
    assert expected["pg_clipfrac"] > 0  # the offsets really do clip some tokens


def test_gradcheck_with_clipped_tokens_entropy_and_kl() -> None:
    batch, logits = _full_batch([2, 3], [0.6, -0.1, 0.1, -0.6, 0.02])
    args = default_args(rollout_temperature=0.7, entropy_coef=0.05, use_kl_loss=True, kl_loss_coef=0.2,
                        kl_loss_type="k3")
    reducer = _reducer(batch)
    assert torch.autograd.gradcheck(lambda x: ppo_policy_loss(args, batch, x, reducer)[0], (logits,))


def _one_token_samples(log_ratios: list[float], advantages: list[float]):  # noqa: ANN202
    n = len(log_ratios)
    batch, logits = build_packed_batch([1] * n, prompt_lengths=[1] * n, vocab=4, seed=2)
    new = reference_token_log_probs(batch, logits)
    batch["log_probs"] = _per_sample([[lp[0] - r] for lp, r in zip(new, log_ratios, strict=True)])
    batch["advantages"] = _per_sample([[a] for a in advantages])
    return batch, logits


@pytest.mark.parametrize("eps_clip_c", [None, 3.0])
def test_clipped_tokens_count_in_clipfrac_and_get_zero_gradient(eps_clip_c: float | None) -> None:
    # ratio above 1 + 0.28 with A > 0, below 1 - 0.2 with A < 0, inside twice, and e^2 with A < 0.
    batch, logits = _one_token_samples([0.6, -0.6, 0.05, -0.05, 2.0], [1.0, -1.0, 1.0, -1.0, -1.0])
    loss, metrics = ppo_policy_loss(default_args(eps_clip_c=eps_clip_c), batch, logits, _reducer(batch))
    loss.backward()
    assert metrics["pg_clipfrac"].item() == 2.0  # one-token samples: the sum counts clipped tokens
    row_grad_norms = [logits.grad[0, 2 * i].abs().sum().item() for i in range(5)]
    assert row_grad_norms[0] == 0.0 and row_grad_norms[1] == 0.0
    assert row_grad_norms[2] > 0 and row_grad_norms[3] > 0
    # Dual clip caps the A < 0, ratio e^2 token at -c * A = 3 and freezes its gradient.
    assert (row_grad_norms[4] == 0.0) == (eps_clip_c is not None)
    dual_token_loss = 3.0 if eps_clip_c is not None else math.exp(2.0)
    inside = -math.exp(0.05) + math.exp(-0.05)
    assert metrics["pg_loss"].item() == pytest.approx(-1.28 + 0.8 + inside + dual_token_loss)


def test_empty_and_all_masked_samples_add_nothing_and_stay_finite() -> None:
    batch, logits = _full_batch([2, 0, 3], [0.1, -0.1])
    batch["loss_masks"][2] = torch.zeros(3, dtype=torch.int32)
    args = default_args(entropy_coef=0.01, use_kl_loss=True, kl_loss_coef=0.1, rollout_temperature=0.7)
    loss, metrics = ppo_policy_loss(args, batch, logits, _reducer(batch))
    loss.backward()
    expected = _python_ppo(batch, logits, args)
    assert loss.item() == pytest.approx(expected["loss"], rel=1e-9)
    assert all(torch.isfinite(v) for v in metrics.values())
    assert torch.isfinite(logits.grad).all()
    assert logits.grad[0, 4:].abs().sum().item() == 0.0  # the R = 0 and the all-masked segments


def test_an_all_empty_micro_batch_still_backpropagates() -> None:
    batch, logits = build_packed_batch([0, 0], vocab=4)
    batch["advantages"], batch["log_probs"] = [torch.zeros(0)] * 2, [torch.zeros(0)] * 2
    loss, metrics = ppo_policy_loss(default_args(), batch, logits, _reducer(batch))
    loss.backward()
    assert loss.item() == 0.0 and metrics["pg_clipfrac"].item() == 0.0
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def test_without_old_log_probs_the_ratio_is_one() -> None:
    batch, logits = _full_batch([2, 3], [0.6])
    del batch["log_probs"]
    _, metrics = ppo_policy_loss(default_args(rollout_temperature=0.7), batch, logits, _reducer(batch))
    assert metrics["ppo_kl"].item() == 0.0 and metrics["pg_clipfrac"].item() == 0.0
    mean_adv = sum(a.mean().item() for a in batch["advantages"])
    assert metrics["pg_loss"].item() == pytest.approx(-mean_adv)


def test_use_rollout_logprobs_makes_the_rollout_the_old_policy() -> None:
    batch, logits = _full_batch([2, 3], [0.6])
    args = default_args(rollout_temperature=0.7, use_rollout_logprobs=True)
    _, metrics = ppo_policy_loss(args, batch, logits, _reducer(batch))
    batch["log_probs"] = batch["rollout_log_probs"]
    _, expected = ppo_policy_loss(default_args(rollout_temperature=0.7), batch, logits, _reducer(batch))
    torch.testing.assert_close(metrics["ppo_kl"], expected["ppo_kl"])
    del batch["rollout_log_probs"]
    with pytest.raises(ValueError, match="rollout_log_probs"):
        ppo_policy_loss(args, batch, logits, _reducer(batch))


def test_zero_entropy_coef_keeps_entropy_out_of_the_gradient() -> None:
    batch, logits = _full_batch([3, 2], [0.1, -0.1])
    loss, metrics = ppo_policy_loss(default_args(rollout_temperature=0.7), batch, logits, _reducer(batch))
    loss.backward()
    # Independent torch expression of the PG term alone.
    other = logits.detach().clone().requires_grad_()
    log_p = torch.log_softmax(other[0] / 0.7, dim=-1)
    rows, tokens, start = [], [], 0
    for total, resp, toks in zip(batch["total_lengths"], batch["response_lengths"], batch["unconcat_tokens"],
                                 strict=True):
        rows += list(range(start + total - resp - 1, start + total - 1))
        tokens += toks[total - resp :].tolist()
        start += total
    new = log_p[rows, tokens]
    ratio = torch.exp(new - torch.cat(batch["log_probs"]))
    adv = torch.cat(batch["advantages"])
    pg = torch.maximum(-ratio * adv, -ratio.clamp(0.8, 1.28) * adv)
    _reducer(batch)(pg).backward()
    torch.testing.assert_close(logits.grad, other.grad)
    assert metrics["entropy_loss"].item() > 0


def test_kl_with_zero_coefficient_is_a_metric_only_and_missing_reference_is_checked() -> None:
    batch, logits = _full_batch([2, 2], [0.0])
    args = default_args(use_kl_loss=True, kl_loss_coef=0.0, rollout_temperature=0.7)
    loss, metrics = ppo_policy_loss(args, batch, logits, _reducer(batch))
    plain, _ = ppo_policy_loss(default_args(rollout_temperature=0.7), batch, logits, _reducer(batch))
    assert metrics["kl_loss"].item() > 0 and loss.item() == plain.item()
    del batch["ref_log_probs"]
    _, no_ref = ppo_policy_loss(args, batch, logits, _reducer(batch))
    assert "kl_loss" not in no_ref
    with pytest.raises(ValueError, match="ref_log_probs"):
        ppo_policy_loss(default_args(use_kl_loss=True, kl_loss_coef=0.1), batch, logits, _reducer(batch))


@pytest.mark.parametrize("flag", ["use_tis", "use_opsm", "use_score_centering"])
def test_unsupported_slime_features_raise_instead_of_being_ignored(flag: str) -> None:
    batch, logits = _full_batch([2], [0.0])
    with pytest.raises(ValueError, match=flag.replace("_", "-")):
        ppo_policy_loss(default_args(**{flag: True}), batch, logits, _reducer(batch))


def test_policy_loss_function_is_ppo_on_the_batch_advantages() -> None:
    batch, logits = _full_batch([3, 1], [0.2, -0.3])
    args = default_args(rollout_temperature=0.7)
    loss, metrics = policy_loss_function(args, batch, logits, _reducer(batch))
    same, same_metrics = ppo_policy_loss(args, batch, logits, _reducer(batch), advantages=batch["advantages"])
    assert loss.item() == same.item() and metrics.keys() == same_metrics.keys()
