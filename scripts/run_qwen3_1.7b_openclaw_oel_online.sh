#!/usr/bin/env bash
# Online experiential learning (mode oel) for Qwen3-1.7B on Slime, full-parameter Megatron. The proxy holds a
# session's turns until the session ends (X-Session-Done, idle TTL), the judge extracts do/don't rules from the
# whole conversation once, and the teacher (the judge's server, or TEACHER_URL) scores every turn's sampled
# tokens with those rules in its prompt, with its top-K (openclaw_oel_topk, 50); one step trains the top-K +
# tail reverse KL of openclaw_opd.loss.topk_distillation_loss_function (no advantages, no reward).
# Qwen3-1.7B: Megatron shape from Slime's scripts/models/qwen3-1.7B.sh, HF_CKPT [models/Qwen3-1.7B],
# ROTARY_BASE [1000000], model id qwen3-1.7b.
# Upstream: openclaw-rl/oel/run_qwen3_1.7b_openclaw_oel_online.sh (ngquochuy0101/OpenClaw-RL 7ec9f19).
#
# Default layout, NUM_GPUS=4: ACTOR_GPUS=2, ROLLOUT_GPUS=1, PRM_GPUS=1 (judge, extraction and teacher), TP 1.
#
#   cd /path/to/slime && bash /path/to/openclaw-rl/scripts/run_qwen3_1.7b_openclaw_oel_online.sh
#   DRY_RUN=1 bash .../run_qwen3_1.7b_openclaw_oel_online.sh   # or --dry-run
set -euo pipefail

VARIANT=qwen3_1.7b_oel_online  # mode, defaults and Slime flags: its LaunchVariant in openclaw_rl/modes.py

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
