"""The detached entropy (entropy_coef == 0) in row chunks: equal to the whole-response one, and never a
temporary larger than ``ENTROPY_CHUNK_ROWS x V`` (single device, and vocab-parallel at TP 2 on gloo); and
the sampled-token log-prob keeps one [R, V] tensor for backward, no more.

The size probe is a ``TorchDispatchMode`` that records the element count of every tensor an ATen op
allocates (views and in-place results excluded): CPU has no ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from loss_test_support import AllocationProbe

from openclaw_rl.losses import logprobs
from openclaw_rl.losses.logprobs import log_probs_and_entropy, token_log_probs
from openclaw_rl.losses.policy_math import entropy_from_logits

CHUNK = 4  # the tests shrink ENTROPY_CHUNK_ROWS so that R below, at and above it stay cheap
ROWS = (0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 3)


def saved_for_backward(fn: Any) -> set[tuple[int, int]]:
    """(storage pointer, numel) of every distinct tensor autograd saves while ``fn`` runs."""
    saved: set[tuple[int, int]] = set()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.add((tensor.untyped_storage().data_ptr(), tensor.numel()))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    return saved


def _logits(rows: int, vocab: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    logits_RV = 4 * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    if rows > 1:
        logits_RV[1, 2] = float("-inf")  # a masked vocabulary entry adds 0, not NaN
    return logits_RV


@pytest.fixture()
def small_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logprobs, "ENTROPY_CHUNK_ROWS", CHUNK)


@pytest.mark.parametrize("rows", ROWS)
def test_chunked_detached_entropy_equals_the_whole_response_one(small_chunk: None, rows: int) -> None:
    logits_RV = _logits(rows, 7, seed=rows).requires_grad_()
    tokens_R = torch.randint(0, 7, (rows,), generator=torch.Generator().manual_seed(1))
    log_probs_R, entropy_R = log_probs_and_entropy(logits_RV, tokens_R, entropy_grad=False)
    assert entropy_R.shape == (rows,) and not entropy_R.requires_grad
    torch.testing.assert_close(entropy_R, entropy_from_logits(logits_RV.detach()))
    _, with_grad_R = log_probs_and_entropy(logits_RV, tokens_R, entropy_grad=True)
    torch.testing.assert_close(entropy_R, with_grad_R.detach())
    torch.testing.assert_close(log_probs_R, token_log_probs(logits_RV, tokens_R))
    assert torch.isfinite(entropy_R).all()


def test_detached_entropy_at_the_real_chunk_size_and_from_bfloat16() -> None:
    rows = 2 * logprobs.ENTROPY_CHUNK_ROWS + 5
    logits_RV = _logits(rows, 3, seed=2, dtype=torch.float32).to(torch.bfloat16)
    _, entropy_R = log_probs_and_entropy(logits_RV, torch.zeros(rows, dtype=torch.long), entropy_grad=False)
    assert entropy_R.dtype == torch.float32
    torch.testing.assert_close(entropy_R, entropy_from_logits(logits_RV))


def test_detached_entropy_allocates_nothing_larger_than_a_chunk(small_chunk: None) -> None:
    """Fails if the entropy is taken over all R rows at once: its temporaries would be [R, V]."""
    rows, vocab = 3 * CHUNK + 1, 11
    logits_RV = _logits(rows, vocab, seed=3, dtype=torch.float32).requires_grad_()
    tokens_R = torch.arange(rows) % vocab
    with AllocationProbe() as log_probs_only:
        token_log_probs(logits_RV, tokens_R)
    with AllocationProbe() as with_entropy:
        log_probs_and_entropy(logits_RV, tokens_R, entropy_grad=False)
    # the log-prob path's own [R, V] log-softmax (kept for backward) and nothing else of that size
    assert log_probs_only.larger_than(CHUNK * vocab) == [("aten._log_softmax.default", rows * vocab)]
    assert with_entropy.larger_than(CHUNK * vocab) == log_probs_only.larger_than(CHUNK * vocab)
    assert max(n for _, n in with_entropy.allocations) == rows * vocab


def test_the_sampled_token_log_prob_keeps_one_rv_tensor_for_backward() -> None:
    """The log-softmax, which its gather saves too (the same tensor); the temperature copy is not kept."""
    rows, vocab = 6, 9
    logits_RV = _logits(rows, vocab, seed=5, dtype=torch.float32).requires_grad_()
    tokens_R = torch.arange(rows) % vocab
    saved = saved_for_backward(lambda: token_log_probs(logits_RV / 0.7, tokens_R))
    assert [n for _, n in saved if n > rows] == [rows * vocab]


# --- vocab-parallel (TP 2 on gloo) ------------------------------------------------------------------------

TP, VOCAB = 2, 10


def _tp_worker(rank: int, init_file: str) -> None:
    torch.set_num_threads(1)
    logprobs.ENTROPY_CHUNK_ROWS = CHUNK  # a forked process: the parent's module is untouched
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=TP)
    try:
        group = dist.group.WORLD
        width = VOCAB // TP
        real_all_reduce = dist.all_reduce
        reduces: list[int] = []

        def counting_all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            reduces.append(tensor.numel())
            return real_all_reduce(tensor, *args, **kwargs)

        for rows in ROWS:
            for dtype in (torch.float64, torch.bfloat16):
                full_RV = _logits(rows, VOCAB, seed=rows, dtype=torch.float64).to(dtype)
                tokens_R = torch.randint(0, VOCAB, (rows,), generator=torch.Generator().manual_seed(4))
                shard_RV = full_RV[:, rank * width : (rank + 1) * width].clone().requires_grad_()
                want_R = entropy_from_logits(full_RV)
                log_probs_R, entropy_R = log_probs_and_entropy(shard_RV, tokens_R, entropy_grad=False, tp_group=group)
                assert not entropy_R.requires_grad and log_probs_R.requires_grad
                torch.testing.assert_close(entropy_R, want_R)
                _, with_grad_R = log_probs_and_entropy(shard_RV, tokens_R, entropy_grad=True, tp_group=group)
                torch.testing.assert_close(entropy_R, with_grad_R.detach())

            shard_RV = _logits(rows, VOCAB, seed=rows, dtype=torch.float32)[:, rank * width : (rank + 1) * width]
            shard_RV.requires_grad_()
            # the log-prob keeps one [R, V_local] tensor for backward (the exponential), not the shifted shard too
            saved = saved_for_backward(lambda: token_log_probs(shard_RV / 0.7, tokens_R, tp_group=group))  # noqa: B023
            assert sorted(n for _, n in saved if n >= max(rows, 1) * width) == ([rows * width] if rows else []), saved
            probes, counts = [], []
            dist.all_reduce = counting_all_reduce
            try:
                for with_entropy in (False, True):
                    reduces.clear()
                    with AllocationProbe() as probe:
                        if with_entropy:
                            log_probs_and_entropy(shard_RV, tokens_R, entropy_grad=False, tp_group=group)
                        else:
                            token_log_probs(shard_RV, tokens_R, tp_group=group)
                    probes.append(probe)
                    counts.append(list(reduces))
            finally:
                dist.all_reduce = real_all_reduce
            # the detached entropy adds two all-reduces, one per quantity (Z and W stacked), not one per chunk
            assert counts[1] == counts[0] + [rows, 2 * rows], counts
            # and no temporary beyond a chunk of the shard (or the [2, R] sums) besides the log-prob path's own
            limit = max(CHUNK * width, 2 * rows)
            assert probes[1].larger_than(limit) == probes[0].larger_than(limit), probes[1].larger_than(limit)
    finally:
        dist.destroy_process_group()


def test_vocab_parallel_detached_entropy_is_chunked_and_equals_the_unsharded_one(tmp_path) -> None:  # noqa: ANN001
    torch_mp.start_processes(_tp_worker, args=(str(tmp_path / "gloo_init"),), nprocs=TP, start_method="fork")
