"""The teacher's top-K through the one teacher field today's Slime forwards, and back, bit for bit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from loss_test_support import build_packed_batch, default_args

from openclaw_opd.loss import topk_distillation_loss_function
from openclaw_rl.losses.policy_math import make_sum_of_sample_mean
from openclaw_rl.samples import TrainingSample
from openclaw_rl.slime_hooks.samples import to_slime_sample
from openclaw_rl.slime_hooks.topk import pack_teacher_topk, teacher_topk_from_batch, unpack_teacher_topk


def _slime_transport(per_sample: list[object]) -> list[torch.Tensor]:
    """What Slime does to ``teacher_log_probs`` between the rollout and the loss: tensorize as float32
    (``tensorize_rollout_data_for_training``), then ``len == response_length`` and ``.to(float32)``."""
    return [torch.as_tensor(value, dtype=torch.float32).to(dtype=torch.float32) for value in per_sample]


def _sample(response: int, k: int, seed: int) -> TrainingSample:
    generator = torch.Generator().manual_seed(seed)
    top = torch.log_softmax(torch.randn(response, 151_936 // 1000, generator=generator), -1).topk(k)
    return TrainingSample(
        session_id="s", turn=1, kind="opd", prompt_ids=[1, 2, 3], response_ids=list(range(response)),
        rollout_log_probs=[-0.5] * response, loss_mask=[1] * response, reward=0.0, index=seed,
        teacher_log_probs=(-torch.rand(response, generator=generator)).tolist(),
        teacher_topk_log_probs=top.values.tolist(), teacher_topk_indices=(top.indices * 1000 + 935).tolist(),
    )


def test_packed_rows_survive_slime_and_unpack_to_the_exact_top_k() -> None:
    samples = [_sample(4, 3, 1), _sample(0, 3, 2), _sample(2, 3, 3)]
    slime_samples = [to_slime_sample(ts) for ts in samples]
    assert [tuple(s.teacher_log_probs.shape) for s in slime_samples] == [(4, 7), (0, 1), (2, 7)]
    assert all(len(s.teacher_log_probs) == s.response_length for s in slime_samples)  # Slime's only check
    rollout_data = {"teacher_log_probs": _slime_transport([s.teacher_log_probs for s in slime_samples])}
    unpack_teacher_topk(SimpleNamespace(), 0, rollout_data)
    assert [t.dim() for t in rollout_data["teacher_log_probs"]] == [1, 1, 1]  # Slime's rollout metrics stay per-token
    log_probs, ids = teacher_topk_from_batch({"teacher_log_probs": rollout_data["teacher_log_probs"]})
    for ts, token_R, lp, idx in zip(samples, rollout_data["teacher_log_probs"], log_probs, ids, strict=True):
        assert token_R.tolist() == torch.tensor(ts.teacher_log_probs, dtype=torch.float32).tolist()
        assert lp.tolist() == torch.tensor(ts.teacher_topk_log_probs, dtype=torch.float32).reshape(-1, 3).tolist()
        assert idx.dtype == torch.long and idx.tolist() == torch.tensor(ts.teacher_topk_indices).reshape(-1, 3).tolist()


def test_the_loss_is_identical_through_the_transport_and_through_native_batch_keys() -> None:
    batch, logits = build_packed_batch([3, 2], vocab=7, seed=4)
    generator = torch.Generator().manual_seed(5)
    native_lp = [torch.log_softmax(torch.randn(r, 7, generator=generator), -1).topk(2).values for r in (3, 2)]
    native_ids = [torch.randint(0, 7, (r, 2), generator=generator) for r in (3, 2)]
    packed = [pack_teacher_topk(None, lp, ids) for lp, ids in zip(native_lp, native_ids, strict=True)]
    rollout_data = {"teacher_log_probs": _slime_transport(packed)}
    unpack_teacher_topk(SimpleNamespace(), 0, rollout_data)
    reducer = make_sum_of_sample_mean(batch["response_lengths"], batch["loss_masks"])
    args = default_args(entropy_coef=0.01)
    via_transport, _ = topk_distillation_loss_function(args, {**batch, **rollout_data}, logits, reducer)
    native = {**batch, "teacher_topk_log_probs": native_lp, "teacher_topk_indices": native_ids}
    via_keys, _ = topk_distillation_loss_function(args, native, logits, reducer)
    assert via_transport.item() == via_keys.item()


def test_ids_that_float32_cannot_hold_exactly_are_refused() -> None:
    with pytest.raises(ValueError, match="2\\*\\*24"):
        pack_teacher_topk(None, torch.zeros(1, 1), torch.tensor([[2**24 + 1]]))


def test_a_batch_without_any_top_k_is_reported_as_missing() -> None:
    assert teacher_topk_from_batch({"teacher_log_probs": [torch.zeros(2)]}) is None


def test_the_hook_called_with_args_only_leaves_natively_forwarded_top_k_alone() -> None:
    """The Slime bundled in OpenClaw-RL calls the postprocess hook as ``fn(args)`` and forwards the top-K itself."""
    ids = torch.tensor([[3, 1]])
    assert unpack_teacher_topk(SimpleNamespace()) is None
    topk = teacher_topk_from_batch({"teacher_log_probs": [torch.tensor([-0.5])],
                                    "teacher_topk_log_probs": [torch.tensor([[-0.5, -1.5]])],
                                    "teacher_topk_indices": [ids]})
    assert topk is not None and torch.equal(topk[1][0], ids)
