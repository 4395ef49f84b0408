"""The mode registry: what a training mode is, written down once.

A mode (``rl``, ``opd``, ``combine``) is one package plus one ``Mode`` entry in ``MODES`` below. Every
list of modes derives from this table: the CLI's ``--mode`` choices and mode-specific flags, the
settings sections and their validation (``config.py``), the scorer the proxy builds (``scoring.py``),
the embedded trainer's loss and the local run's tuned defaults (``embedded/``), the Slime hook paths,
and the tests' parametrisation. Entries name code by dotted path (``package.module.attribute``, the form
Slime's ``--*-path`` flags take) and are resolved only when used, so importing the registry imports no
mode, no torch and no Slime. ``python -m openclaw_rl.modes --json`` prints the table for tools that are
not Python (launch scripts). How to add a mode: ``docs/adding-a-mode.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class SlimeHooks:
    """What Slime loads for this mode (``docs/hooks.md``); None means Slime's built-in."""

    rollout: str  # --rollout-function-path; its module also holds `generate` and `reward_func` (eval path)
    custom_loss: str | None = None  # --loss-type custom_loss --custom-loss-function-path
    custom_advantage: str | None = None  # --custom-advantage-function-path (THUDM/slime's token-level OPD)
    topk_loss: str | None = None  # the custom loss instead: opd with openclaw_opd_distill_topk > 0, combine's topk_select

    @property
    def generate(self) -> str:  # --custom-generate-function-path
        return self.rollout.rpartition(".")[0] + ".generate"

    @property
    def reward_func(self) -> str:  # --custom-rm-path
        return self.rollout.rpartition(".")[0] + ".reward_func"


@dataclass(frozen=True, slots=True)
class LocalDefaults:
    """``openclaw-rl local`` defaults, tuned on the simulated-user task (seed 0, 2 CPU cores)."""

    lr: float = 5e-4
    kl_coef: float = 0.0
    batch_size: int = 8
    interactions: int = 400


@dataclass(frozen=True, slots=True)
class LaunchVariant:
    """One Slime launch script, ``scripts/<script>`` (``run_qwen3_4b_openclaw_<name>.sh``; for Qwen3.5
    ``run_qwen35_4b_openclaw_<name without qwen35_>.sh``), and its defaults (upstream's
    per-script values; every one can be overridden by the environment variable named in the comment).
    ``python -m openclaw_rl.launch plan <name>`` turns this entry, the environment and the mode's
    ``SlimeHooks`` into the checked ``ray job submit`` command line (``openclaw_rl/launch/``)."""

    name: str  # the script's VARIANT, and the run name qwen3-4b-openclaw-<name with - for _>
    trains: str  # what a run of it trains, in one line (the dry run's first line)
    # Slime's loss/advantage flags (launch/slime_args.py): "grpo" (GRPO, plus the mode's custom loss on
    # Megatron), "opd_token" (A = teacher - old: estimator or custom advantage hook), "opd_topk" (the
    # mode's top-K loss) or "none" (a script that always refuses)
    algorithm: str
    lora: bool = False  # Slime's FSDP backend with LoRA adapters instead of full-parameter Megatron
    num_gpus: int = 8  # NUM_GPUS
    actor_gpus: int = 4  # ACTOR_GPUS
    rollout_gpus: int = 2  # ROLLOUT_GPUS
    prm_gpus: int = 2  # PRM_GPUS (the judge/teacher server)
    tp: int = 2  # TP (SGLang rollout engines; PRM_TP defaults to it)
    train_tp: int = 0  # TRAIN_TP (Megatron; 0: min(ACTOR_GPUS, 4))
    prm_m: int = 3  # PRM_M (judge votes per turn)
    prm_max_new_tokens: int = 4096  # PRM_MAX_NEW_TOKENS
    mem_fraction: str = "0.85"  # MEM_FRACTION_STATIC (verbatim on the command line, like the next ones)
    rollout_batch_size: int = 16  # ROLLOUT_BATCH_SIZE
    lr: str = "1e-5"  # LR
    save_interval: int = 100  # SAVE_INTERVAL
    eval_mode: bool = False  # OPENCLAW_EVAL_MODE (modes with a teacher)
    teacher_concurrency: int = 3  # OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY (modes with a teacher)
    distill_topk: int = 0  # openclaw_opd_distill_topk (modes with a teacher; OPENCLAW_TOPK_K)
    combine_loss: str = ""  # openclaw_combine_loss (mode combine; empty: the setting's default, ppo)
    hint_selection: str = ""  # openclaw_opd_hint_selection (OPENCLAW_TOPK_HINT_SELECTION; empty: its default)
    num_nodes: int = 1  # NUM_NODES: nodes joined into the one Ray cluster (launch/script.py says what is supported)
    model: str = "qwen3-4b"  # a key of LAUNCH_MODELS: the policy the script trains (its shape: launch/slime_args.py)

    @property
    def base_name(self) -> str:  # the name without the model's prefix ("qwen35_rl" -> "rl")
        return self.name.removeprefix(LAUNCH_MODELS[self.model])

    @property
    def script(self) -> str:  # scripts/<this>
        return f"run_{LAUNCH_SCRIPT_STEMS[self.model]}_openclaw_{self.base_name}.sh"

    @property
    def run_name(self) -> str:
        return f"{LAUNCH_SCRIPT_STEMS[self.model].replace('_', '-')}-openclaw-" + self.base_name.replace("_", "-")


