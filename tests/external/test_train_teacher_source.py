"""``openclaw-rl train --mode opd|oel --teacher-source trainer``: the judge gives hints only, the trainer is the teacher.

The rule judge here has no teacher model, so a teacher log-prob call to it would fail the turn: every
sample trained below was scored by the trainer's frozen teacher.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from external_support import train_settings

from openclaw_rl.embedded.external import ExternalConfig, run_train
from openclaw_rl.embedded.hf_policy import PolicyLoadConfig


@pytest.mark.parametrize("mode", ["opd", "oel"])
def test_train_with_the_teacher_in_the_trainer(policy_engine, rule_judge, tiny_model_dir, tmp_path, mode):
    """oel: the experience-augmented prompt's ids, scored by the trainer's teacher with oel.topk ids per token."""
    settings = train_settings(policy_engine.url, rule_judge.url, tmp_path, mode=mode, opd_teacher_source="trainer",
                              oel_topk=5)
    cfg = ExternalConfig(model=str(tiny_model_dir), settings=settings, policy=PolicyLoadConfig(device="cpu",
                         dtype="float32"), out_dir=str(tmp_path / "run"), rollout_batch_size=2, lr=5e-4, max_steps=1,
                         simulate_interactions=60, simulate_concurrency=4, max_new_tokens=16, fidelity_copies=0)
    report = run_train(cfg, echo=False)
    assert report.steps == 1
    row = json.loads(Path(report.metrics_path).read_text().splitlines()[0])
    assert row["train/trainer_teacher_samples"] == 2.0
    if mode == "oel":
        assert row["train/distill_subset_size"] == 5.0
