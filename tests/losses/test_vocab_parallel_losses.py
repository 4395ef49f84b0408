"""Every loss under Megatron-style tensor parallelism (TP = 2, two gloo ranks on CPU) equals the unsharded one.

Each rank holds half of the vocabulary of the same logits, as Megatron's vocab-parallel output layer
does. The TP group is found the way a Slime run finds it, through Megatron's ``parallel_state``;
here a stand-in with the same three methods answers for it (Megatron itself is exercised by
``tests/slime_plugins/test_slime_cpu.py`` when a checkout is available). Losses, metrics and the
gradient of each shard must match the single-device computation on the full vocabulary.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from loss_test_support import build_packed_batch, default_args

from openclaw_combine.loss import combine_loss_function
from openclaw_combine.topk_select import topk_select_loss_function
from openclaw_opd.loss import topk_distillation_loss_function
from openclaw_rl.losses import logprobs
from openclaw_rl.losses.policy_loss import policy_loss_function
from openclaw_rl.losses.policy_math import make_sum_of_sample_mean

TP, VOCAB, K = 2, 10, 3
RESPONSES = [3, 0, 4]


def _batch() -> tuple[dict[str, Any], torch.Tensor]:
    batch, logits = build_packed_batch(RESPONSES, vocab=VOCAB, seed=11)
    generator = torch.Generator().manual_seed(12)
    batch["advantages"] = [torch.randn(r, generator=generator) for r in RESPONSES]
    batch["log_probs"] = [-torch.rand(r, generator=generator) for r in RESPONSES]
    batch["rollout_log_probs"] = [-torch.rand(r, generator=generator) for r in RESPONSES]
    batch["teacher_log_probs"] = [-torch.rand(r, generator=generator) for r in RESPONSES]
    batch["teacher_topk_log_probs"] = [torch.log_softmax(torch.randn(r, K + 2, generator=generator), -1)[:, :K]
                                       for r in RESPONSES]
    batch["teacher_topk_indices"] = [torch.stack([torch.randperm(VOCAB, generator=generator)[:K] for _ in range(r)])
                                     if r else torch.zeros(0, K, dtype=torch.long) for r in RESPONSES]
    return batch, logits.detach()


LOSSES = {
    "ppo": (policy_loss_function, {"entropy_coef": 0.01}),
    "combine": (combine_loss_function, {"openclaw_combine_w_rl": 0.5, "openclaw_combine_w_opd": 2.0}),
    "topk": (topk_distillation_loss_function, {"entropy_coef": 0.01}),
    "topk_overlap": (topk_distillation_loss_function, {"entropy_coef": 0.01, "openclaw_opd_distill_subset": "overlap"}),
    "topk_select": (topk_select_loss_function, {"openclaw_combine_w_rl": 0.5, "openclaw_combine_w_opd": 2.0,
                                                "openclaw_opd_distill_subset": "overlap"}),
}


def _run(name: str, logits_full: torch.Tensor, shard: slice | None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    fn, overrides = LOSSES[name]
    batch, _ = _batch()
    leaf = (logits_full[..., shard] if shard is not None else logits_full).clone().requires_grad_()
    reducer = make_sum_of_sample_mean(batch["response_lengths"], batch["loss_masks"])
    loss, metrics = fn(default_args(**overrides), batch, leaf, reducer)
    loss.backward()
    return {k: v.detach() for k, v in metrics.items()}, leaf.grad


def _worker(rank: int, init_file: str, results: Any) -> None:
    torch.set_num_threads(1)
    _, logits = _batch()
    wanted = {name: _run(name, logits, None) for name in LOSSES}  # full vocabulary, no TP group yet
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=TP)
    try:
        group = dist.group.WORLD
        logprobs._megatron_parallel_state = lambda: SimpleNamespace(  # what Megatron's parallel_state answers
            get_tensor_model_parallel_group=lambda: group,
            get_context_parallel_world_size=lambda: 1,
        )
        assert logprobs.active_tp_group() is group
        width = VOCAB // TP
        shard = slice(rank * width, (rank + 1) * width)
        for name in LOSSES:
            got_metrics, got_grad = _run(name, logits, shard)
            want_metrics, want_grad = wanted[name]
            assert got_metrics.keys() == want_metrics.keys(), name
            for key, value in want_metrics.items():
                torch.testing.assert_close(got_metrics[key], value, msg=f"{name}/{key}")
            torch.testing.assert_close(got_grad, want_grad[..., shard], msg=f"{name} gradient")
            assert got_grad.abs().sum() > 0, name
        results[rank] = "ok"
    finally:
        dist.destroy_process_group()


def test_ppo_combine_and_topk_losses_at_tp2_equal_the_unsharded_losses(tmp_path) -> None:  # noqa: ANN001
    manager = torch_mp.Manager()
    results = manager.dict()
    torch_mp.start_processes(_worker, args=(str(tmp_path / "gloo_init"), results), nprocs=TP, start_method="fork")
    assert dict(results) == {0: "ok", 1: "ok"}