# The models a launch script can train, by the prefix of their variants' names (upstream's script names:
# run_qwen3_4b_openclaw_rl.sh, run_qwen35_4b_openclaw_rl.sh). A variant of "qwen3.5-4b" is named "qwen35_<base>".
LAUNCH_MODELS = {"qwen3-4b": "", "qwen3.5-4b": "qwen35_", "qwen3-1.7b": "qwen3_1.7b_"}
# The model's part of a script name, as upstream spells it: run_<stem>_openclaw_<base name>.sh (upstream's OEL
# script is run_qwen3_1.7b_openclaw_oel_online.sh); the run name is the stem with - for _.
LAUNCH_SCRIPT_STEMS = {"qwen3-4b": "qwen3_4b", "qwen3.5-4b": "qwen35_4b", "qwen3-1.7b": "qwen3_1.7b"}
_QWEN35 = dict(model="qwen3.5-4b")
# Upstream's openclaw-rl/oel/run_qwen3_1.7b_openclaw_oel_online.sh (ngquochuy0101/OpenClaw-RL 7ec9f19): Qwen3-1.7B,
# 4 GPUs = 2 actor + 1 rollout + 1 judge/teacher, TP 1, 3 votes, 16 samples a step, a checkpoint every 5 steps
_OEL_ONLINE = dict(model="qwen3-1.7b", num_gpus=4, actor_gpus=2, rollout_gpus=1, prm_gpus=1, tp=1, prm_m=3,
                   save_interval=5, train_tp=1)  # upstream passes no TP: Megatron TP 1, data parallel 2


# "topk_select": GRPO plus the mode's top-K loss (combine's openclaw_combine.topk_select) and the top-K transport
ALGORITHMS = ("grpo", "opd_token", "opd_topk", "topk_select", "none")  # LaunchVariant.algorithm

# Upstream's LoRA scripts: 4 GPUs (2 FSDP actors, 1 rollout engine, 1 judge), a checkpoint every step
_LORA = dict(lora=True, num_gpus=4, actor_gpus=2, rollout_gpus=1, prm_gpus=1, tp=1, save_interval=1)
# Upstream's token-level OPD and combine scripts: one judge vote, long judge outputs, PRM eval votes on,
# one teacher call at a time
_TEACHER = dict(prm_m=1, prm_max_new_tokens=8192, mem_fraction="0.8", eval_mode=True, teacher_concurrency=1)

# Upstream's run_qwen3_4b_openclaw_topk_select.sh (f48ac35): 3 judge votes, PRM eval votes, K=4, three
# candidate hints picked by sequence_optimal, one teacher call at a time. Upstream's 8 GPUs are 4 actor + 2
# rollout + 1 judge + 1 in-trainer teacher; here the 2 non-Ray GPUs hold one SGLang server at TP 2 that
# answers both the judge votes and the teacher log-probs (or set TEACHER_URL for a teacher apart).
_TOPK_SELECT = dict(prm_m=3, prm_max_new_tokens=8192, mem_fraction="0.8", eval_mode=True, teacher_concurrency=1,
                    distill_topk=4, combine_loss="topk_select", hint_selection="sequence_optimal")
