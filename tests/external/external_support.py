"""Helpers shared by the external-engine tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def engine_for(model_dir: Path, tokenizer: Any) -> Iterator[Any]:
    """The embedded engine serving ``model_dir`` on loopback; ``.core`` is its model (weights, version)."""
    from openclaw_rl.engine.app import make_engine_app
    from openclaw_rl.engine.torch_core import TorchModel
    from openclaw_rl.servers import BackgroundServer

    core = TorchModel.from_pretrained(str(model_dir), seed=0)
    app = make_engine_app(core, tokenizer, served_model_name="tiny", model_path=str(model_dir))
    try:
        with BackgroundServer(app) as server:
            server.core = core
            yield server
    finally:
        core.close()


def train_settings(policy_url: str, judge_url: str, out: Path, **values: Any) -> Any:
    """Proxy settings as ``openclaw-rl train --mode rl --pause-mode hold`` builds them."""
    from openclaw_rl.config import load_settings

    return load_settings({"mode": "rl", "proxy_policy_url": policy_url, "judge_url": judge_url, "judge_votes": 1,
                          "judge_max_new_tokens": 128, "proxy_port": 0, "proxy_pause_mode": "hold",
                          "proxy_served_model_name": "tiny", "proxy_max_new_tokens": 32,
                          "proxy_session_ttl_s": 120, "spool_dir": str(out / "spool"), **values}, env={})


def tiny_qwen3_checkpoint(out: Path, tokenizer: Any, *, tie: bool = False, seed: int = 0) -> Path:
    """A Qwen3ForCausalLM with Qwen3-0.6B's layout (q/k norms, GQA, SwiGLU) at toy size, built offline."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         tie_word_embeddings=tie, bos_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def sample_over_http(url: str, tokenizer: Any, n: int = 4, max_new_tokens: int = 8) -> list[Any]:
    """Rollouts the way the proxy gets them: /generate with input_ids, output log-probs and the version."""
    import httpx

    from openclaw_rl.samples import TrainingSample

    samples = []
    for i in range(n):
        prompt = tokenizer.encode(f"<|im_start|>user\nquestion {i} please<|im_end|>\n<|im_start|>assistant\n")
        body = {"input_ids": prompt, "return_logprob": True, "sampling_params": {
            "temperature": 1.0, "max_new_tokens": max_new_tokens, "ignore_eos": True, "sampling_seed": i}}
        data = httpx.post(f"{url}/generate", json=body, timeout=60).json()
        meta = data["meta_info"]
        samples.append(TrainingSample(session_id=f"s{i}", turn=1, kind="rl", prompt_ids=prompt,
                                      response_ids=data["output_ids"],
                                      rollout_log_probs=[t[0] for t in meta["output_token_logprobs"]],
                                      loss_mask=[1] * len(data["output_ids"]), reward=(-1.0) ** i,
                                      metadata={"weight_version": meta["weight_version"]}))
    return samples


def score(model: Any, samples: list[Any]) -> list[Any]:
    """Per-sample response log-probs of ``samples`` under ``model`` (the trainer's own computation)."""

    from openclaw_rl.embedded.trainer import TrainerConfig, build_batch, sequence_logprobs

    batch = build_batch(samples)
    was_training = model.training
    model.eval()
    out = sequence_logprobs(model, batch, TrainerConfig().slime_args())
    model.train(was_training)
    return out


def max_gap(a: list[Any], b: list[Any]) -> float:
    import torch

    return max((torch.as_tensor(x) - torch.as_tensor(y)).abs().max().item() for x, y in zip(a, b))


def step_and_sync(url: str, model: Any, tokenizer: Any, sync_dir: Path) -> dict[str, Any]:
    """One trainer step on rollouts from the server at ``url``, a sync into it, fresh rollouts after it.

    Returns the step's metrics and three gaps over the fresh rollouts: the server's rollout log-probs vs
    the trained model (``synced``: small when the server serves exactly the synced weights), and the
    trained vs the initial model (``moved``: how far the step moved, so ``synced`` means something).
    """
    from openclaw_rl.embedded.trainer import EmbeddedTrainer, TrainerConfig
    from openclaw_rl.embedded.weight_sync import SGLangWeightSync

    weights = SGLangWeightSync(url, sync_dir)
    try:
        trainer = EmbeddedTrainer(TrainerConfig(lr=1e-2), model, sync=lambda _sd, v: weights.sync(model, v))
        result = trainer.train(sample_over_http(url, tokenizer))
        trainer.sync()
        fresh = sample_over_http(url, tokenizer)
        ours = score(model, fresh)
        return {"metrics": result.metrics, "version": weights.server_version(), "fresh": fresh, "ours": ours,
                "fresh_versions": {s.metadata["weight_version"] for s in fresh},
                "synced": max_gap(ours, [s.rollout_log_probs for s in fresh]),
                "moved": max_gap(ours, score(trainer.served["default"], fresh))}
    finally:
        weights.close()
