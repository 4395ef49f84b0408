"""TensorBoard and W&B get the trainer's step metrics under Slime's names; neither needs the network."""

from __future__ import annotations

import sys
import types

import pytest

from openclaw_rl.embedded.metric_sinks import MetricSinks, WandbConfig, wandb_config

STEP = {"train/loss": 0.25, "rollout/reward_mean": 0.5, "train/rollout_fidelity_abs_diff": 1e-7, "perf/sync_ms": 3.0}


def test_tensorboard_scalars_have_slimes_names(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (the local extra brings it)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sinks = MetricSinks(str(tmp_path / "tb"))
    sinks.write(STEP, 1)
    sinks.write({**STEP, "train/loss": 0.125}, 2)
    sinks.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert set(STEP) <= set(events.Tags()["scalars"])
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 0.25), (2, 0.125)]


class FakeRun:
    def __init__(self, **kwargs):
        self.kwargs, self.logged, self.finished = kwargs, [], False

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self):
        self.finished = True


def test_wandb_only_when_asked_and_with_the_same_names(monkeypatch, tmp_path):
    runs: list[FakeRun] = []
    fake = types.SimpleNamespace(init=lambda **kw: runs.append(FakeRun(**kw)) or runs[-1])
    monkeypatch.setitem(sys.modules, "wandb", fake)
    MetricSinks(wandb=wandb_config("", "local", str(tmp_path))).write(STEP, 1)  # not asked: no run
    assert runs == []
    sinks = MetricSinks(wandb=wandb_config("proj", "local", str(tmp_path)))
    sinks.write(STEP, 3)
    sinks.close()
    (run,) = runs
    assert run.kwargs["project"] == "proj" and run.kwargs["group"] == "local" and run.kwargs["dir"] == str(tmp_path)
    assert run.logged == [(3, {**STEP, "train/step": 3})] and run.finished


def test_wandb_missing_or_failing_never_stops_training(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # not importable
    assert MetricSinks(wandb=WandbConfig()).wandb is None
    assert "not installed" in caplog.text

    class Broken(FakeRun):
        def log(self, data, step):
            raise ConnectionError("offline")

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: Broken(**kw)))
    sinks = MetricSinks(wandb=WandbConfig())
    sinks.write(STEP, 1)  # logged, then W&B is off
    assert sinks.wandb is None
    sinks.write(STEP, 2)


def test_the_flag(tmp_path):
    from openclaw_rl.cli import build_parser

    assert build_parser().parse_args(["local"]).wandb == ""
    assert build_parser().parse_args(["local", "--wandb"]).wandb == "openclaw_rl"
    assert build_parser().parse_args(["train", "--model", "m", "--wandb", "p"]).wandb == "p"