# ...and its _2nodes script: 2 x 8 GPUs, 8 actor (--actor-num-nodes 1, TP 8 in upstream; TRAIN_TP here) + 4 rollout + 2 judge +
# 2 teacher; here 8 actor + 4 rollout + 4 judge/teacher GPUs (judge server on the head node: see launch/script.py)
_TOPK_SELECT_2NODES = {**_TOPK_SELECT, "num_nodes": 2, "num_gpus": 16, "actor_gpus": 8, "rollout_gpus": 4,
                       "prm_gpus": 4}


@dataclass(frozen=True, slots=True)
class Mode:
    name: str  # `--mode`, `mode:` in a config, the settings section (openclaw_<name>_*), the sample kind
    summary: str
    scorer: str  # class(settings, judge, renderer) -> scoring.TurnScorer
    embedded_loss: str  # fn(args, batch, logits, sum_of_sample_mean) -> (loss, metrics), as Slime calls it
    slime: SlimeHooks
    settings: str | None = None  # dataclass of this mode's own keys, section `settings.<name>`
    needs_teacher: bool = False  # teacher log-probs: the judge must be an SGLang server (api sglang)
    local: LocalDefaults = field(default_factory=LocalDefaults)
    cli_flags: tuple[tuple[str, str, dict[str, Any]], ...] = ()  # (flag, settings key, argparse kwargs)
    launch: tuple[LaunchVariant, ...] = ()  # its Slime launch scripts (scripts/run_qwen3_4b_openclaw_*.sh)

    def paths(self) -> dict[str, str]:
        """Every dotted path this entry names (each must import: tests/core/test_modes.py)."""
        out = {"scorer": self.scorer, "embedded_loss": self.embedded_loss, "slime.rollout": self.slime.rollout,
               "slime.generate": self.slime.generate, "slime.reward_func": self.slime.reward_func}
        for key in ("custom_loss", "custom_advantage", "topk_loss"):
            if getattr(self.slime, key):
                out[f"slime.{key}"] = getattr(self.slime, key)
        if self.settings:
            out["settings"] = self.settings
        return out


