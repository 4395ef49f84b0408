"""``openclaw-rl train`` against a separate SGLang-compatible server: weights go over HTTP, versioned."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from external_support import train_settings
from support import wait_until
from token_gate import GatedModel, TokenGate

from openclaw_rl.embedded.external import ExternalConfig, run_train
from openclaw_rl.embedded.hf_policy import PolicyLoadConfig
from openclaw_rl.embedded.staleness import admit, version_step
from openclaw_rl.samples import TrainingSample


def test_train_syncs_versioned_weights_into_the_external_engine(policy_engine, rule_judge, tiny_model_dir, tmp_path):
    initial = {k: v.clone() for k, v in policy_engine.core.model.state_dict().items()}
    cfg = ExternalConfig(model=str(tiny_model_dir), settings=train_settings(policy_engine.url, rule_judge.url, tmp_path),
                         policy=PolicyLoadConfig(device="cpu", dtype="float32"), out_dir=str(tmp_path / "run"),
                         rollout_batch_size=6, lr=5e-4, max_steps=3, simulate_interactions=120,
                         simulate_concurrency=4, max_new_tokens=24)
    report = run_train(cfg, echo=False)

    assert report.steps == 3
    assert report.versions == ["step-1", "step-2", "step-3"]  # what the server reported after each sync
    info = httpx.get(f"{policy_engine.url}/get_model_info").json()
    assert info["weight_version"] == "step-3"
    served = policy_engine.core.model.state_dict()
    assert any(not torch.equal(initial[k], served[k]) for k in initial), "the engine still serves the initial weights"
    # Each sample is re-scored with the trainer's copy of the weights whose label the engine reported
    # while sampling it: a tiny gap proves the engine served exactly what the trainer synced.
    assert report.fidelity and max(report.fidelity) < 1e-4, report.fidelity
    rows = [json.loads(line) for line in Path(report.metrics_path).read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["train/staleness_max"] <= cfg.max_staleness for r in rows)
    # batch 2 was sampled by the initial weights while step 1 trained; batch 3 by the step-1 weights the
    # engine loaded over HTTP, and its fidelity (above) is what shows that load was exact
    assert rows[1]["train/staleness_min"] >= 1.0
    assert rows[2]["train/staleness_min"] == 1.0 and rows[2]["train/rollout_fidelity_samples"] > 0
    assert not list((tmp_path / "run" / "weights").glob("*.tmp")), "a partial checkpoint was left behind"
    assert sorted(p.name for p in (tmp_path / "run" / "weights").iterdir()) == ["step-3"]


def test_a_refused_weight_update_is_an_error_not_a_silent_skip(policy_engine, tmp_path):
    from openclaw_rl.embedded.weight_sync import SGLangWeightSync, WeightSyncError

    sync = SGLangWeightSync(policy_engine.url, tmp_path / "w")
    bogus = tmp_path / "bogus"
    bogus.mkdir()  # a checkpoint of another shape: the engine refuses it (real SGLang would die)
    from safetensors.torch import save_file

    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, str(bogus / "model.safetensors"))
    with pytest.raises(WeightSyncError, match="refused"):
        sync.load(bogus, "step-9")
    assert sync.server_version() == "default"
    # generation was paused for the update: it must run again after the failed one
    answer = httpx.post(f"{policy_engine.url}/generate", json={"input_ids": [1, 2, 3], "sampling_params": {
        "max_new_tokens": 2}}, timeout=30)
    assert answer.status_code == 200 and answer.json()["meta_info"]["completion_tokens"] == 2
    sync.close()


@pytest.mark.parametrize("server_pauses", [True, False])
def test_the_weight_sync_pauses_generation_around_the_update(tokenizer, tmp_path, server_pauses, caplog):
    """A request admitted before the gate closed may still run when the weights go out. The sync pauses
    generation in ``retract`` mode around the update, as Slime pauses its engines: the running request
    is held, goes on with the new weights after ``/continue_generation``, and the cache is flushed. A
    server without ``/pause_generation`` is updated unpaused, with a warning: the update then waits for
    the request (SGLang's model-update lock)."""
    from openclaw_rl.embedded.weight_sync import SGLangWeightSync
    from openclaw_rl.engine import make_engine_app
    from openclaw_rl.servers import BackgroundServer

    gate = TokenGate(at=1)  # the request stops after its first token until the update has met it
    model = GatedModel(tokenizer, gate)
    engine = make_engine_app(model, tokenizer, served_model_name="tiny", model_path="/models/tiny")

    async def without_pause(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/pause_generation":
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await engine(scope, receive, send)

    with BackgroundServer(engine if server_pauses else without_pause) as server, ThreadPoolExecutor(1) as pool:
        sync = SGLangWeightSync(server.url, tmp_path / "w")
        body = {"input_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_new_tokens": 6}}
        with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=30) as stream:
            lines = stream.iter_lines()
            next(lines)
            gate.wait_held()  # a token is out and the request holds before the next one
            loading = pool.submit(sync.load, tmp_path / "ckpt", "step-1")
            # the update went through (paused) or waits for the request (unpaused): let the request go on
            wait_until(lambda: model.weight_updates or engine.service.waiting_updates or loading.done())
            gate.release()
            loading.result()
            rest = [line for line in lines if line.startswith("data: {")]
        gate.close()
        meta = json.loads(rest[-1].removeprefix("data: "))["meta_info"]
        versions = [seg["version"] for seg in meta["weight_versions"]]
        # paused: held mid-reply, then on with the new weights; unpaused: the update waited for it
        assert versions == (["default", "step-1"] if server_pauses else ["default"])
        assert meta["finish_reason"]["type"] != "abort"
        assert sync.server_version() == "step-1"
        assert ("has no /pause_generation" in caplog.text) is not server_pauses
        sync.close()


