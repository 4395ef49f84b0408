"""What the installed Slime can do, found by importing it, and whether a launch variant can run on it.

Slime silently drops flags it does not know (Megatron parses with ``ignore_unknown_args``), so a
variant that needs a missing feature would start, wait for live chat, and then train something else
or crash. The launch scripts run this module before anything starts:

    PYTHONPATH=<repo>:<megatron>:<slime> python -m openclaw_rl.slime_hooks.features <variant>

It imports Slime's own argument provider (every flag and choice Slime accepts; with an FSDP backend, also
the flags its ``FSDPArgs`` add), and asks Slime's own
``RolloutManager._convert_samples_to_train_data`` whether a ``Sample`` carrying ``teacher_log_probs``
reaches the train data (current Slime has a ``Sample`` field for it; the Slime bundled in OpenClaw-RL
has no field but forwards the attribute when it is set). It prints ``key=value`` lines for the script
(e.g. ``opd_advantage=custom``) or exits 3 with one line per missing feature, naming it and a Slime
commit that has it. Exit 4: Slime does not import.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from dataclasses import dataclass

TESTED_SLIME = "THUDM/slime 624b824 (2026-08-21)"
BUNDLED_SLIME = "the Slime bundled in Gen-Verse/OpenClaw-RL 0d034dd (its slime/ tree)"
BUNDLED_SLIME_PR85 = "the Slime bundled in Gen-Verse/OpenClaw-RL f48ac35 (2026-05-22, after its PR #85)"


@dataclass(frozen=True)
class SlimeFeatures:
    flags: frozenset[str]  # every option string of Slime's argument provider and of its FSDP backend's FSDPArgs
    advantage_estimators: frozenset[str]
    train_backends: frozenset[str]
    forwarded: frozenset[str]  # teacher attributes of a Sample that Slime's conversion puts in the train data
    postprocess_gets_data: bool = True  # Slime calls the postprocess hook with rollout_data (not the bundled fn(args))

    def has(self, feature: str) -> bool:
        return FEATURES[feature][0](self)


FEATURES = {  # name: (test, what it is, a Slime that has it)
    "custom_advantage_hook": (lambda f: "--custom-advantage-function-path" in f.flags,
                              "--custom-advantage-function-path", TESTED_SLIME),
    "opd_estimator": (lambda f: "on_policy_distillation" in f.advantage_estimators,
                      "--advantage-estimator on_policy_distillation", BUNDLED_SLIME),
    "custom_loss": (lambda f: "--custom-loss-function-path" in f.flags, "--custom-loss-function-path", TESTED_SLIME),
    "rollout_data_postprocess": (lambda f: "--rollout-data-postprocess-path" in f.flags,
                                 "--rollout-data-postprocess-path (the hook that unpacks the teacher top-K)",
                                 TESTED_SLIME),
    "teacher_log_probs": (lambda f: "teacher_log_probs" in f.forwarded,
                          "Sample.teacher_log_probs forwarded to the train data (the teacher field the loss reads)",
                          TESTED_SLIME),
    "postprocess_rollout_data": (lambda f: f.postprocess_gets_data,
                                 "--rollout-data-postprocess-path called with the rollout data (the in-trainer "
                                 "teacher scores it there; the bundled Slime of 0d034dd calls fn(args))",
                                 f"{TESTED_SLIME} or {BUNDLED_SLIME_PR85}"),
    "fsdp_lora": (lambda f: "--use-lora" in f.flags and "fsdp" in f.train_backends,
                  "an FSDP backend with LoRA (--train-backend fsdp --use-lora)", BUNDLED_SLIME),
}

NEEDS = {  # variant: features it cannot run without (token-level OPD picks one of two below)
    "rl": (),
    "opd": ("teacher_log_probs",),
    "opd_topk": ("teacher_log_probs", "custom_loss", "rollout_data_postprocess"),
    "combine": ("teacher_log_probs", "custom_loss"),
    "rl_lora": ("fsdp_lora",),
    "opd_topk_lora": ("fsdp_lora",),
    "combine_lora": ("fsdp_lora",),
    "topk_select": ("teacher_log_probs", "custom_loss", "rollout_data_postprocess"),
    "topk_select_2nodes": ("teacher_log_probs", "custom_loss", "rollout_data_postprocess"),
    "qwen35_rl": (),
    "qwen35_opd": ("teacher_log_probs",),
    "qwen35_combine": ("teacher_log_probs", "custom_loss"),
    "qwen3_1.7b_oel_online": ("teacher_log_probs", "custom_loss", "rollout_data_postprocess"),
}


def _choices(parser: argparse.ArgumentParser, flag: str) -> frozenset[str]:
    for action in parser._actions:  # argparse exposes no public accessor for an option's choices
        if flag in action.option_strings:
            return frozenset(action.choices or ())
    return frozenset()


@functools.cache  # one probe per process: the installed Slime does not change under it
def forwarded_teacher_attributes() -> frozenset[str]:
    """Which of a Sample's ``teacher_log_probs`` / ``teacher_topk_*`` Slime's own conversion to train data keeps.

    Current Slime has a ``teacher_log_probs`` field and forwards only it; the Slime bundled in OpenClaw-RL
    has no such field but forwards all three when they are set on the sample.

    The manager is made without its ``__init__`` (which starts SGLang engines and Ray actors) and given only
    what the conversion reads: ``args`` (no reward normalisation, no top-p or routing replay), no custom
    conversion, and rewards post-processed to 0. Nothing is started.
    """
    from slime.ray.rollout import RolloutManager
    from slime.utils.types import Sample

    manager_cls = getattr(RolloutManager, "__ray_actor_class__", RolloutManager)  # the undecorated class
    probe = object.__new__(manager_cls)
    probe.args = argparse.Namespace(advantage_estimator="grpo", rewards_normalization=False, rollout_top_p=1.0,
                                    use_rollout_routing_replay=False)
    probe.custom_convert_samples_to_train_data_func = None
    probe.train_parallel_config = {"dp_size": 1}  # read by the bundled Slime of f48ac35 (dummy samples up to DP)
    probe._post_process_rewards = lambda samples: ([0.0] * len(samples), [0.0] * len(samples))
    sample = Sample(tokens=[1, 2, 3], response_length=2, reward=0.0, loss_mask=[1, 1], rollout_log_probs=[-0.5, -0.5],
                    status=Sample.Status.COMPLETED, metadata={}, index=0, group_index=0)
    probe_values = {"teacher_log_probs": [-0.25, -0.75], "teacher_topk_log_probs": [[-0.5], [-0.125]],
                    "teacher_topk_indices": [[7], [9]]}
    for name, value in probe_values.items():
        setattr(sample, name, value)
    train_data = probe._convert_samples_to_train_data([sample])
    return frozenset(name for name, value in probe_values.items() if train_data.get(name) == [value])


def _fsdp_flags() -> frozenset[str]:
    """The flags of a Slime's FSDP backend (``--use-lora`` among them), absent from the main provider.

    With ``--train-backend fsdp``, the bundled Slime's ``parse_args`` builds its parser from the fields of
    ``slime.backends.fsdp_utils.arguments.FSDPArgs`` (one ``--field-name`` each) plus the main provider.
    """
    try:
        from slime.backends.fsdp_utils.arguments import FSDPArgs
    except ImportError:  # no FSDP backend (THUDM/slime since it was removed)
        return frozenset()
    return frozenset(f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(FSDPArgs))


def postprocess_gets_rollout_data() -> bool:
    """Whether Slime's actor passes ``rollout_data`` to ``--rollout-data-postprocess-path`` (read from its source,
    not imported: the actor module needs Megatron). No actor source found: assumed, as in current Slime."""
    import importlib.util
    import re
    from pathlib import Path

    spec = importlib.util.find_spec("slime")
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        actor = Path(root) / "backends" / "megatron_utils" / "actor.py"
        if actor.is_file():
            return re.search(r"rollout_data_postprocess\(\s*self\.args\s*\)", actor.read_text()) is None
    return True


def inspect_slime() -> SlimeFeatures:
    """Import the Slime on ``sys.path``: its flags and choices, and whether it forwards teacher log-probs."""
    from slime.utils.arguments import get_slime_extra_args_provider

    parser = argparse.ArgumentParser(add_help=False, conflict_handler="resolve")
    get_slime_extra_args_provider()(parser)
    flags = frozenset(s for action in parser._actions for s in action.option_strings) | _fsdp_flags()
    return SlimeFeatures(flags, _choices(parser, "--advantage-estimator"), _choices(parser, "--train-backend"),
                         forwarded_teacher_attributes(), postprocess_gets_rollout_data())


def check_variant(features: SlimeFeatures, variant: str, opd_advantage: str = "auto",
                  teacher_source: str = "server") -> tuple[dict[str, str], list[str]]:
    """``(settings for the script, refusal lines)`` for one launch variant."""
    if variant not in NEEDS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {sorted(NEEDS)}")
    needed = list(NEEDS[variant])
    if teacher_source == "trainer" and variant not in ("opd", "qwen35_opd"):  # opd scores in its advantage hook
        needed.append("postprocess_rollout_data")
    settings: dict[str, str] = {}
    if variant in ("opd", "qwen35_opd"):  # token-level OPD: estimator or custom advantage hook
        if opd_advantage == "auto":
            opd_advantage = "estimator" if features.has("opd_estimator") else "custom"
        if opd_advantage not in ("estimator", "custom"):
            raise ValueError(f"OPD_ADVANTAGE must be auto, estimator or custom, got {opd_advantage!r}")
        needed.append("opd_estimator" if opd_advantage == "estimator" else "custom_advantage_hook")
        if teacher_source == "trainer" and opd_advantage == "estimator":  # A = teacher - old in the postprocess hook
            needed.append("postprocess_rollout_data")
        settings["opd_advantage"] = opd_advantage
    missing = [name for name in needed if not features.has(name)]
    refusals = [f"this Slime lacks {FEATURES[name][1]}; {FEATURES[name][2]} has it" for name in missing]
    return settings, refusals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", choices=sorted(NEEDS))
    parser.add_argument("--opd-advantage", default="auto")
    parser.add_argument("--teacher-source", default="server", choices=("server", "trainer"))
    ns = parser.parse_args(argv)
    try:
        features = inspect_slime()
    except Exception as exc:  # noqa: BLE001 - any import failure means "cannot inspect this Slime"
        print(f"cannot import Slime to check its features: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 4
    try:
        settings, refusals = check_variant(features, ns.variant, ns.opd_advantage, ns.teacher_source)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    for line in refusals:
        print(line, file=sys.stderr)
    for key, value in settings.items():
        print(f"{key}={value}")
    return 3 if refusals else 0


if __name__ == "__main__":
    sys.exit(main())