MODES: dict[str, Mode] = {m.name: m for m in (
    Mode(
        name="rl",
        summary="binary RL: the judge's majority vote on the next state is the reward (GRPO)",
        scorer="openclaw_rl.binary_rl.BinaryRLScorer",
        settings="openclaw_rl.config.RLSettings",
        embedded_loss="openclaw_rl.losses.policy_loss.policy_loss_function",
        slime=SlimeHooks(rollout="openclaw_rl.rollout.generate_rollout_openclaw"),
        local=LocalDefaults(batch_size=8, interactions=400),
        launch=(
            LaunchVariant("rl", "GRPO on the judge's +1/-1 score (Megatron, full parameters)", "grpo"),
            LaunchVariant("rl_lora", "GRPO on the judge's +1/-1 score (FSDP, LoRA adapters)", "grpo", **_LORA),
            LaunchVariant("qwen35_rl", "GRPO on the judge's +1/-1 score, Qwen3.5-4B (Megatron, full parameters)",
                          "grpo", **_QWEN35),
        ),
    ),
    Mode(
        name="opd",
        summary="on-policy distillation from the hint-enhanced teacher (token level, or top-K)",
        scorer="openclaw_opd.scorer.OPDScorer",
        settings="openclaw_rl.config.OPDSettings",
        embedded_loss="openclaw_opd.training.opd_loss_function",
        slime=SlimeHooks(rollout="openclaw_opd.rollout.generate_rollout_openclaw_opd",
                         custom_advantage="openclaw_opd.loss.on_policy_distillation_advantages",
                         topk_loss="openclaw_opd.loss.topk_distillation_loss_function"),
        needs_teacher=True,
        local=LocalDefaults(batch_size=4, interactions=640),  # samples come only from corrections
        cli_flags=(
            ("--distill-topk", "opd_distill_topk", {"type": int, "help": "OPD: also fetch the teacher's top-K"}),
            ("--eval-mode", "opd_eval_mode", {"action": "store_const", "const": True,
                                              "help": "OPD: also run PRM votes for rollout/prm_eval_score"}),
            ("--hint-selection", "opd_hint_selection", {
                "choices": ["longest", "shortest", "sequence_optimal", "token_optimal"],
                "help": "opd and combine: which candidate hint's teacher signal a sample keeps (longest)"}),
            ("--max-hint-candidates", "opd_max_hint_candidates", {
                "type": int, "help": "opd and combine: hints scored by sequence_/token_optimal (3)"}),
            ("--teacher-url", "opd_teacher_url", {
                "help": "opd and combine: SGLang server for the teacher log-probs (default: the judge's)"}),
            ("--teacher-source", "opd_teacher_source", {
                "help": "opd, combine and oel: server (the teacher server's log-probs, stored in the sample) or "
                        "trainer (the sample stores the hinted (oel: experience-augmented) prompt ids; a frozen teacher in the trainer scores them: "
                        "`train` and `local`); upstream's OPENCLAW_COMBINE_OPD_TEACHER_SOURCE values are accepted"}),
            ("--teacher-checkpoint", "opd_teacher_checkpoint", {
                "help": "--teacher-source trainer: the teacher's checkpoint (default: the initial policy weights)"}),
            ("--teacher-tokenizer", "opd_teacher_tokenizer", {
                "help": "the teacher's tokenizer dir, checked against the policy's (default: what its server reports)"}),
            ("--distill-subset", "opd_distill_subset", {
                "choices": ["teacher", "overlap"],
                "help": "OPD top-K loss: compare the teacher's top-K ids (teacher) or those also in the student's (overlap)"}),
        ),
        launch=(
            LaunchVariant("opd", "token-level OPD, A = teacher - old (Megatron, full parameters)", "opd_token",
                          **_TEACHER),
            LaunchVariant("opd_topk", "top-K (K=50) reverse-KL distillation to the hinted teacher (Megatron, "
                          "full parameters)", "opd_topk", prm_max_new_tokens=8192, rollout_batch_size=4,
                          lr="1e-6", distill_topk=50),
            LaunchVariant("opd_topk_lora", "(refused)", "none", **_LORA, rollout_batch_size=4, lr="1e-6",
                          distill_topk=50),
            LaunchVariant("qwen35_opd", "token-level OPD, A = teacher - old, Qwen3.5-4B (Megatron, full parameters)",
                          "opd_token", **_TEACHER, **_QWEN35),
        ),
    ),
    Mode(
        name="combine",
        summary="one PPO loss on w_opd * (teacher - old) + w_rl * GRPO advantage",
        scorer="openclaw_combine.scorer.CombineScorer",
        settings="openclaw_rl.config.CombineSettings",
        embedded_loss="openclaw_combine.loss.combine_loss_function",
        slime=SlimeHooks(rollout="openclaw_combine.rollout.generate_rollout_openclaw_combine",
                         custom_loss="openclaw_combine.loss.combine_loss_function",
                         topk_loss="openclaw_combine.topk_select.topk_select_loss_function"),
        needs_teacher=True,
        local=LocalDefaults(batch_size=8, interactions=400),
        cli_flags=(
            ("--w-rl", "combine_w_rl", {"type": float, "help": "combine: weight of the RL advantage"}),
            ("--w-opd", "combine_w_opd", {"type": float, "help": "combine: weight of the OPD advantage"}),
            ("--combine-loss", "combine_loss", {
                "choices": ["ppo", "topk_select"],
                "help": "combine: ppo (one PPO loss on the mixed advantage) or topk_select (GRPO + a PPO surrogate "
                        "over the teacher's top-K ids; needs --distill-topk)"}),
        ),
        launch=(
            LaunchVariant("combine", "PPO on w_opd*(teacher - old) + w_rl*r (Megatron, full parameters)", "grpo",
                          **_TEACHER),
            LaunchVariant("combine_lora", "FALLBACK: the RL half of combine only, A = w_rl*r with w_opd = 0 (FSDP, "
                          "LoRA adapters)", "grpo", **_LORA, prm_m=1, eval_mode=True, teacher_concurrency=1),
            LaunchVariant("topk_select", "w_rl*GRPO + w_opd*PPO surrogate over the teacher's top-K ids, upstream's "
                          "recommended method (Megatron, full parameters)", "topk_select", **_TOPK_SELECT),
            LaunchVariant("qwen35_combine", "PPO on w_opd*(teacher - old) + w_rl*r, Qwen3.5-4B (Megatron, full "
                          "parameters)", "grpo", **_TEACHER, **_QWEN35),
            LaunchVariant("topk_select_2nodes", "w_rl*GRPO + w_opd*PPO surrogate over the teacher's top-K "
                          "ids on two nodes (Megatron, full parameters)", "topk_select", **_TOPK_SELECT_2NODES),
        ),
    ),
    Mode(
        name="oel",
        summary="online experiential learning: top-K reverse KL to the teacher given the session's extracted "
                "experience",
        scorer="openclaw_oel.scorer.OELScorer",
        settings="openclaw_oel.settings.OELSettings",
        embedded_loss="openclaw_opd.loss.topk_distillation_loss_function",
        slime=SlimeHooks(rollout="openclaw_oel.rollout.generate_rollout_openclaw_oel",
                         custom_loss="openclaw_opd.loss.topk_distillation_loss_function",
                         topk_loss="openclaw_opd.loss.topk_distillation_loss_function"),
        needs_teacher=True,
        local=LocalDefaults(batch_size=8, interactions=400),
        cli_flags=(
            ("--oel-topk", "oel_topk", {"type": int, "help": "oel: teacher top-K per token (50)"}),
            ("--oel-accumulate", "oel_accumulate", {
                "action": "store_const", "const": True,
                "help": "oel: merge each session's experience into the user's stored experience"}),
        ),
        launch=(
            LaunchVariant("qwen3_1.7b_oel_online", "top-K (K=50) reverse-KL distillation to the teacher given the "
                          "session's extracted experience, Qwen3-1.7B (Megatron, full parameters)", "opd_topk",
                          **_OEL_ONLINE),
        ),
    ),
)}

