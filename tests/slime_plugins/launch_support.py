"""What the launch-script tests share: the fake Slime checkouts, the ``Run`` of a script, and a parser
for the ``ray job submit`` command a dry run prints (with the check of every hook it names against the
signature Slime calls it with). The ``launch`` fixture that runs a script is in this folder's conftest.py.
"""

from __future__ import annotations

import importlib
import inspect
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from openclaw_rl.config import load_yaml

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
