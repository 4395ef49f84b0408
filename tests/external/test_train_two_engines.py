"""``openclaw-rl train`` with two policy engines (``--policy-url A,B``): each step's weights reach both, and
both serve sessions. Heavy (two engines and the trainer on CPU, tens of CPU-seconds): behind
``OPENCLAW_TEST_FULL=1``; the parts are covered cheaply by ``tests/core/test_engines.py``."""

from __future__ import annotations

import os
from contextlib import ExitStack

import httpx
import pytest
from external_support import engine_for, train_settings

from openclaw_rl.embedded.external import ExternalConfig, run_train
from openclaw_rl.embedded.hf_policy import PolicyLoadConfig


@pytest.mark.skipif(os.environ.get("OPENCLAW_TEST_FULL") != "1",
                    reason="trains against two embedded engines (tens of CPU-seconds); OPENCLAW_TEST_FULL=1 runs it")
def test_train_syncs_every_engine_and_both_serve(rule_judge, tiny_model_dir, tokenizer, tmp_path):
    with ExitStack() as stack:
        a, b = (stack.enter_context(engine_for(tiny_model_dir, tokenizer)) for _ in range(2))
        served = {a.url: 0, b.url: 0}
        for server in (a, b):
            generate = server.core.generate

            def counted(prompt_ids, sampling, url=server.url, generate=generate):
                served[url] += 1
                return generate(prompt_ids, sampling)
            server.core.generate = counted
        cfg = ExternalConfig(model=str(tiny_model_dir),
                             settings=train_settings(f"{a.url},{b.url}", rule_judge.url, tmp_path),
                             policy=PolicyLoadConfig(device="cpu", dtype="float32"), out_dir=str(tmp_path / "run"),
                             rollout_batch_size=6, lr=5e-4, max_steps=2, simulate_interactions=80,
                             simulate_concurrency=4, max_new_tokens=24)
        report = run_train(cfg, echo=False)
        assert report.steps == 2
        assert report.versions == ["step-1", "step-2"]  # both engines agreed after each sync
        for server in (a, b):
            assert httpx.get(f"{server.url}/model_info").json()["weight_version"] == "step-2"
        assert all(served.values()), served  # sessions were spread over both engines
        # samples from either engine re-score with the trainer's copy of the weights they report: both
        # engines served exactly what the trainer synced
        assert report.fidelity and max(report.fidelity) < 1e-4, report.fidelity
        assert sorted(p.name for p in (tmp_path / "run" / "weights").iterdir()) == ["step-2"]
