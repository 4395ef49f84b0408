"""logprobs: packed-logit slicing, fp32 log-probs, one-pass top-K gather, and the TP path on gloo."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from loss_test_support import build_packed_batch, python_log_softmax, reference_token_log_probs

from openclaw_rl.losses import logprobs
from openclaw_rl.losses.logprobs import (
    active_tp_group,
    gather_log_probs,
    iter_response_logits,
    log_probs_and_entropy,
    token_log_probs,
)


def test_response_rows_are_the_ones_that_predict_each_response_token() -> None:
    batch, logits = build_packed_batch([3, 0, 2], prompt_lengths=[2, 4, 1])
    got = list(iter_response_logits(SimpleNamespace(rollout_temperature=0.5), batch, logits))
    flat = logits.detach()[0]
    # segments: [0, 5), [5, 9), [9, 12); rows [total - R - 1, total - 1) of each segment
    torch.testing.assert_close(got[0][0], flat[1:4] / 0.5)
    torch.testing.assert_close(got[2][0], flat[9:11] / 0.5)
    assert got[1][0].shape == (0, 5) and got[1][1].numel() == 0
    for (_, tokens_R), tokens, resp in zip(got, batch["unconcat_tokens"], batch["response_lengths"], strict=True):
        assert tokens_R.tolist() == tokens.tolist()[len(tokens) - resp :]


def test_bshd_layout_uses_max_seq_len_strides() -> None:
    logits = torch.randn(2, 6, 4)
    batch = {
        "unconcat_tokens": [torch.arange(4), torch.arange(5)],
        "total_lengths": [4, 5],
        "response_lengths": [2, 3],
        "max_seq_lens": [6, 6],
    }
    args = SimpleNamespace(rollout_temperature=1.0, qkv_format="bshd")
    (first, _), (second, _) = iter_response_logits(args, batch, logits)
    torch.testing.assert_close(first, logits[0, 1:3])
    torch.testing.assert_close(second, logits[1, 1:4])


def test_a_response_without_a_prompt_token_is_rejected() -> None:
    batch, logits = build_packed_batch([2], prompt_lengths=[0])
    with pytest.raises(ValueError, match="no prompt token"):
        list(iter_response_logits(SimpleNamespace(rollout_temperature=1.0), batch, logits))


def test_token_log_probs_match_python_and_upcast_half_precision() -> None:
    batch, logits = build_packed_batch([3, 2], vocab=7, seed=3)
    expected = reference_token_log_probs(batch, logits, temperature=0.6)
    args = SimpleNamespace(rollout_temperature=0.6)
    for (logits_RV, tokens_R), want in zip(iter_response_logits(args, batch, logits), expected, strict=True):
        torch.testing.assert_close(token_log_probs(logits_RV, tokens_R), torch.tensor(want, dtype=torch.float64))
        half = token_log_probs(logits_RV.to(torch.bfloat16), tokens_R)
        assert half.dtype == torch.float32


def test_detached_entropy_keeps_no_graph_but_log_probs_do() -> None:
    logits_RV = torch.randn(3, 5, requires_grad=True)
    log_probs_R, entropy_R = log_probs_and_entropy(logits_RV, torch.tensor([0, 1, 4]), entropy_grad=False)
    assert log_probs_R.requires_grad and not entropy_R.requires_grad
    _, entropy_with_grad = log_probs_and_entropy(logits_RV, torch.tensor([0, 1, 4]), entropy_grad=True)
    torch.testing.assert_close(entropy_with_grad, entropy_R)
    assert entropy_with_grad.requires_grad


def test_topk_gather_uses_one_log_softmax_and_matches_per_column_log_probs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Upstream bug 23: K cross-entropy calls on K clones of the logits; here one pass serves all K."""
    logits_RV = torch.randn(4, 9, dtype=torch.float64)
    indices_RK = torch.tensor([[0, 3, 8], [1, 1, 2], [7, 6, 5], [4, 0, 2]])
    calls = []
    real_log_softmax = torch.log_softmax

    def counting_log_softmax(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return real_log_softmax(*args, **kwargs)

    monkeypatch.setattr(torch, "log_softmax", counting_log_softmax)
    got = gather_log_probs(logits_RV, indices_RK)
    assert len(calls) == 1
    monkeypatch.undo()
    for k in range(indices_RK.size(1)):
        torch.testing.assert_close(got[:, k], token_log_probs(logits_RV, indices_RK[:, k]))
    row = python_log_softmax(logits_RV[2].tolist())
    assert got[2].tolist() == pytest.approx([row[7], row[6], row[5]])


def test_no_tp_group_without_torch_distributed() -> None:
    assert not dist.is_initialized()
    assert active_tp_group() is None


VOCAB, TP = 8, 2


def _tp_worker(rank: int, init_file: str, logits_RV: torch.Tensor, indices_RK: torch.Tensor,
               weights_RK: torch.Tensor) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=TP)
    try:
        group = dist.group.WORLD
        assert active_tp_group(group) is group
        shard_RV = logits_RV[:, rank * VOCAB // TP : (rank + 1) * VOCAB // TP].clone().requires_grad_()
        got_RK = logprobs.gather_log_probs(shard_RV, indices_RK, tp_group=group)
        (got_RK * weights_RK).sum().backward()

        full_RV = logits_RV.clone().requires_grad_()
        want_RK = torch.log_softmax(full_RV, dim=-1).gather(-1, indices_RK)
        (want_RK * weights_RK).sum().backward()
        torch.testing.assert_close(got_RK, want_RK)
        torch.testing.assert_close(shard_RV.grad, full_RV.grad[:, rank * VOCAB // TP : (rank + 1) * VOCAB // TP])
    finally:
        dist.destroy_process_group()


def test_vocab_parallel_topk_gather_equals_the_unsharded_one_with_gradients(tmp_path) -> None:  # noqa: ANN001
    """A log-softmax over one vocab shard would be silently wrong; the sharded pass must match exactly."""
    generator = torch.Generator().manual_seed(5)
    logits_RV = 3 * torch.randn(3, VOCAB, generator=generator, dtype=torch.float64)
    indices_RK = torch.tensor([[0, 5, 7], [4, 3, 1], [6, 6, 2]])
    weights_RK = torch.randn(3, 3, generator=generator, dtype=torch.float64)
    torch_mp.start_processes(
        _tp_worker,
        args=(str(tmp_path / "gloo_init"), logits_RV, indices_RK, weights_RK),
        nprocs=TP,
        start_method="fork",
    )


def _tp_entropy_grad_worker(rank: int, init_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=TP)
    try:
        group, cols = dist.group.WORLD, slice(rank * VOCAB // TP, (rank + 1) * VOCAB // TP)
        generator = torch.Generator().manual_seed(11)
        for dtype, scale in ((torch.float32, 1.0), (torch.float32, 1e4), (torch.bfloat16, 30.0)):
            logits_RV = (scale * torch.randn(5, VOCAB, generator=generator)).to(dtype)
            logits_RV[0, VOCAB // 2 + 1 :] = float("-inf")  # masked entries; rank 1's row 0 mostly -inf
            logits_RV[3, : VOCAB // 2] = float("-inf")  # a row whose whole shard on rank 0 is -inf
            tokens_R = torch.tensor([VOCAB // 2 - 1, VOCAB // 2, 0, VOCAB - 1, VOCAB // 2])  # the shard edges
            weights_R = torch.randn(5, generator=generator)
            full_RV = logits_RV.clone().requires_grad_()
            log_probs_RV = torch.log_softmax(full_RV.float(), dim=-1)
            want_lp = log_probs_RV.gather(-1, tokens_R.unsqueeze(-1)).squeeze(-1)
            want_h = -(log_probs_RV.exp() * log_probs_RV.clamp(min=torch.finfo(torch.float32).min)).sum(-1)
            (want_lp * weights_R).sum().backward(retain_graph=True)
            want_lp_grad, full_RV.grad = full_RV.grad[:, cols].float(), None
            finite = [1, 2, 4]  # the -inf rows' entropy gradient is NaN in this reference (its clamp's backward)
            (want_h[finite] * weights_R[finite]).sum().backward()
            want_h_grad = full_RV.grad[:, cols].float()
            for entropy_grad in (False, True):
                shard_RV = logits_RV[:, cols].clone().requires_grad_()
                got_lp, got_h = log_probs_and_entropy(shard_RV, tokens_R, entropy_grad=entropy_grad, tp_group=group)
                torch.testing.assert_close(got_lp, want_lp.detach(), atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(got_h, want_h.detach(), atol=1e-3, rtol=1e-4)
                assert got_h.requires_grad == entropy_grad
                (got_lp * weights_R).sum().backward(retain_graph=True)
                torch.testing.assert_close(shard_RV.grad.float(), want_lp_grad, atol=1e-3, rtol=1e-3)
                if entropy_grad:
                    shard_RV.grad = None
                    (got_h[finite] * weights_R[finite]).sum().backward()
                    torch.testing.assert_close(shard_RV.grad.float()[finite], want_h_grad[finite], atol=1e-2, rtol=1e-2)
        empty_lp, empty_h = log_probs_and_entropy(torch.zeros(0, VOCAB // TP), torch.zeros(0, dtype=torch.long),
                                                  entropy_grad=False, tp_group=group)
        assert empty_lp.shape == empty_h.shape == (0,)
    finally:
        dist.destroy_process_group()


def test_vocab_parallel_log_probs_and_entropy_match_autograd_with_masked_entries(tmp_path) -> None:  # noqa: ANN001
    """Under TP the log-prob (picked by indexing) and the entropy (chunked and detached, or with its gradient)
    equal a full-vocabulary reference, gradients included: tokens at the shard edges, -inf entries, a row whose
    shard on one rank is all -inf, logits of 1e4, bf16, and R = 0."""
    torch_mp.start_processes(_tp_entropy_grad_worker, args=(str(tmp_path / "gloo_init"),), nprocs=TP,
                             start_method="fork")
