"""The trainer on a Qwen3-family checkpoint (built offline): fp32 CPU, gradient checkpointing, LoRA, and
the sync of merged LoRA weights into a separate engine over SGLang's ``/update_weights_from_disk``."""

from __future__ import annotations

import pytest
import torch
from external_support import (
    engine_for,
    max_gap,
    sample_over_http,
    score,
    step_and_sync,
    tiny_qwen3_checkpoint,
)

from openclaw_rl.embedded.hf_policy import PolicyLoadConfig, load_policy
from openclaw_rl.embedded.trainer import EmbeddedTrainer, TrainerConfig
from openclaw_rl.embedded.weight_sync import full_state_dict


def test_auto_precision():
    assert PolicyLoadConfig(device="cpu").resolved_dtype() == torch.float32
    assert PolicyLoadConfig(device="cpu", lora_rank=8).resolved_dtype() == torch.float32
    # resolved without a GPU: bf16 only where nothing full-precision is updated
    assert PolicyLoadConfig(device="cuda", lora_rank=8).resolved_dtype() == torch.bfloat16
    assert PolicyLoadConfig(device="cuda").resolved_dtype() == torch.float32
    with pytest.raises(ValueError):
        PolicyLoadConfig(dtype="int8").resolved_dtype()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_qwen3_checkpoint_trains_and_syncs_into_a_separate_engine(tmp_path, tokenizer, lora):
    ckpt = tiny_qwen3_checkpoint(tmp_path / "qwen3", tokenizer, tie=False)
    cfg = PolicyLoadConfig(device="cpu", dtype="auto", gradient_checkpointing=True, lora_rank=4 if lora else 0)
    model = load_policy(str(ckpt), cfg)
    assert next(model.parameters()).dtype == torch.float32
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
    frozen = {k: v.clone() for k, v in model.named_parameters() if not v.requires_grad}
    with engine_for(ckpt, tokenizer) as engine:
        out = step_and_sync(engine.url, model, tokenizer, tmp_path / "sync")
        theirs = score(engine.core.model, out["fresh"])  # the engine's own weights, as loaded
    # the step used rollouts of the same weights: trainer and engine agree on every sampled token
    assert out["metrics"]["train/rollout_fidelity_samples"] == 4
    assert out["metrics"]["train/rollout_fidelity_abs_diff"] < 1e-5
    assert out["metrics"]["train/grad_norm"] > 0
    assert out["version"] == "step-1" and out["fresh_versions"] == {"step-1"}
    # after the sync the engine serves exactly the trainer's (merged) weights, and the step moved them
    assert max_gap(out["ours"], theirs) < 1e-5
    assert out["synced"] < 1e-4 < 1e-2 < out["moved"], (out["synced"], out["moved"])
    if lora:
        assert frozen and all(torch.equal(v, dict(model.named_parameters())[k]) for k, v in frozen.items())
        base, state = full_state_dict(model)
        assert base is not model and set(state) == _checkpoint_keys(ckpt)  # exactly the base checkpoint keys


def _checkpoint_keys(ckpt) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        return set(f.keys())


def test_bf16_lora_keeps_fp32_adapters_and_merges_in_the_served_dtype(tmp_path, tokenizer):
    """The one-GPU LoRA layout (bf16 base, fp32 adapters), exercised on CPU."""
    ckpt = tiny_qwen3_checkpoint(tmp_path / "qwen3", tokenizer, tie=True)
    model = load_policy(str(ckpt), PolicyLoadConfig(device="cpu", dtype="bfloat16", lora_rank=4))
    lora = {k: v for k, v in model.named_parameters() if v.requires_grad}
    assert lora and all("lora_" in k and v.dtype == torch.float32 for k, v in lora.items())
    assert all(v.dtype == torch.bfloat16 for k, v in model.named_parameters() if not v.requires_grad)
    with engine_for(ckpt, tokenizer) as engine:
        samples = sample_over_http(engine.url, tokenizer)
    trainer = EmbeddedTrainer(TrainerConfig(lr=1e-2, fidelity_copies=0), model, sync=lambda _sd, _v: None)
    before = {k: v.detach().clone() for k, v in lora.items()}
    result = trainer.train(samples)
    assert result.metrics["train/grad_norm"] > 0
    assert any(not torch.equal(before[k], v) for k, v in lora.items())
    _, state = full_state_dict(model)
    assert set(state) - {"lm_head.weight"} == _checkpoint_keys(ckpt) - {"lm_head.weight"}  # tied: may be left out
    assert {t.dtype for t in state.values()} == {torch.bfloat16}
