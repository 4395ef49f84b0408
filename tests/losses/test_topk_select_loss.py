"""Combine's topk_select loss (upstream PR #109) against plain-Python references on small tensors.

The surrogate is checked with old != current log-probs (so the ratio clip and the teacher - old clip both
bite), value and gradient; the whole Slime-signature loss is checked against a reference built from the
response logits by loops. Each reference is also evaluated with the likely slips (a mean over the subset
instead of the sum, no clip) and must differ there, so the tests can tell them apart.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from loss_test_support import build_packed_batch, default_args, python_log_softmax, reference_response_rows

from openclaw_combine.loss import combine_loss_function
from openclaw_combine.topk_select import topk_select_loss_function, topk_select_surrogate
from openclaw_rl.losses.policy_math import make_sum_of_sample_mean

EPS_LO, EPS_HI = 0.2, 0.28


def _py_row(cur: list[float], old: list[float], teacher: list[float], valid: list[bool], clip: float | None,
            reduce: str = "sum", ratio_clip: bool = True) -> tuple[float, list[float]]:
    """(L_t, dL_t/dcur) for one token by the equations of upstream's docstring."""
    keep = [k for k, ok in enumerate(valid) if ok]
    grad = [0.0] * len(cur)
    if not keep:
        return 0.0, grad
    peak = max(old[k] for k in keep)
    norm = sum(math.exp(old[k] - peak) for k in keep)
    total = 0.0
    for k in keep:
        w = math.exp(old[k] - peak) / norm
        diff = teacher[k] - old[k]
        if clip is not None:
            diff = max(-clip, min(clip, diff))
        a = diff * w
        rho = math.exp(max(-20.0, min(20.0, cur[k] - old[k])))
        clipped_rho = max(1 - EPS_LO, min(1 + EPS_HI, rho)) if ratio_clip else rho
        unclipped, clipped = -a * rho, -a * clipped_rho
        total += max(unclipped, clipped)
        grad[k] = -a * rho if unclipped >= clipped else 0.0  # the clipped branch is flat in cur
    if reduce == "mean":
        return total / len(keep), [g / len(keep) for g in grad]
    return total, grad


def _surrogate_case() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(3)
    cur = torch.log_softmax(torch.randn(5, 4, generator=g, dtype=torch.float64), -1)
    old = cur + 0.5 * torch.randn(5, 4, generator=g, dtype=torch.float64)  # ratios well outside [0.8, 1.28]
    teacher = torch.log_softmax(3 * torch.randn(5, 4, generator=g, dtype=torch.float64), -1)  # |T - old| > 1 often
    valid = torch.rand(5, 4, generator=g) > 0.25
    valid[2] = False  # a token with an empty subset contributes 0
    valid[0] = True
    return cur, old, teacher, valid


@pytest.mark.parametrize("clip", [1.0, None])
def test_surrogate_matches_the_python_reference_value_and_gradient(clip: float | None) -> None:
    cur, old, teacher, valid = _surrogate_case()
    cur = cur.clone().requires_grad_()
    loss_R, clipfrac_R = topk_select_surrogate(cur, old, teacher, valid, EPS_LO, EPS_HI, clip)
    loss_R.sum().backward()
    assert cur.grad is not None
    want, want_grad = zip(*(_py_row(c, o, t, v, clip) for c, o, t, v in
                            zip(cur.tolist(), old.tolist(), teacher.tolist(), valid.tolist(), strict=True)), strict=True)
    torch.testing.assert_close(loss_R, torch.tensor(want, dtype=torch.float64))
    torch.testing.assert_close(cur.grad, torch.tensor(want_grad, dtype=torch.float64))
    assert loss_R[2] == 0 and clipfrac_R[2] == 0
    assert 0 < float(clipfrac_R.mean()) < 1  # the case exercises both PPO branches
    # the reference tells the likely slips apart on this case: each gives another value
    for slip in ({"reduce": "mean"}, {"clip": None} if clip else {"clip": 1.0}, {"ratio_clip": False}):
        kwargs: dict[str, Any] = {"clip": clip, **slip}
        other = [_py_row(c, o, t, v, **kwargs)[0] for c, o, t, v in
                 zip(cur.tolist(), old.tolist(), teacher.tolist(), valid.tolist(), strict=True)]
        assert max(abs(a - b) for a, b in zip(other, want, strict=True)) > 1e-3, slip


def _batch(response_lengths: list[int], vocab: int = 7, k: int = 3) -> tuple[dict[str, Any], torch.Tensor]:
    batch, logits = build_packed_batch(response_lengths, vocab=vocab, seed=5)
    g = torch.Generator().manual_seed(6)
    lps, ids = [], []
    for r in response_lengths:
        top = torch.log_softmax(2 * torch.randn(r, vocab, generator=g, dtype=torch.float64), -1).topk(k, dim=-1)
        lps.append(top.values.float())
        ids.append(top.indices)
    if response_lengths[0] > 1:  # an RL-only row (combine's _rl_only): only the sampled token, the rest -inf
        lps[0][1, 1:] = -math.inf
    batch["teacher_topk_log_probs"], batch["teacher_topk_indices"] = lps, ids
    batch["advantages"] = [torch.full((r,), a) for r, a in zip(response_lengths, (1.0, -1.0, 0.0), strict=False)]
    batch["log_probs"] = [-torch.rand(r, generator=g, dtype=torch.float64) - 1 for r in response_lengths]
    return batch, logits


