"""The embedded trainer: Slime-shaped batches, the shared losses, fidelity to the engine, checkpoints."""

from __future__ import annotations

import asyncio

import pytest
import torch

from openclaw_rl.embedded.trainer import EmbeddedTrainer, TrainerConfig, build_batch
from openclaw_rl.engine.model import SamplingConfig
from openclaw_rl.modes import MODES
from openclaw_rl.samples import TrainingSample


async def sample_from(core, prompts: list[list[int]], n_new: int = 12, temperature: float = 1.0):
    async def one(prompt, seed):
        ids, lps = [], []
        cfg = SamplingConfig(temperature=temperature, top_p=1.0, top_k=-1, min_p=0.0, max_new_tokens=n_new, seed=seed)
        async for step in core.generate(prompt, cfg):
            ids.append(step.token_id)
            lps.append(step.logprob)
            if len(ids) == n_new:
                break
        return ids, lps
    return await asyncio.gather(*(one(p, i) for i, p in enumerate(prompts)))


def samples_for(tokenizer, core, mode="rl", temperature: float = 1.0) -> list[TrainingSample]:
    prompts = [tokenizer.encode(f"<|im_start|>user\nquestion {i} please<|im_end|>\n<|im_start|>assistant\n")
               for i in range(4)]
    outs = asyncio.run(sample_from(core, prompts, temperature=temperature))
    samples = []
    for i, (prompt, (ids, lps)) in enumerate(zip(prompts, outs)):
        teacher = {"teacher_log_probs": [lp - 0.5 for lp in lps]} if MODES[mode].needs_teacher else {}
        samples.append(TrainingSample(session_id=f"s{i}", turn=1, kind=mode, prompt_ids=prompt, response_ids=ids,
                                      rollout_log_probs=lps, loss_mask=[1] * len(ids), reward=(-1.0) ** i, **teacher))
    return samples


@pytest.fixture
def models(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from openclaw_rl.engine.torch_core import TorchModel

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    core = TorchModel.from_pretrained(str(tiny_model_dir), seed=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    yield tok, core, model
    core.close()


@pytest.mark.parametrize("mode", list(MODES))
def test_a_step_trains_with_the_mode_loss_and_matches_rollout_log_probs(models, mode, tmp_path):
    tok, core, model = models
    synced = []
    trainer = EmbeddedTrainer(TrainerConfig(mode=mode, rollout_temperature=0.7), model,
                              sync=lambda sd, v: synced.append(v), tokenizer=tok)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = trainer.train(samples_for(tok, core, mode, temperature=0.7))
    m = result.metrics
    assert m["train/train_rollout_logprob_abs_diff"] <= 1e-4  # fp32 engine vs trainer recompute
    assert abs(m["train/ppo_kl"]) < 1e-5  # the old log-probs are recomputed with the same weights
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    trainer.sync()
    assert synced == ["step-1"]


def test_batch_is_what_slime_builds():
    s = [TrainingSample(session_id="a", turn=1, kind="rl", prompt_ids=[1, 2, 3], response_ids=[4, 5],
                        rollout_log_probs=[-0.1, -0.2], loss_mask=[1, 0], reward=-1.0)]
    b = build_batch(s)
    assert b["total_lengths"] == [5] and b["response_lengths"] == [2]
    torch.testing.assert_close(b["advantages"][0], torch.tensor([-1.0, -1.0]))
    assert b["loss_masks"][0].tolist() == [1, 0] and "teacher_log_probs" not in b


def test_checkpoint_and_resume(models, tmp_path):
    tok, core, model = models
    cfg = TrainerConfig(mode="rl", save_every=1, ckpt_dir=str(tmp_path / "ckpt"))
    trainer = EmbeddedTrainer(cfg, model, sync=lambda sd, v: None, tokenizer=tok)
    trainer.train(samples_for(tok, core))
    assert trainer.latest_checkpoint().name == "step-000001"
    from transformers import AutoModelForCausalLM

    fresh = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "step-000001", dtype=torch.float32)
    resumed = EmbeddedTrainer(cfg, fresh, sync=lambda sd, v: None)
    assert resumed.step == 1
    for k, v in model.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[k], v)
