"""The mode registry is the one list of modes: every entry resolves, and everything else follows it."""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from openclaw_rl import modes
from openclaw_rl.cli import SERVE_FLAGS, build_parser, settings_from_cli
from openclaw_rl.config import Settings, flat_keys, load_settings
from openclaw_rl.modes import MODES, LocalDefaults, Mode, SlimeHooks, check_registry, resolve
from openclaw_rl.modes import launch_variant as get_launch_variant

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", list(MODES))
def test_every_registered_path_resolves_to_what_its_caller_expects(name):
    mode = MODES[name]
    for what, path in mode.paths().items():
        assert resolve(path) is not None, what
    scorer = resolve(mode.scorer)
    assert scorer.name == name and hasattr(scorer, "keeps_messages")
    assert list(inspect.signature(scorer).parameters)[:3] == ["settings", "judge", "renderer"]
    assert list(inspect.signature(resolve(mode.embedded_loss)).parameters)[:2] == ["args", "batch"]
    assert dataclasses.is_dataclass(resolve(mode.settings))
    assert list(inspect.signature(resolve(mode.slime.rollout)).parameters) == [
        "args", "rollout_id", "data_source", "evaluation"]


def test_the_registry_is_consistent_and_rejects_names_the_config_cannot_split():
    check_registry()
    for bad in ("opd_topk", "proxy", "modes", "Rl"):
        entry = Mode(name=bad, summary="", scorer="x.y", embedded_loss="x.y", slime=SlimeHooks("x.y"))
        with pytest.raises(ValueError, match=repr(bad)):
            check_registry({bad: entry})


def test_cli_config_and_local_defaults_derive_from_the_registry():
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    mode_action = next(a for a in serve._actions if a.dest == "mode")
    assert list(mode_action.choices) == list(MODES)
    for mode in MODES.values():  # each mode's own flags are serve flags, and set that mode's keys
        for flag, key, _ in mode.cli_flags:
            assert (flag, key) in [(f, k) for f, k, _ in SERVE_FLAGS] and key in flat_keys()
    assert set(Settings().modes) == set(MODES)
    ns = build_parser().parse_args(["serve", "--mode", "combine", "--w-rl", "0.25", "--distill-topk", "4"])
    settings = settings_from_cli(ns)
    assert (settings.mode, settings.combine.w_rl, settings.opd.distill_topk) == ("combine", 0.25, 4)
    with pytest.raises(ValueError, match="mode must be one of rl, opd, combine"):
        load_settings({"mode": "grpo"}, env={})
    for name, mode in MODES.items():  # modes that need teacher log-probs refuse a votes-only judge
        values = {"mode": name, "judge_url": "http://127.0.0.1:1", "judge_api": "openai"}
        if mode.needs_teacher:
            with pytest.raises(ValueError, match="teacher log-probs"):
                load_settings(values, env={})
        else:
            assert load_settings(values, env={}).mode == name
    from openclaw_rl.embedded.local import MODE_DEFAULTS

    assert {n: dataclasses.asdict(m.local) for n, m in MODES.items()} == MODE_DEFAULTS


def test_each_launch_script_is_a_registered_variant():
    """One script per LaunchVariant, and each script names only its VARIANT (everything else is the entry)."""
    scripts = {p.name: p.read_text() for p in (REPO / "scripts").glob("run_qwen3*_openclaw_*.sh")}
    variants = [v for m in MODES.values() for v in m.launch]
    assert sorted(scripts) == sorted(v.script for v in variants)
    for v in variants:
        name, text = v.name, scripts[v.script]
        assert re.search(rf"^VARIANT={re.escape(name)}(\s|$)", text, re.M), name
        assert "DEF_" not in text and "ALGO_ARGS" not in text, f"{name}: defaults and flags belong in the registry"


@pytest.mark.parametrize("variant", [v.name for m in MODES.values() for v in m.launch if v.algorithm != "none"])
def test_the_launch_plan_names_the_registered_hooks(variant, tmp_path):
    """The Slime command line of every variant takes its hook paths from the mode's SlimeHooks."""
    from openclaw_rl.launch.plan import make_plan
    from openclaw_rl.launch.script import Console

    mode, v = get_launch_variant(variant)
    env = {"SKIP_SLIME_FEATURE_CHECK": "1", "SLIME_DIR": str(tmp_path), "RUN_DIR": str(tmp_path / "run"),
           "USE_WANDB": "0", "PATH": "", "ALLOW_LORA_FALLBACK": "1",  # combine_lora runs only as the fallback
           **({"MASTER_ADDR": "10.0.0.1"} if v.num_nodes > 1 else {})}  # several nodes: an address they reach
    out = make_plan(variant, env, cwd=str(tmp_path), repo_root=str(REPO), script_name=f"run_{variant}.sh",
                    dry_run=True, extra=(), console=Console(True, io.StringIO()))
    argv = out["OC_TRAIN_CMD"]
    flags = dict(zip(argv, argv[1:]))
    assert (flags["--rollout-function-path"], flags["--custom-generate-function-path"], flags["--custom-rm-path"]) == (
        mode.slime.rollout, mode.slime.generate, mode.slime.reward_func)
    expected_loss = {"opd_topk": mode.slime.topk_loss, "topk_select": mode.slime.topk_loss,
                     "grpo": None if v.lora else mode.slime.custom_loss}.get(v.algorithm)
    assert flags.get("--custom-loss-function-path") == expected_loss
    if v.algorithm == "opd_token":
        assert flags["--custom-advantage-function-path"] == mode.slime.custom_advantage  # not inspected: the hook


def test_python_m_modes_prints_the_table_for_scripts():
    out = subprocess.run([sys.executable, "-m", "openclaw_rl.modes", "--json"], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    table = json.loads(out)
    assert list(table) == list(MODES)
    assert table["opd"]["slime"]["generate"] == "openclaw_opd.rollout.generate"
    listed = subprocess.run([sys.executable, "-m", "openclaw_rl.modes", "--list"], capture_output=True,
                            text=True, check=True, cwd=REPO).stdout.split()
    assert listed == list(MODES)


# --- adding a mode is one registry entry plus its own code (docs/adding-a-mode.md) -----------------------


@dataclass
class ToySettings:
    reward: float = 0.5


class ToyScorer:
    name = "toy"
    keeps_messages = False

    def __init__(self, settings, judge, renderer):
        self.cfg = settings.toy

    async def judge(self, turn):
        return None

    def build(self, turn, judgement, ledger):
        raise AssertionError("not called here")


def test_a_new_mode_is_one_registry_entry(monkeypatch):
    toy = Mode(name="toy", summary="test mode", scorer=f"{__name__}.ToyScorer", settings=f"{__name__}.ToySettings",
               embedded_loss="openclaw_rl.losses.policy_loss.policy_loss_function",
               slime=SlimeHooks(rollout="openclaw_rl.rollout.generate_rollout_openclaw"),
               local=LocalDefaults(batch_size=2))
    monkeypatch.setitem(MODES, "toy", toy)
    check_registry()
    settings = load_settings({"mode": "toy", "openclaw_toy_reward": "0.75"}, env={})
    assert settings.toy.reward == 0.75 and "toy_reward" in flat_keys()
    from openclaw_rl.scoring import make_scorer

    scorer = make_scorer(settings, judge=None, renderer=None)  # type: ignore[arg-type]
    assert isinstance(scorer, ToyScorer) and scorer.cfg.reward == 0.75
    from openclaw_rl.embedded.trainer import TrainerConfig, loss_for

    assert loss_for(TrainerConfig(mode="toy")) is resolve(toy.embedded_loss)
    assert modes.get_mode("toy") is toy
