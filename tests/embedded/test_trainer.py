"""The embedded trainer: Slime-shaped batches, the shared losses, fidelity to the engine, checkpoints."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from openclaw_rl.embedded.trainer import EmbeddedTrainer, TrainerConfig, build_batch, sequence_logprobs
from openclaw_rl.engine.model import sample_tokens
from openclaw_rl.modes import MODES
from openclaw_rl.samples import TrainingSample


async def sample_from(core, prompts: list[list[int]], n_new: int = 12, temperature: float = 1.0):
    return await asyncio.gather(*(sample_tokens(core, p, n_new, temperature, i) for i, p in enumerate(prompts)))


def samples_for(tokenizer, core, mode="rl", temperature: float = 1.0) -> list[TrainingSample]:
    prompts = [tokenizer.encode(f"<|im_start|>user\nquestion {i} please<|im_end|>\n<|im_start|>assistant\n")
               for i in range(4)]
    outs = asyncio.run(sample_from(core, prompts, temperature=temperature))
    samples = []
    for i, (prompt, (ids, lps)) in enumerate(zip(prompts, outs)):
        teacher = {"teacher_log_probs": [lp - 0.5 for lp in lps]} if MODES[mode].needs_teacher else {}
        if MODES[mode].needs_teacher:  # a top-K row per token too (modes that train the top-K loss need it)
            teacher.update(teacher_topk_log_probs=[[lp - 0.5, -3.0] for lp in lps],
                           teacher_topk_indices=[[t, (t + 1) % 50] for t in ids])
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
    if MODES[mode].embedded_loss.endswith(".topk_distillation_loss_function"):  # no PPO ratio: KL to the teacher
        assert m["train/kl_loss"] > 0.0 and m["train/teacher_invalid_frac"] == 0.0
    else:
        assert m["train/train_rollout_logprob_abs_diff"] <= 1e-4  # fp32 engine vs trainer recompute
        assert m["train/ppo_kl"] == 0.0  # the old log-probs are this step's own forward (see the next test)
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


def recording(trainer: EmbeddedTrainer) -> list[torch.Tensor]:
    """Wrap the trainer's loss so that the old log-probs it is handed are kept, one tensor per sample."""
    seen: list[torch.Tensor] = []
    loss_fn = trainer.loss_fn

    def loss(args, view, logits, reducer):
        seen.extend(lp.clone() for lp in view["log_probs"])
        return loss_fn(args, view, logits, reducer)

    trainer.loss_fn = loss
    return seen


@pytest.mark.parametrize("mode", ["rl", "combine"])
def test_the_old_log_probs_from_the_training_forward_equal_a_separate_recompute(models, mode):
    """One forward per sample: its detached log-probs stand in for Slime's recompute, bit for bit."""
    tok, core, model = models
    samples = samples_for(tok, core, mode, temperature=0.7)
    before = copy.deepcopy(model).eval()
    trainer = EmbeddedTrainer(TrainerConfig(mode=mode, rollout_temperature=0.7), model, sync=lambda sd, v: None)
    assert not trainer.separate_old_pass
    seen = recording(trainer)
    trainer.train(samples)
    want = sequence_logprobs(before, build_batch(samples), trainer.args, trainer.tail)  # the same forward shape
    assert len(seen) == len(want) == 4
    for got, expected in zip(seen, want):
        assert torch.equal(got, expected)


def test_a_model_with_dropout_gets_its_old_log_probs_from_a_separate_eval_pass(models):
    tok, core, model = models
    for layer in model.model.layers:  # train mode now computes a different function than the policy
        layer.self_attn.attention_dropout = 0.5
    samples = samples_for(tok, core)
    before = copy.deepcopy(model).eval()
    trainer = EmbeddedTrainer(TrainerConfig(mode="rl"), model, sync=lambda sd, v: None)
    assert trainer.separate_old_pass
    seen = recording(trainer)
    result = trainer.train(samples)
    for got, expected in zip(seen, sequence_logprobs(before, build_batch(samples), trainer.args, trainer.tail),
                             strict=True):
        assert torch.equal(got, expected)
    assert result.metrics["train/ppo_kl"] != 0.0  # the dropout forward differs from the eval-mode old pass


def tagged(samples: list[TrainingSample], version: str) -> list[TrainingSample]:
    for s in samples:
        s.metadata["weight_version"] = version
    return samples


def test_fidelity_scores_each_sample_with_the_weights_that_sampled_it(models):
    """Samples of the weights being trained are scored from the training forward, older ones by a copy."""
    tok, core, model = models
    trainer = EmbeddedTrainer(TrainerConfig(mode="rl"), model, sync=lambda sd, v: None)
    first = tagged(samples_for(tok, core), "default")
    want = [(lp - rollout).abs().mean().item() for lp, rollout in
            zip(sequence_logprobs(trainer.served["default"], build_batch(first), trainer.args, trainer.tail),
                build_batch(first)["rollout_log_probs"])]
    m = trainer.train(first).metrics
    assert m["train/rollout_fidelity_samples"] == 4
    assert m["train/rollout_fidelity_abs_diff"] == pytest.approx(sum(want) / 4, rel=1e-6)
    assert m["train/rollout_fidelity_abs_diff"] < 1e-5  # engine and trainer agree in fp32
    trainer.sync()
    # sampled by the initial weights, trained after step 1: scored with the kept copy, not the new weights
    late = trainer.train(tagged(samples_for(tok, core), "default")).metrics
    assert late["train/rollout_fidelity_samples"] == 4 and late["train/rollout_fidelity_abs_diff"] < 1e-5
    # a step without a sync in between: the weights being trained were never served under any label
    assert trainer.serving is None
    unknown = trainer.train(tagged(samples_for(tok, core), "step-2")).metrics
    assert unknown["train/rollout_fidelity_samples"] == 0
