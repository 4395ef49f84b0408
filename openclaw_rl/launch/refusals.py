"""The LoRA variants that would train something else than their name says, refused (or, for combine,
run as an explicit fallback). Here rather than in the scripts so that ``python -m openclaw_rl.launch plan``
refuses exactly what the scripts refuse.

Slime's FSDP/LoRA backend implements only GRPO with its built-in loss: it ignores custom losses, teacher
log-probs and ``--disable-compute-advantages-and-returns``. Upstream's LoRA scripts for top-K OPD and
combine therefore trained plain GRPO without saying so (docs/differences.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..modes import launch_variant
from .run_config import LaunchError
from .script import NUMBER, Console, switch

TOPK_LORA = """{script} refuses to run: it would not train top-K distillation.
  Slime's FSDP/LoRA backend implements only GRPO with its built-in loss; it ignores the custom top-K
  loss, the teacher's top-K log-probs and --disable-compute-advantages-and-returns. Upstream's version
  of this script therefore trained plain GRPO on a constant reward (self-imitation of accepted turns)
  without saying so. Distillation cannot be expressed as a GRPO reward, so there is no honest fallback
  and ALLOW_LORA_FALLBACK does not change this.
  Alternatives:
    - scripts/run_qwen3_4b_openclaw_opd_topk.sh: the same method, full-parameter Megatron (8 GPUs by
      default; with an external teacher, PRM_URL=http://host:port PRM_GPUS=0, 6 GPUs).
    - scripts/run_qwen3_4b_openclaw_opd.sh: token-level OPD, full-parameter Megatron.
    - scripts/run_qwen3_4b_openclaw_rl_lora.sh: LoRA with a method the FSDP backend implements (binary RL).
  See docs/deployment.md (LoRA)."""

COMBINE_LORA = """{script} refuses to run by default: it cannot train combine.
  Slime's FSDP/LoRA backend implements only GRPO with its built-in loss; it ignores
  combine_loss_function and the teacher log-probs, so the OPD half of combine would be dropped
  silently (upstream's version of this script did exactly that).
  Choose one:
    - scripts/run_qwen3_4b_openclaw_combine.sh: real combine, full-parameter Megatron (8 GPUs by
      default; with an external judge/teacher, PRM_URL=http://host:port PRM_GPUS=0, 6 GPUs).
    - ALLOW_LORA_FALLBACK=1 (this script): knowingly train only the RL half of combine with LoRA,
      i.e. combine with OPENCLAW_COMBINE_W_OPD=0 (A = r); the teacher signal is collected but unused.
    - scripts/run_qwen3_4b_openclaw_rl_lora.sh: LoRA binary RL (the same signal, no hint work).
  See docs/deployment.md (LoRA)."""


PER_USER_ON_SLIME = """Per-user adapters (openclaw_proxy_per_user_adapters) cannot run on Slime.
  THUDM/slime trains one policy with Megatron and has no LoRA, let alone one adapter per user, and its
  SGLang engines are driven by its own weight updates. Per-user adapters run on `openclaw-rl train
  --per-user-adapters` against an external SGLang started with --enable-lora (one or several GPUs), or
  on `openclaw-rl local --per-user-adapters` on a CPU. See docs/users.md."""

REFUSALS = {"opd_topk_lora": TOPK_LORA, "combine_lora": COMBINE_LORA}  # by variant name (modes.LaunchVariant)

# Upstream's OPENCLAW_COMBINE_OPD_TEACHER_SOURCE (PR #85): "inference" (the SGLang teacher, what runs here) or
# "megatron" (aliases ref, mcore; "trainer" is this repository's name for it): a teacher inside the trainer.
TEACHER_SOURCE = "OPENCLAW_COMBINE_OPD_TEACHER_SOURCE"
SERVER_TEACHER = ("", "server", "inference")
TRAINER_TEACHER = ("trainer", "megatron", "ref", "mcore")
TEACHER_IN_TRAINER = """{script} refuses to run: {var}={value} asks for the teacher inside the trainer, {why}.
  The in-trainer teacher on Slime is a frozen HF model in the training actor
  (openclaw_rl.slime_hooks.trainer_teacher): it needs Megatron (not LoRA/FSDP) and a mode with a teacher
  (opd, combine, topk_select).
  Unset {var} (or set it to inference) to use the teacher server."""


def trainer_teacher(env: Mapping[str, str], script: str, variant: str) -> str:
    """``trainer`` or ``server`` from OPENCLAW_COMBINE_OPD_TEACHER_SOURCE; refuses what the in-trainer teacher
    cannot run (LoRA's FSDP backend ignores teacher log-probs; rl has no teacher)."""
    mode, v = launch_variant(variant)
    source = env.get(TEACHER_SOURCE, "").strip().lower()
    if source in SERVER_TEACHER:
        return "server"
    if source not in TRAINER_TEACHER:
        raise LaunchError(f"{TEACHER_SOURCE}={env[TEACHER_SOURCE]}: one of {', '.join(SERVER_TEACHER[1:])} (the teacher "
                          f"server, the default) or {', '.join(TRAINER_TEACHER)} (the teacher inside the trainer)")
    why = ("which LoRA's FSDP backend cannot train on" if v.lora else
           f"but {mode.name} has no teacher" if not mode.needs_teacher else
           "which OEL runs in `openclaw-rl local` and `train` only (its Slime run with it is not built or checked)"
           if mode.name == "oel" else
           "with OPENCLAW_TOPK_SUBSET_MODE=student, which runs in `openclaw-rl local` and `train` only (the actor-side "
           "hook reads the teacher at the student's top-K ids a sample carries, but the proxy does not yet record "
           "the rollout's top-K ids with the turn)"
           if env.get("OPENCLAW_TOPK_SUBSET_MODE", "").strip() == "student" else "")
    if why:
        raise LaunchError(TEACHER_IN_TRAINER.format(script=script, var=TEACHER_SOURCE, value=env[TEACHER_SOURCE],
                                                    why=why))
    return "trainer"


def check_variant(variant: str, env: Mapping[str, str], script: str, console: Console) -> dict[str, str]:
    """Refuse a variant that cannot train what it names (the registry's algorithm "none"; a LoRA variant of
    a mode with a teacher, unless ALLOW_LORA_FALLBACK); returns the environment overrides of a fallback."""
    mode, v = launch_variant(variant)
    if switch(env, "OPENCLAW_PROXY_PER_USER_ADAPTERS", False):
        raise LaunchError(PER_USER_ON_SLIME)
    trainer_teacher(env, script, variant)
    if v.algorithm == "none":
        raise LaunchError(REFUSALS[variant].format(script=script))
    if not (v.lora and mode.needs_teacher):
        return {}
    if not switch(env, "ALLOW_LORA_FALLBACK", False):
        raise LaunchError(REFUSALS[variant].format(script=script))
    w_opd, w_rl = env.get("OPENCLAW_COMBINE_W_OPD") or "0", env.get("OPENCLAW_COMBINE_W_RL") or "1.0"
    if not NUMBER.fullmatch(w_opd) or float(w_opd) != 0:
        raise LaunchError(f"ALLOW_LORA_FALLBACK=1 trains combine with w_opd = 0, but OPENCLAW_COMBINE_W_OPD={w_opd}: "
                          "the FSDP backend cannot apply a teacher weight. Unset it, or use "
                          "run_qwen3_4b_openclaw_combine.sh")
    if not NUMBER.fullmatch(w_rl) or float(w_rl) != 1:
        raise LaunchError(f"ALLOW_LORA_FALLBACK=1: the FSDP backend trains A = r, so OPENCLAW_COMBINE_W_RL must be 1 "
                          f"(got {w_rl}); scale LR instead")
    console.warn("ALLOW_LORA_FALLBACK=1: training the RL half of combine ONLY (w_opd = 0, A = r) with LoRA on FSDP. "
                 "Teacher log-probs are collected but not trained on. For real combine use "
                 "run_qwen3_4b_openclaw_combine.sh.")
    return {"OPENCLAW_COMBINE_W_OPD": "0.0", "OPENCLAW_COMBINE_W_RL": "1.0"}
