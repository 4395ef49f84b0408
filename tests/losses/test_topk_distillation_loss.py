"""Top-K + tail reverse KL against a plain-Python reference, gradcheck, and numerically hostile teachers."""

from __future__ import annotations

import decimal
import math
import sys
from typing import Any

import pytest
import torch
from loss_test_support import (
    AllocationProbe,
    build_packed_batch,
    default_args,
    python_log_softmax,
    reference_response_rows,
)

from openclaw_opd import loss as opd_loss
from openclaw_opd.loss import log1mexp, topk_distillation_loss_function
from openclaw_rl.losses.policy_math import make_sum_of_sample_mean

EPS64 = sys.float_info.epsilon


def _python_row(row: list[float], teacher: list[float], ids: list[int], subset: str = "teacher",
                ) -> tuple[float, float, bool]:
    """(kl, entropy, row_valid) for one token; -inf or out-of-range teacher bins fold into the tail, and so
    do, under ``overlap``, teacher ids outside the student's top-K (K = the teacher row's width)."""
    log_p = python_log_softmax(row)
    vocab = len(row)
    kth = sorted(row, reverse=True)[min(len(ids), vocab) - 1]
    keep = [k for k, (t, i) in enumerate(zip(teacher, ids, strict=True)) if math.isfinite(t) and 0 <= i < vocab
            and (subset == "teacher" or row[i] >= kth)]
    s = [log_p[ids[k]] for k in keep]
    t = [teacher[k] for k in keep]

    def tail(values: list[float]) -> float:
        head = math.log(sum(math.exp(v) for v in values)) if values else -math.inf
        return math.log(-math.expm1(min(head, -EPS64)))

    s, t = s + [tail(s)], t + [tail(t)]
    kl = sum(math.exp(a) * (a - b) for a, b in zip(s, t, strict=True))
    entropy = -sum(math.exp(a) * a for a in s)
    finite = [v for v in teacher if math.isfinite(v)]
    broken = any(math.isnan(v) or v == math.inf for v in teacher)
    mass_ok = not finite or math.log(sum(math.exp(v) for v in finite)) <= math.log1p(1e-3)
    return kl, entropy, (not broken) and mass_ok


def _python_loss(batch: dict, logits: torch.Tensor, temperature: float, entropy_coef: float,
                 subset: str = "teacher") -> dict[str, float]:
    rows = reference_response_rows(batch, logits, temperature)
    out = {"kl_loss": 0.0, "entropy_loss": 0.0, "teacher_invalid_frac": 0.0}
    for sample_rows, lp, ids, mask in zip(rows, batch["teacher_topk_log_probs"], batch["teacher_topk_indices"],
                                          batch["loss_masks"], strict=True):
        denom = max(int(mask.sum()), 1)
        for row, teacher, index, m in zip(sample_rows, lp.tolist(), ids.tolist(), mask.tolist(), strict=True):
            kl, entropy, ok = _python_row(row, teacher, index, subset)
            out["kl_loss"] += m * (kl if ok else 0.0) / denom
            out["entropy_loss"] += m * (entropy if ok else 0.0) / denom
            out["teacher_invalid_frac"] += m * (0.0 if ok else 1.0) / denom
    out["loss"] = out["kl_loss"] - entropy_coef * out["entropy_loss"]
    return out


def _topk_batch(response_lengths: list[int], vocab: int = 6, k: int = 3, seed: int = 0):  # noqa: ANN202
    """A teacher whose top-K rows are a real truncated distribution over the vocabulary."""
    batch, logits = build_packed_batch(response_lengths, vocab=vocab, seed=seed)
    generator = torch.Generator().manual_seed(seed + 10)
    lps, ids = [], []
    for r in response_lengths:
        teacher_logp = torch.log_softmax(torch.randn(r, vocab, generator=generator, dtype=torch.float64), dim=-1)
        top = teacher_logp.topk(k, dim=-1)
        lps.append(top.values.float())
        ids.append(top.indices)
    batch["teacher_topk_log_probs"], batch["teacher_topk_indices"] = lps, ids
    return batch, logits


def _run(batch: dict, logits: torch.Tensor, temperature: float = 0.8, entropy_coef: float = 0.05,  # noqa: ANN202
         subset: str = "teacher"):
    args = default_args(rollout_temperature=temperature, entropy_coef=entropy_coef, openclaw_opd_distill_subset=subset)
    reducer = make_sum_of_sample_mean(batch["response_lengths"], batch["loss_masks"])
    return topk_distillation_loss_function(args, batch, logits, reducer)


def _assert_matches_python(batch: dict, logits: torch.Tensor, **kwargs: Any) -> dict[str, torch.Tensor]:
    loss, metrics = _run(batch, logits, **kwargs)
    expected = _python_loss(batch, logits, kwargs.get("temperature", 0.8), kwargs.get("entropy_coef", 0.05),
                            kwargs.get("subset", "teacher"))
    for key, value in expected.items():
        assert metrics[key].item() == pytest.approx(value, rel=1e-7, abs=1e-9), key
    loss.backward()
    assert torch.isfinite(logits.grad).all()
    return metrics


