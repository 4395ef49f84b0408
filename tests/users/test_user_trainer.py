"""One adapter per user: isolation, publishing, fidelity against the engine, checkpoints (``user_trainer.py``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from openclaw_rl.embedded.trainer import TrainerConfig
from openclaw_rl.embedded.user_trainer import PerUserTrainer
from openclaw_rl.engine.adapters import lora_config
from openclaw_rl.engine.model import SamplingConfig
from openclaw_rl.engine.torch_core import TorchModel
from openclaw_rl.samples import TrainingSample
from openclaw_rl.users.adapters import AdapterDirectory, adapter_name


@pytest.fixture
def stack(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    core = TorchModel.from_pretrained(str(tiny_model_dir), seed=0)
    core.enable_lora(lora_config())
    yield tok, core, AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    core.close()


def samples_of(tok: Any, core: TorchModel, user: str, n: int = 2, reward: float = 1.0,
               adapter: str | None = None) -> list[TrainingSample]:
    """Samples the engine really sampled for `user` (its adapter when given), tagged as the proxy tags them."""
    async def one(i: int) -> TrainingSample:
        prompt = tok.encode(f"<|im_start|>user\n{user} asks {i}<|im_end|>\n<|im_start|>assistant\n")
        cfg = SamplingConfig(temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, max_new_tokens=8, seed=i,
                             adapter=adapter)
        steps = [s async for s in core.generate(prompt, cfg)]
        return TrainingSample(session_id=f"{user}-{i}", turn=1, kind="rl", prompt_ids=prompt,
                              response_ids=[s.token_id for s in steps], rollout_log_probs=[s.logprob for s in steps],
                              loss_mask=[1] * len(steps), reward=reward,
                              metadata={"user": user, "weight_version": steps[0].weight_version})

    async def all_() -> list[TrainingSample]:
        return list(await asyncio.gather(*(one(i) for i in range(n))))
    return asyncio.run(all_())


def state(trainer: PerUserTrainer, user: str) -> dict[str, torch.Tensor]:
    return trainer.adapter_state(trainer.users[user])


def test_each_users_samples_train_only_that_users_adapter(stack: Any) -> None:
    tok, core, model = stack
    published: list[tuple[str, str]] = []
    trainer = PerUserTrainer(TrainerConfig(mode="rl", lr=1e-2), model, lora_config(),
                             load_adapter=lambda name, sd, v: published.append((name, v)))
    first = trainer.train(samples_of(tok, core, "alice") + samples_of(tok, core, "bob", n=1, reward=-1.0)).metrics
    assert sorted(trainer.users) == ["alice", "bob"]
    # per step: the fewest and most samples an adapter got, and the highest of the users' entropies
    assert (first["users/samples_min"], first["users/samples_max"], first["users/trained"]) == (1, 2, 2)
    assert first["users/entropy_max"] >= first["train/entropy_loss"] > 0
    bob_before = state(trainer, "bob")
    alice_before = state(trainer, "alice")
    # crafted traffic: only alice's samples, with bob's session names in them; bob's adapter must not move
    crafted = samples_of(tok, core, "alice", n=3)
    for s in crafted:
        s.session_id = "bob-0"
    trainer.train(crafted)
    after = state(trainer, "bob")
    assert all(torch.equal(bob_before[k], after[k]) for k in after)
    assert any(not torch.equal(alice_before[k], v) for k, v in state(trainer, "alice").items())
    assert trainer.users["alice"].trainer.step == 2 and trainer.users["bob"].trainer.step == 1
    # the base model itself never changes
    assert not any(p.requires_grad for n, p in trainer.model.named_parameters() if "lora_" not in n)


def test_a_user_gets_the_base_until_their_adapter_trained_enough_then_the_proxy_picks_it(stack: Any) -> None:
    tok, core, model = stack
    directory = AdapterDirectory()
    trainer = PerUserTrainer(TrainerConfig(mode="rl", lr=1e-2), model, lora_config(), load_adapter=core.load_adapter,
                             directory=directory, min_samples=3)
    trainer.train(samples_of(tok, core, "alice", n=2))
    trainer.sync()
    assert directory.lora_for("alice") is None and core.adapter_names() == []  # 2 < 3 samples: still the base
    trainer.train(samples_of(tok, core, "alice", n=2))
    trainer.sync()
    assert directory.lora_for("alice") == adapter_name("alice") and core.adapter_names() == [adapter_name("alice")]
    assert core.adapters.versions[adapter_name("alice")] == "step-2"
    assert directory.lora_for("bob") is None


def test_trainer_and_engine_log_probs_agree_for_each_adapter(stack: Any) -> None:
    """Fidelity per adapter at the full-weight path's floor (< 1e-5 in fp32): samples the engine drew with
    each user's published adapter, scored by the trainer with that user's adapter."""
    tok, core, model = stack
    trainer = PerUserTrainer(TrainerConfig(mode="rl", lr=1e-2), model, lora_config(), load_adapter=core.load_adapter)
    first = trainer.train(samples_of(tok, core, "alice") + samples_of(tok, core, "bob", reward=-1.0)).metrics
    assert first["train/rollout_fidelity_samples"] == 4 and first["train/rollout_fidelity_abs_diff"] < 1e-5
    trainer.sync()
    names = {u: adapter_name(u) for u in ("alice", "bob")}
    fresh = samples_of(tok, core, "alice", adapter=names["alice"]) + samples_of(tok, core, "bob", adapter=names["bob"])
    assert {s.metadata["weight_version"] for s in fresh} == {"step-1"}
    m = trainer.train(fresh).metrics  # scored from each user's training forward (its adapter at step-1)
    assert m["train/rollout_fidelity_samples"] == 4
    assert m["train/rollout_fidelity_abs_diff"] < 1e-5
    # sampled by step-1 but trained after step 2: scored with the kept copy of step-1 of that user's adapter
    trainer.sync()
    late = trainer.train(fresh).metrics
    assert late["train/rollout_fidelity_samples"] == 4 and late["train/rollout_fidelity_abs_diff"] < 1e-5


def test_adapter_checkpoints_are_per_user_and_resume(stack: Any, tmp_path: Path) -> None:
    tok, core, model = stack
    cfg = TrainerConfig(mode="rl", lr=1e-2, save_every=1, ckpt_dir=str(tmp_path / "ckpt"))
    trainer = PerUserTrainer(cfg, model, lora_config(), load_adapter=lambda *a: None)
    trainer.train(samples_of(tok, core, "alice") + samples_of(tok, core, "bob"))
    trainer.train(samples_of(tok, core, "alice"))
    users = tmp_path / "ckpt" / "users"
    assert sorted(p.name for p in users.iterdir()) == sorted(adapter_name(u) for u in ("alice", "bob"))
    assert sorted(p.name for p in (users / adapter_name("alice")).iterdir()) == ["step-000001", "step-000002"]
    saved = state(trainer, "alice")
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(Path(core.model.config._name_or_path), dtype=torch.float32)
    loaded: list[str] = []
    again = PerUserTrainer(cfg, base, lora_config(), load_adapter=lambda name, sd, v: loaded.append(v))
    resumed = again.user_state("alice")
    assert resumed.trainer.step == 2 and loaded == ["step-2"]
    assert all(torch.equal(saved[k], v) for k, v in state(again, "alice").items())