CORE_SECTIONS = ("proxy", "judge", "spool")  # settings sections that are not modes
_RESERVED = (*CORE_SECTIONS, "mode", "modes")  # names a mode cannot take (config.Settings uses them)
_NAME = re.compile(r"^[a-z][a-z0-9]*$")  # flat keys split at the first "_": a mode name has none


def mode_names() -> list[str]:
    return list(MODES)


def get_mode(name: str) -> Mode:
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown mode {name!r}; modes: {', '.join(MODES)}") from None


def launch_variant(name: str) -> tuple[Mode, LaunchVariant]:
    """The mode and entry of the launch script ``run_qwen3_4b_openclaw_<name>.sh``."""
    for m in MODES.values():
        for v in m.launch:
            if v.name == name:
                return m, v
    names = [v.name for m in MODES.values() for v in m.launch]
    raise ValueError(f"unknown launch variant {name!r}; variants: {', '.join(names)}")


def resolve(path: str) -> Any:
    """Import ``package.module.attribute`` (Slime's dotted-path form)."""
    module, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"mode registry: cannot import {path!r}: {e}") from e


def check_registry(modes: dict[str, Mode] | None = None) -> None:
    """Raise ValueError on an entry the rest of the code could not use (names, duplicate flags)."""
    modes = MODES if modes is None else modes
    flags: set[str] = set()
    variants: set[str] = set()
    for key, m in modes.items():
        if key != m.name or not _NAME.match(m.name) or m.name in _RESERVED:
            raise ValueError(f"mode {m.name!r}: names are lowercase letters and digits, unique, and not "
                             f"one of {_RESERVED}")
        for flag, setting, _ in m.cli_flags:
            if flag in flags or not setting.startswith(m.name + "_"):
                raise ValueError(f"mode {m.name!r}: flag {flag} is taken or sets another mode's key {setting!r}")
            flags.add(flag)
        for v in m.launch:
            if v.model not in LAUNCH_MODELS or not v.name.startswith(LAUNCH_MODELS[v.model]):
                raise ValueError(f"mode {m.name!r}: launch variant {v.name!r}: model {v.model!r} must be one of "
                                 f"{list(LAUNCH_MODELS)} and the name start with its prefix")
            if v.name in variants or v.algorithm not in ALGORITHMS:
                raise ValueError(f"mode {m.name!r}: launch variant {v.name!r} is taken or has an unknown algorithm "
                                 f"{v.algorithm!r} (one of {ALGORITHMS})")
            variants.add(v.name)


def _describe(m: Mode) -> dict[str, Any]:
    out = dataclasses.asdict(m)
    out["slime"].update(generate=m.slime.generate, reward_func=m.slime.reward_func)
    out["cli_flags"] = [flag for flag, _, _ in m.cli_flags]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m openclaw_rl.modes", description=__doc__.splitlines()[0])
    p.add_argument("--list", action="store_true", help="mode names, one a line")
    p.add_argument("--json", action="store_true", help="the whole registry as JSON")
    ns = p.parse_args(argv)
    check_registry()
    if ns.json:
        print(json.dumps({name: _describe(m) for name, m in MODES.items()}, indent=2))
    elif ns.list:
        print("\n".join(MODES))
    else:
        for m in MODES.values():
            print(f"{m.name:10s} {m.summary}\n{'':10s} rollout hook {m.slime.rollout}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