def test_loss_matches_the_python_reference() -> None:
    batch, logits = _topk_batch([3, 2, 4])
    batch["loss_masks"][2] = torch.tensor([1, 1, 0, 1], dtype=torch.int32)
    metrics = _assert_matches_python(batch, logits)
    assert set(metrics) == {"loss", "kl_loss", "entropy_loss", "teacher_invalid_frac", "distill_subset_size"}
    assert metrics["kl_loss"].item() > 0 and metrics["teacher_invalid_frac"].item() == 0.0
    assert metrics["distill_subset_size"].item() == pytest.approx(3 * 3)  # K ids per token, 3 samples' means


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_overlap_subset_matches_the_python_reference(seed: int) -> None:
    batch, logits = _topk_batch([3, 2, 4], vocab=7, k=3, seed=seed)
    overlap = _assert_matches_python(batch, logits, subset="overlap")
    _, teacher = _run(*_topk_batch([3, 2, 4], vocab=7, k=3, seed=seed))
    assert overlap["distill_subset_size"].item() < teacher["distill_subset_size"].item()  # some ids left out


def test_overlap_subset_by_hand() -> None:
    """V = 4, K = 2. Student logits [3, 2, 1, 0]: its top-2 is {0, 1}. Token 1's teacher top-2 is {1, 2}:
    only id 1 is compared, id 2 joins the tail. Token 2's teacher top-2 is {2, 3}: no common id, KL 0."""
    batch, logits = build_packed_batch([2], prompt_lengths=[1], vocab=4)
    with torch.no_grad():
        logits[0, :] = torch.tensor([3.0, 2.0, 1.0, 0.0], dtype=logits.dtype)
    t1, t2 = [math.log(0.5), math.log(0.3)], [math.log(0.6), math.log(0.2)]
    batch["teacher_topk_log_probs"] = [torch.tensor([t1, t2], dtype=torch.float64)]
    batch["teacher_topk_indices"] = [torch.tensor([[1, 2], [2, 3]])]
    p = torch.softmax(torch.tensor([3.0, 2.0, 1.0, 0.0], dtype=torch.float64), -1).tolist()
    kl_token1 = p[1] * math.log(p[1] / 0.5) + (1 - p[1]) * math.log((1 - p[1]) / 0.5)
    loss, metrics = _run(batch, logits, temperature=1.0, entropy_coef=0.0, subset="overlap")
    assert metrics["kl_loss"].item() == pytest.approx(kl_token1 / 2, rel=1e-12)
    assert metrics["distill_subset_size"].item() == pytest.approx(0.5)  # 1 id, then 0, over 2 tokens
    loss.backward()
    assert logits.grad[0, 1].abs().sum() == 0  # the token with no common id pulls nothing
    teacher_kl = _run(batch, logits.detach().clone().requires_grad_(), temperature=1.0, entropy_coef=0.0)[1]
    assert teacher_kl["distill_subset_size"].item() == pytest.approx(2.0)


def test_a_subset_the_loss_cannot_compute_is_refused() -> None:
    batch, logits = _topk_batch([2])
    with pytest.raises(ValueError, match="openclaw_opd_distill_subset"):
        _run(batch, logits, subset="students")


def test_gradcheck_topk_loss_with_entropy() -> None:
    batch, logits = _topk_batch([2, 3], vocab=5)
    args = default_args(rollout_temperature=0.8, entropy_coef=0.1)
    reducer = make_sum_of_sample_mean(batch["response_lengths"], batch["loss_masks"])
    assert torch.autograd.gradcheck(lambda x: topk_distillation_loss_function(args, batch, x, reducer)[0],
                                    (logits,))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_topk_mass_near_one_stays_finite(dtype: torch.dtype) -> None:
    batch, logits = build_packed_batch([2], prompt_lengths=[1], vocab=4, dtype=dtype)
    with torch.no_grad():
        logits[0, :, 3] = -40.0  # the student's top-3 hold 1 - 1e-18 of its mass: rounds to exactly 1
    batch["teacher_topk_indices"] = [torch.tensor([[0, 1, 2], [2, 1, 0]])]
    near_one = [math.log(0.6), math.log(0.3), math.log(0.1 - 1e-9)]
    batch["teacher_topk_log_probs"] = [torch.tensor([near_one, near_one], dtype=torch.float64)]
    loss, metrics = _run(batch, logits, temperature=1.0)
    loss.backward()
    assert all(torch.isfinite(v) for v in metrics.values()) and torch.isfinite(logits.grad).all()
    if dtype == torch.float64:
        _assert_matches_python(batch, logits.detach().clone().requires_grad_(), temperature=1.0)


