#!/usr/bin/env bash
# Combine's topk_select (as run_qwen3_4b_openclaw_topk_select.sh) on two nodes of 8 GPUs, one Ray cluster.
# Upstream: openclaw-combine/run_qwen3_4b_openclaw_topk_select_2nodes.sh (ngquochuy0101/OpenClaw-RL f48ac35):
# 8 actor (one node) + 4 rollout + 2 judge + 2 in-trainer teacher GPUs. Here: NUM_GPUS=16, GPUS_PER_NODE=8,
# ACTOR_GPUS=8 (--actor-num-nodes 1 as upstream; Slime places it), ROLLOUT_GPUS=4, PRM_GPUS=4 (one judge/
# teacher SGLang server, TP 2 x DP 2, on the head node outside Ray). Run it on every node:
#
#   head:   MASTER_ADDR=<head's address> NODE_RANK=0 bash .../run_qwen3_4b_openclaw_topk_select_2nodes.sh
#   other:  MASTER_ADDR=<head's address> NODE_RANK=1 bash .../run_qwen3_4b_openclaw_topk_select_2nodes.sh
#
# The head starts the judge, the Ray head (RAY_PORT must be reachable from the other node) and the job; the
# other node only joins Ray with all its GPUs. Not supported: an actor over several nodes, a judge off the head
# node except through PRM_URL. DRY_RUN=1 prints what each node would run.
set -euo pipefail

VARIANT=topk_select_2nodes  # mode, defaults and Slime flags: its LaunchVariant in openclaw_rl/modes.py

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
