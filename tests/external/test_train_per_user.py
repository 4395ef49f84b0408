"""``train --per-user-adapters`` against an SGLang-compatible engine over HTTP: adapters published with
``/load_lora_adapter`` under versioned names, chosen per request by the proxy, fidelity at the floor."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from external_support import train_settings

from openclaw_rl.embedded.external import ExternalConfig, run_train
from openclaw_rl.embedded.hf_policy import PolicyLoadConfig
from openclaw_rl.engine.adapters import lora_config
from openclaw_rl.errors import CommandError
from openclaw_rl.users.adapters import adapter_name


def test_train_publishes_each_users_adapter_by_name_and_the_engine_serves_it(policy_engine, rule_judge,
                                                                              tiny_model_dir, tmp_path):
    policy_engine.core.enable_lora(lora_config())  # SGLang's --enable-lora --max-lora-rank 8
    settings = train_settings(policy_engine.url, rule_judge.url, tmp_path, proxy_per_user_adapters=True)
    cfg = ExternalConfig(model=str(tiny_model_dir), settings=settings,
                         policy=PolicyLoadConfig(device="cpu", dtype="float32"), out_dir=str(tmp_path / "run"),
                         rollout_batch_size=4, lr=5e-3, max_steps=3, simulate_interactions=80,
                         simulate_concurrency=4, max_new_tokens=24, per_user_adapters=True)
    report = run_train(cfg, echo=False)
    assert report.steps == 3
    name = adapter_name("default")  # the simulated users send no key: one user, "default"
    assert policy_engine.core.adapter_names() == [f"{name}_step_3"]  # older versions were unloaded
    assert httpx.get(f"{policy_engine.url}/model_info").json()["weight_version"] == "default"  # base untouched
    rows = [json.loads(line) for line in Path(report.metrics_path).read_text().splitlines()]
    scored = [r for r in rows if r.get("train/rollout_fidelity_samples")]
    assert scored and max(r["train/rollout_fidelity_abs_diff"] for r in scored) < 1e-4
    assert sorted(p.name for p in (tmp_path / "run" / "weights" / "adapters" / name).iterdir()) == [f"{name}_step_3"]


def test_train_refuses_a_server_without_lora(policy_engine, rule_judge, tiny_model_dir, tmp_path):
    settings = train_settings(policy_engine.url, rule_judge.url, tmp_path, proxy_per_user_adapters=True)
    cfg = ExternalConfig(model=str(tiny_model_dir), settings=settings,
                         policy=PolicyLoadConfig(device="cpu", dtype="float32"), out_dir=str(tmp_path / "run"),
                         max_steps=1, per_user_adapters=True)
    with pytest.raises(CommandError, match="enable-lora"):
        run_train(cfg, echo=False)