def test_minus_inf_teacher_entries_fold_into_the_tail_without_nan() -> None:
    batch, logits = _topk_batch([3], vocab=6)
    lp = batch["teacher_topk_log_probs"][0].double()
    lp[0, 1] = -math.inf
    lp[1, :] = -math.inf  # a row with no teacher mass in its top-K: KL of all-tail vs all-tail
    batch["teacher_topk_log_probs"] = [lp]
    metrics = _assert_matches_python(batch, logits)
    assert metrics["teacher_invalid_frac"].item() == 0.0


def test_rows_that_are_not_distributions_are_dropped_and_counted() -> None:
    """Upstream bug 7: zero-padded teacher rows claim mass K; NaN rows must not poison the batch."""
    batch, logits = _topk_batch([4], vocab=6)
    lp = batch["teacher_topk_log_probs"][0].double()
    lp[0] = 0.0
    lp[2, 0] = math.nan
    batch["teacher_topk_log_probs"] = [lp]
    metrics = _assert_matches_python(batch, logits)
    assert metrics["teacher_invalid_frac"].item() == pytest.approx(0.5)


def test_out_of_range_teacher_ids_are_treated_as_missing_bins() -> None:
    batch, logits = _topk_batch([2], vocab=6)
    batch["teacher_topk_indices"][0][0, 0] = -1
    batch["teacher_topk_indices"][0][1, 2] = 6 + 3
    _assert_matches_python(batch, logits)


def test_empty_samples_and_an_all_empty_micro_batch() -> None:
    batch, logits = _topk_batch([2, 0, 3])
    _assert_matches_python(batch, logits)
    empty, empty_logits = _topk_batch([0, 0])
    loss, metrics = _run(empty, empty_logits)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(empty_logits.grad, torch.zeros_like(empty_logits))


def test_missing_teacher_topk_fields_raise() -> None:
    batch, logits = build_packed_batch([2])
    with pytest.raises(ValueError, match="distill_topk"):
        _run(batch, logits)


def test_log1mexp_is_accurate_on_both_branches_with_finite_gradients() -> None:
    xs = [-1e-12, -1e-6, -0.3, -math.log(2.0), -0.9, -5.0, -50.0]
    x = torch.tensor(xs + [-math.inf], dtype=torch.float64, requires_grad=True)
    y = log1mexp(x)
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        expected = [float((1 - decimal.Decimal(v).exp()).ln()) for v in xs] + [0.0]
    torch.testing.assert_close(y, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0.0)
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def _whole_sample_in_student_topk(logits_RV: torch.Tensor, ids_RK: torch.Tensor, k: int) -> torch.Tensor:
    """The one-pass formula ``in_student_topk`` had before it went by row chunks (one [R, V] fp32 copy)."""
    logits = logits_RV.detach().float()
    kth_R = logits.topk(min(k, logits.size(-1)), dim=-1).values[:, -1]
    return logits.gather(-1, ids_RK.clamp(0, logits.size(-1) - 1)) >= kth_R.unsqueeze(-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("chunk", [3, 1024])
def test_in_student_topk_by_row_chunks_is_the_whole_sample_answer(dtype: torch.dtype, chunk: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Row chunks (a ragged last one included) change no answer, ties at the k-th value included: integer
    logits in a narrow range make many ties."""
    monkeypatch.setattr(opd_loss, "ENTROPY_CHUNK_ROWS", chunk)
    gen = torch.Generator().manual_seed(chunk)
    rows = 2 * chunk + chunk // 2 + 1
    logits_RV = torch.randint(-4, 5, (rows, 40), generator=gen).to(dtype)
    for k in (1, 4, 40):
        ids_RK = torch.randint(-2, 42, (rows, k), generator=gen)  # out-of-range ids too (clamped, as before)
        assert torch.equal(opd_loss.in_student_topk(logits_RV, ids_RK, k),
                           _whole_sample_in_student_topk(logits_RV, ids_RK, k))


def test_in_student_topk_copies_one_row_chunk_to_fp32_not_the_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 logits are ranked in fp32: nothing it allocates is larger than one [chunk, V] block (a 4096 x 32K
    bf16 sample on CPU: +512 MiB at the peak whole, +128 MiB in 1024-row chunks). Fails on the whole-sample
    copy ([R, V])."""
    monkeypatch.setattr(opd_loss, "ENTROPY_CHUNK_ROWS", 4)
    rows, vocab = 64, 1000
    logits_RV = torch.randn(rows, vocab).to(torch.bfloat16)
    with AllocationProbe() as probe:
        opd_loss.in_student_topk(logits_RV, torch.randint(0, vocab, (rows, 8)), 8)
    assert probe.larger_than(4 * vocab) == []
    assert ("aten._to_copy.default", 4 * vocab) in probe.allocations  # the fp32 copy, one chunk of it