def _python_loss(batch: dict[str, Any], logits: torch.Tensor, temperature: float, w_rl: float, w_opd: float,
                 reduce: str = "sum", clip: float | None = 1.0) -> tuple[float, float]:
    """(loss, opd_loss): GRPO PPO on the sampled tokens + the surrogate with old = current (ratio 1)."""
    rl = opd = 0.0
    rows = reference_response_rows(batch, logits, temperature)
    for n, (sample_rows, tokens, lp, ids, adv, old) in enumerate(zip(
            rows, batch["unconcat_tokens"], batch["teacher_topk_log_probs"], batch["teacher_topk_indices"],
            batch["advantages"], batch["log_probs"], strict=True)):
        resp = batch["response_lengths"][n]
        denom = max(resp, 1)
        for j, row in enumerate(sample_rows):
            log_p = python_log_softmax(row)
            token = tokens.tolist()[len(tokens) - resp + j]
            a, ratio = w_rl * float(adv[j]), math.exp(log_p[token] - float(old[j]))
            rl += max(-a * ratio, -a * max(1 - EPS_LO, min(1 + EPS_HI, ratio))) / denom
            cur = [log_p[i] for i in ids[j].tolist()]
            teacher = lp[j].tolist()
            opd += _py_row(cur, cur, teacher, [math.isfinite(t) for t in teacher], clip, reduce)[0] / denom
    return rl + w_opd * opd, opd


def _run(batch: dict[str, Any], logits: torch.Tensor, fn: Any = topk_select_loss_function, **overrides: Any):  # noqa: ANN202
    values = {"rollout_temperature": 0.8, "openclaw_combine_w_rl": 0.5, "openclaw_combine_w_opd": 2.0,
              "openclaw_combine_loss": "topk_select", **overrides}
    args = default_args(**values)
    reducer = make_sum_of_sample_mean(batch["response_lengths"], batch["loss_masks"])
    return fn(args, batch, logits, reducer)


def test_loss_matches_the_python_reference_and_tells_sum_from_mean() -> None:
    batch, logits = _batch([3, 4, 2])
    loss, metrics = _run(batch, logits)
    want, want_opd = _python_loss(batch, logits, 0.8, 0.5, 2.0)
    assert float(loss.detach()) == pytest.approx(want, rel=1e-6, abs=1e-9)
    assert float(metrics["opd_loss"]) == pytest.approx(want_opd, rel=1e-6, abs=1e-9)
    assert abs(_python_loss(batch, logits, 0.8, 0.5, 2.0, reduce="mean")[1] - want_opd) > 1e-3
    assert abs(_python_loss(batch, logits, 0.8, 0.5, 2.0, clip=None)[1] - want_opd) > 1e-3
    assert float(metrics["distill_subset_size"]) < 3 * 3  # the RL-only row compares one id
    # the embedded trainer reaches it through combine's loss, switched by openclaw_combine_loss
    loss_via_combine, _ = _run(batch, logits, fn=combine_loss_function)
    assert float(loss_via_combine.detach()) == pytest.approx(float(loss.detach()), rel=1e-12)


def test_gradient_is_the_detached_advantage_times_the_log_prob_gradient() -> None:
    """With old = current (one step per rollout) d L_OPD/d logits = sum_v -A_v d l(v)/d logits."""
    batch, logits = _batch([3, 2])
    loss, _ = _run(batch, logits, openclaw_combine_w_rl=0.0, openclaw_combine_w_opd=1.0)
    loss.backward()
    got = logits.grad.clone()
    leaf = logits.detach().clone().requires_grad_()
    total, start = torch.zeros((), dtype=torch.float64), 0
    for resp, lp, ids, tot in zip(batch["response_lengths"], batch["teacher_topk_log_probs"],
                                  batch["teacher_topk_indices"], batch["total_lengths"], strict=True):
        prompt = tot - resp
        log_p = torch.log_softmax(leaf[0, start + prompt - 1: start + tot - 1] / 0.8, -1)
        cur = log_p.gather(-1, ids)
        valid = lp.isfinite()
        w = torch.softmax(torch.where(valid, cur.detach(), torch.tensor(-math.inf, dtype=cur.dtype)), -1)
        a = (torch.where(valid, lp.double() - cur.detach(), torch.zeros_like(cur)).clamp(-1, 1) * w).detach()
        total = total + (-(a * cur).sum(-1)).sum() / resp
        start += tot
    total.backward()
    torch.testing.assert_close(got, leaf.grad)


def test_refusals() -> None:
    batch, logits = _batch([2, 2])
    with pytest.raises(ValueError, match="w_rl must be >= 0"):
        _run(batch, logits, openclaw_combine_w_rl=-1.0)
    del batch["teacher_topk_log_probs"]
    with pytest.raises(ValueError, match="teacher's top-K"):
        _run(batch, logits)