@pytest.mark.parametrize("new_names", [True, False])
def test_the_sync_asks_model_info_and_falls_back_to_get_model_info_on_older_sglang(tokenizer, tmp_path, new_names):
    """SGLang 0.5.23 logs /get_model_info (and /get_server_info) as deprecated at every call: the sync asks
    /model_info, and only a server that answers it 404 (older SGLang) the old name, from then on directly."""
    from openclaw_rl.embedded.weight_sync import SGLangWeightSync
    from openclaw_rl.engine import ScriptedModel, make_engine_app
    from openclaw_rl.servers import BackgroundServer

    engine = make_engine_app(ScriptedModel(tokenizer), tokenizer, served_model_name="tiny", model_path="/models/tiny")
    asked = []

    async def sglang(scope, receive, send):
        if scope["type"] == "http":
            asked.append(scope["path"])
            if scope["path"].startswith("/get_" if new_names else ("/model_info", "/server_info")):
                await send({"type": "http.response.start", "status": 404, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
        await engine(scope, receive, send)

    with BackgroundServer(sglang) as server:
        sync = SGLangWeightSync(server.url, tmp_path / "w")
        assert sync.server_version() == sync.server_version() == "default"
        assert sync.info("server_info")["served_model_name"] == "tiny"
        sync.close()
    assert asked == (["/model_info", "/model_info", "/server_info"] if new_names else
                     ["/model_info", "/get_model_info", "/get_model_info", "/get_server_info"])


def _sample(version: object) -> TrainingSample:
    return TrainingSample(session_id="s", turn=1, kind="rl", prompt_ids=[1, 2], response_ids=[3], rollout_log_probs=[-1.0],
                          loss_mask=[1], reward=1.0, metadata={"weight_version": version})


def test_version_labels():
    assert version_step("default") == 0
    assert version_step("step-12") == 12
    assert version_step("mixed:step-3,step-4") == 3
    assert version_step("mixed:step-3,v2") is None
    assert version_step(None) is None
    assert version_step("v2") is None


def test_samples_beyond_the_staleness_bound_are_refused_and_counted():
    batch = [_sample("step-5"), _sample("step-4"), _sample("step-2"), _sample("default"), _sample(None)]
    kept, metrics = admit(batch, step=5, max_staleness=1)
    assert [s.metadata["weight_version"] for s in kept] == ["step-5", "step-4", None]
    assert metrics["train/stale_samples_refused"] == 2
    assert metrics["train/unversioned_samples"] == 1
    assert metrics["train/staleness_max"] == 5
    kept, metrics = admit(batch, step=5, max_staleness=-1)
    assert len(kept) == 5 and metrics["train/stale_samples_refused"] == 0


def test_samples_from_a_step_the_trainer_has_not_reached_are_refused_whatever_the_bound():
    """Another run's samples (labelled step-34 while this trainer is at step 0) are no staleness at all."""
    batch = [_sample("step-34"), _sample("default"), _sample("step-1")]
    for bound in (2, -1):
        kept, metrics = admit(batch, step=0, max_staleness=bound)
        assert [s.metadata["weight_version"] for s in kept] == ["default"]
        assert metrics["train/foreign_samples_refused"] == 2 and metrics["train/stale_samples_refused"] == 0
        assert metrics["train/staleness_min"] == metrics["train/staleness_max"] == 0  # the kept one only


def test_the_trainer_takes_no_step_on_a_wholly_stale_batch(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from openclaw_rl.embedded.trainer import EmbeddedTrainer, TrainerConfig

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = EmbeddedTrainer(TrainerConfig(max_staleness=0, fidelity_copies=0), model, sync=lambda sd, v: None)
    trainer.step = 2
    result = trainer.train([_sample("step-1"), _sample("default")])
    assert result.step == 2 and result.metrics["train/stale_samples_refused"] == 2
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    result = trainer.train([_sample("step-2"), _sample("step-1")])
    assert result.step == 3 and result.metrics["train/stale_samples_refused"] == 1


def test_the_server_check_recommends_incremental_streaming_and_flags_fp16_serving(tiny_model_dir):
    from openclaw_rl.embedded.external import check_policy_server

    assert check_policy_server({"dtype": "float32", "incremental_streaming_output": True}, str(tiny_model_dir)) == []
    cumulative = check_policy_server({"dtype": "float32", "incremental_streaming_output": False}, str(tiny_model_dir))
    assert len(cumulative) == 1 and "--incremental-streaming-output" in cumulative[0]
    assert check_policy_server({"dtype": "auto"}, str(tiny_model_dir))  # a float32 checkpoint served as fp16
    assert check_policy_server({}, str(tiny_model_dir)) == []  # the embedded engine serves the checkpoint's dtype


def test_the_train_command_line_maps_onto_the_proxy_and_trainer_settings():
    from openclaw_rl.cli import build_parser, settings_from_cli
    from openclaw_rl.embedded.hf_policy import policy_config_from_cli

    ns = build_parser().parse_args(["train", "--model", "/m", "--policy-url", "http://127.0.0.1:30010",
                                    "--judge-url", "http://127.0.0.1:30020", "--pause-mode", "hold", "--lora-rank", "16",
                                    "--lora-targets", "q_proj,v_proj", "--gradient-checkpointing", "--max-staleness", "1",
                                    "--version-check-s", "0.5"])
    settings = settings_from_cli(ns)
    assert (settings.proxy.policy_url, settings.judge.url, settings.proxy.pause_mode) == (
        "http://127.0.0.1:30010", "http://127.0.0.1:30020", "hold")
    policy = policy_config_from_cli(ns)
    assert (policy.lora_rank, policy.lora_targets, policy.gradient_checkpointing) == (16, ("q_proj", "v_proj"), True)
    assert ns.max_staleness == 1 and ns.fn.__name__ == "_cmd_train" and ns.version_check_s == 0.5


def test_a_restarted_policy_engine_gets_its_weights_back_before_serving(tokenizer, tmp_path):
    """Issue #27 item 10: a policy server that restarts comes back on its launch weights ("default").
    The version guard holds the submission gate while it is away, loads the last synced weights again
    under their label when it is back, and only then reopens the gate."""
    from openclaw_rl.embedded.version_guard import VersionGuard
    from openclaw_rl.embedded.weight_sync import SGLangWeightSync
    from openclaw_rl.engine import ScriptedModel, make_engine_app
    from openclaw_rl.gate import SubmissionGate
    from openclaw_rl.servers import BackgroundServer, free_port

    port, models = free_port(), []

    def engine() -> BackgroundServer:
        models.append(ScriptedModel(tokenizer))
        return BackgroundServer(make_engine_app(models[-1], tokenizer, served_model_name="tiny",
                                                model_path="/models/tiny"), port=port)

    gate, ckpt = SubmissionGate(), tmp_path / "step-3"
    first = engine().start()
    sync = SGLangWeightSync(first.url, tmp_path / "w")
    guard = VersionGuard([sync], gate, interval_s=0)
    assert guard.check() == ["unsynced"] and gate.is_open  # never synced: its launch weights are right
    sync.load(ckpt, "step-3")
    assert guard.check() == ["ok"] and gate.is_open
    first.stop()  # the engine dies
    assert guard.check() == ["down"] and not gate.is_open  # nothing is admitted while it is away
    gate.open()  # the trainer opening the gate for its next batch does not lift the hold
    assert not gate.is_open
    with engine() as second:  # restarted, on the checkpoint it was launched from
        assert httpx.get(f"{second.url}/get_model_info").json()["weight_version"] == "default"
        assert guard.check() == ["restored"] and gate.is_open
        assert httpx.get(f"{second.url}/get_model_info").json()["weight_version"] == "step-3"
        assert models[1].model_path == str(ckpt) and models[1].weight_updates == 1
        assert guard.check() == ["ok"] and sync.restores == 1
    guard.stop()
    sync.close()


def test_train_gives_a_restarted_policy_engine_its_weights_back(policy_engine, rule_judge, tiny_model_dir, tokenizer,
                                                                   tmp_path, monkeypatch):
    """``train`` end to end: right after step 1's sync the policy engine restarts on the launch checkpoint
    (same port, ``default``). The sync returns only once train's version guard has loaded step 1 again:
    the restarted engine serves step 1's weights, never its launch weights, and nothing is refused."""
    from support import wait_until

    from openclaw_rl.embedded.weight_sync import SGLangWeightSync
    from openclaw_rl.engine.app import make_engine_app
    from openclaw_rl.engine.torch_core import TorchModel
    from openclaw_rl.servers import BackgroundServer

    original, restarted, served = SGLangWeightSync.sync, [], []

    def sync_then_restart(self: SGLangWeightSync, model: Any, version: str) -> None:
        original(self, model, version)
        if version == "step-1":
            policy_engine.stop()  # the engine dies, and comes back on the checkpoint it was launched from
            core = TorchModel.from_pretrained(str(tiny_model_dir), seed=0)
            launched = core.generate

            async def generate(prompt_ids: Any, sampling: Any) -> Any:  # the version each request starts on
                served.append(core.weight_version)
                async for step in launched(prompt_ids, sampling):
                    yield step

            core.generate = generate
            app = make_engine_app(core, tokenizer, served_model_name="tiny", model_path=str(tiny_model_dir))
            restarted.append((BackgroundServer(app, port=policy_engine.port).start(), core))
            wait_until(lambda: self.restores == 1)  # train's guard gave it step 1 back

    monkeypatch.setattr(SGLangWeightSync, "sync", sync_then_restart)
    cfg = ExternalConfig(model=str(tiny_model_dir), settings=train_settings(policy_engine.url, rule_judge.url, tmp_path),
                         policy=PolicyLoadConfig(device="cpu", dtype="float32"), out_dir=str(tmp_path / "run"),
                         rollout_batch_size=4, lr=5e-4, max_steps=3, simulate_interactions=80,
                         simulate_concurrency=4, max_new_tokens=16, version_check_s=0.05)
    try:
        report = run_train(cfg, echo=False)
    finally:
        for server, core in restarted:
            server.stop()
            core.close()
    assert report.restores == 1 and report.versions == ["step-1", "step-2", "step-3"]
    assert report.stale_refused == 0
    # the restarted engine served nothing on its launch weights, and what it served under step-1 was
    # exactly step 1's weights (each sample is re-scored with the trainer's copy of its version's weights)
    assert served and "default" not in served and served[0] == "step-1", served
    assert report.fidelity and max(report.fidelity) < 1e-4, report.fidelity
