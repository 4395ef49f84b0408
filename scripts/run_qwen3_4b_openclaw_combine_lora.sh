#!/usr/bin/env bash
# Combined RL + OPD with LoRA: REFUSED by default, because it cannot train what it names.
#
# Upstream's openclaw-combine/run_qwen3_4b_openclaw_combine_lora.sh ran Slime's FSDP/LoRA backend, which
# implements only GRPO with its built-in loss and ignores combine_loss_function and the teacher
# log-probs: it silently trained GRPO on the judge's score alone.
#
# ALLOW_LORA_FALLBACK=1 runs that approximation knowingly and says so: combine with the OPD weight set
# to zero, i.e. A = w_rl * r with w_opd = 0 written into the run config. That objective is exactly what
# FSDP's GRPO computes on combine's samples (hint-only samples have r = 0 and contribute nothing), so
# the run is what the config says. The teacher signal the proxy collects is not used. For that, run
# scripts/run_qwen3_4b_openclaw_combine.sh; for LoRA binary RL, scripts/run_qwen3_4b_openclaw_rl_lora.sh.
#
# Default layout, NUM_GPUS=4: ACTOR_GPUS=2 (FSDP), ROLLOUT_GPUS=1, PRM_GPUS=1.
#   ALLOW_LORA_FALLBACK=1 bash /path/to/openclaw-rl/scripts/run_qwen3_4b_openclaw_combine_lora.sh
set -euo pipefail

VARIANT=combine_lora  # mode, defaults and Slime flags: its LaunchVariant in openclaw_rl/modes.py

oc_variant_checks() {
  if ! oc_truthy "${ALLOW_LORA_FALLBACK:-0}"; then
    oc_die "run_qwen3_4b_openclaw_combine_lora.sh refuses to run by default: it cannot train combine.
  Slime's FSDP/LoRA backend implements only GRPO with its built-in loss; it ignores
  combine_loss_function and the teacher log-probs, so the OPD half of combine would be dropped
  silently (upstream's version of this script did exactly that).
  Choose one:
    - scripts/run_qwen3_4b_openclaw_combine.sh: real combine, full-parameter Megatron (8 GPUs by
      default; with an external judge/teacher, PRM_URL=http://host:port PRM_GPUS=0, 6 GPUs).
    - ALLOW_LORA_FALLBACK=1 (this script): knowingly train only the RL half of combine with LoRA,
      i.e. combine with OPENCLAW_COMBINE_W_OPD=0 (A = r); the teacher signal is collected but unused.
    - scripts/run_qwen3_4b_openclaw_rl_lora.sh: LoRA binary RL (the same signal, no hint work).
  See docs/deployment.md (LoRA)."
  fi
  local w_opd=${OPENCLAW_COMBINE_W_OPD:-0} w_rl=${OPENCLAW_COMBINE_W_RL:-1.0}
  oc_is_zero "${w_opd}" ||
    oc_die "ALLOW_LORA_FALLBACK=1 trains combine with w_opd = 0, but OPENCLAW_COMBINE_W_OPD=${w_opd}: the FSDP backend cannot apply a teacher weight. Unset it, or use run_qwen3_4b_openclaw_combine.sh"
  [[ ${w_rl} =~ ^1(\.0*)?$ ]] ||
    oc_die "ALLOW_LORA_FALLBACK=1: the FSDP backend trains A = r, so OPENCLAW_COMBINE_W_RL must be 1 (got ${w_rl}); scale LR instead"
  export OPENCLAW_COMBINE_W_OPD=0.0 OPENCLAW_COMBINE_W_RL=1.0  # read by openclaw_rl.launch
  oc_warn "ALLOW_LORA_FALLBACK=1: training the RL half of combine ONLY (w_opd = 0, A = r) with LoRA on FSDP. Teacher log-probs are collected but not trained on. For real combine use run_qwen3_4b_openclaw_combine.sh."
}

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
