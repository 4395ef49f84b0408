#!/usr/bin/env bash
# Combine's topk_select (upstream's recommended method, issue #28) for Qwen3-4B on Slime, full-parameter
# Megatron. Each turn's judge votes give a +1/-1 reward and, when a hint is accepted, the hinted teacher's
# top-K (K=4) log-probs (three candidate hints, sequence_optimal); one step trains on
# w_rl * GRPO + w_opd * a PPO surrogate over the teacher's top-K ids (openclaw_combine.topk_select).
# Knobs: OPENCLAW_TOPK_K [4], OPENCLAW_TOPK_HINT_SELECTION [sequence_optimal], OPENCLAW_TOPK_MAX_CAND [3],
# OPENCLAW_TOPK_SUBSET_MODE [teacher; upstream's default student runs in `openclaw-rl local`/`train` only],
# OPENCLAW_TOPK_ADV_DIFF_CLIP [1.0], OPENCLAW_COMBINE_W_RL / OPENCLAW_COMBINE_W_OPD [1.0].
# Upstream: openclaw-combine/run_qwen3_4b_openclaw_topk_select.sh (ngquochuy0101/OpenClaw-RL f48ac35).
#
# Default layout, NUM_GPUS=8: ACTOR_GPUS=4, ROLLOUT_GPUS=2, PRM_GPUS=2: one SGLang server (TP 2) for the judge
# votes and the teacher log-probs (upstream: 1 judge GPU + 1 in-trainer Megatron teacher GPU); TEACHER_URL
# names a teacher server apart from the judge.
#
#   cd /path/to/slime && bash /path/to/openclaw-rl/scripts/run_qwen3_4b_openclaw_topk_select.sh
#   DRY_RUN=1 bash .../run_qwen3_4b_openclaw_topk_select.sh   # or --dry-run
set -euo pipefail

VARIANT=topk_select  # mode, defaults and Slime flags: its LaunchVariant in openclaw_rl/modes.py

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
