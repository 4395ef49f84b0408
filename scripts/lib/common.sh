# shellcheck shell=bash
# shellcheck disable=SC2154,SC2153  # VARIANT comes from the variant script; OC_* arrays, PORT, RUN_DIR, ... from openclaw_rl.launch (oc_plan)
#
# Shared skeleton of scripts/run_qwen3_4b_openclaw_*.sh, the Slime launch scripts of openclaw-rl: what must
# be shell (starting and stopping processes, traps). Everything else is Python.
#
# A variant script sets VARIANT (its entry in the mode registry, openclaw_rl/modes.py: mode, LoRA,
# upstream OpenClaw-RL's per-script defaults, Slime loss flags; its refusals: openclaw_rl/launch/refusals.py),
# sources this file and calls `oc_main "$@"`. oc_main then:
#   1-2. runs `python -m openclaw_rl.launch plan VARIANT` (openclaw_rl/launch/), which resolves every
#      setting below from the environment over the registry's defaults and checks it (GPU split, TP
#      divisibility, paths, GPUs, Slime features; bind and API-key rule, judge votes, mode options typed
#      by openclaw_rl.config), writes the run config $RUN_DIR/openclaw_<mode>.yaml =
#      configs/openclaw_<mode>.yaml plus those values (Slime's --custom-config-path sets each key on its
#      args) and prints the commands of 3-5 as shell-quoted arrays, which this file evals;
#   3. starts the judge/teacher as a plain SGLang server on the PRM GPUs (unless PRM_URL names one)
#      and waits for its /health;
#   4. starts a private Ray head (own port and temp dir, dashboard on 127.0.0.1) on the actor and
#      rollout GPUs;
#   5. runs `ray job submit ... python3 train_async.py <flags>` with this repository first on PYTHONPATH;
#   6. on exit stops exactly the process groups it started in 3 and 4. Nothing else is ever killed.
# DRY_RUN=1, or --dry-run anywhere among the arguments, does 1-2 and prints 3-5 without starting anything;
# problems that only matter for a real launch (missing paths, no GPU) are then warnings. A DRY_RUN value
# that is neither yes nor no, or a near miss such as --dryrun, is refused rather than read as a real launch.
# The other arguments are appended to the train_async.py flags (no Slime flag takes a bare --dry-run as its
# value: argparse reads a token starting with -- as a flag). A '--' is refused: Slime's parser would read the
# flags after it as positionals and ignore them.
#
# Environment (default in brackets; "v" = differs per script: LaunchVariant in openclaw_rl/modes.py):
#   SLIME_DIR [$PWD]             Slime checkout holding train_async.py (run the script from it, like upstream)
#   MEGATRON_DIR [SLIME_DIR/../Megatron-LM if present]   added to PYTHONPATH after this repository
#   NUM_GPUS ACTOR_GPUS ROLLOUT_GPUS PRM_GPUS [v]         ACTOR + ROLLOUT + PRM <= NUM_GPUS
#   TP [v] PRM_TP [TP] TRAIN_TP [min(4, ACTOR_GPUS)]     SGLang rollout TP, judge TP, Megatron TP
#   HF_CKPT [models/<v>] REF_LOAD [HF_CKPT] SAVE_CKPT [ckpt/<run>] PRM_MODEL_PATH [HF_CKPT]
#                                (SAVE_CKPT is both --save and --load: a relaunch resumes its last checkpoint)
#                                the defaults of these paths and of the run dir below are inside this
#                                repository, as upstream's scripts had them (git-ignored): set them to your
#                                checkpoint and to a disk with room; a dry run reports a missing checkpoint
#   PRM_URL []                   an external SGLang judge/teacher; then PRM_GPUS defaults to 0
#   PRM_API_KEY []               bearer key of that external judge
#   PRM_PORT [30010] PRM_M [v] PRM_TEMPERATURE [0.6] PRM_MAX_NEW_TOKENS [v] PRM_MEM_FRACTION [v]
#   PROXY_HOST [127.0.0.1] PORT [30000] SGLANG_API_KEY [] ALLOW_INSECURE_BIND [0] SERVED_MODEL_NAME [qwen3-4b]
#   TOOL_CALL_PARSER [qwen25] OPENCLAW_RECORD_ENABLED [1] ROLLOUT_TEMPERATURE [0.6]
#   OPENCLAW_EVAL_MODE [v] OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY [v]
#   OPENCLAW_COMBINE_W_RL [1.0] OPENCLAW_COMBINE_W_OPD [1.0]
#   TEACHER_URL [] TEACHER_MODEL_PATH [] TEACHER_API_KEY []   opd/combine: an external SGLang teacher apart from
#                                the judge (same tokenizer as the policy; checked at start); default: the judge
#   OPENCLAW_TOPK_HINT_SELECTION [longest] OPENCLAW_TOPK_MAX_CAND [3] OPENCLAW_TOPK_SUBSET_MODE [teacher]
#   ROLLOUT_BATCH_SIZE LR SAVE_INTERVAL MEM_FRACTION_STATIC MAX_TOKENS_PER_GPU [v] KL_LOSS_COEF [0.0]
#   ROTARY_BASE [5000000] CONTEXT_LENGTH [32768] MODEL_ARGS_FILE [] LORA_RANK [16] LORA_ALPHA [32]
#   LORA_TARGET_MODULES [q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]   *_lora scripts only
#   USE_WANDB [1] WANDB_PROJECT [openclaw_rl] WANDB_KEY / WANDB_API_KEY []
#   NUM_NODES [v] GPUS_PER_NODE [v] NODE_RANK [0]  (NUM_NODES > 1: NUM_GPUS [NUM_NODES x GPUS_PER_NODE])   several nodes, one Ray cluster: node 0 runs the
#                                judge, the Ray head and the job; the others only join (layout: launch/layout.py)
#   NODE_IP [Ray's guess] RAY_ADDRESS [] SINGLE_HOST_NODES [0]   a worker's address; an existing cluster's dashboard
#                                (http://host:8265: joined, not started; the judge then is PRM_URL); loopback nodes
#   CONTEXT_PARALLEL GPU_MEMORY_GB [80]   TRAIN_TP, CONTEXT_PARALLEL and MAX_TOKENS_PER_GPU, when unset, are chosen
#                                from CONTEXT_LENGTH and GPU_MEMORY_GB (launch/memory.py; the arithmetic: DRY_RUN=1)
#   OPENCLAW_TOPK_K [v] OPENCLAW_TOPK_ADV_DIFF_CLIP [1.0]   the top-K of opd_topk / topk_select, topk_select's clip
#   MASTER_ADDR [127.0.0.1] RAY_PORT [6379] RAY_DASHBOARD_PORT [8265] RAY_TEMP_DIR [/tmp/openclaw_rl_ray_<port>]
#   RUN_DIR [results/<run>: spool, records, logs, run config; a dry run writes nothing there unless set]
#   OPENCLAW_CONFIG [configs/openclaw_<mode>.yaml] PYTHON [python3]
#   JUDGE_STARTUP_TIMEOUT [1200] RAY_START_TIMEOUT [180] SKIP_SLIME_FEATURE_CHECK [0] ALLOW_LORA_FALLBACK [0]
#   OPD_ADVANTAGE [auto]          token-level OPD: estimator (bundled Slime) or custom (THUDM/slime's hook)

OC_LIB_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
OC_REPO_ROOT="$(cd -- "${OC_LIB_DIR}/../.." && pwd)"
OC_SCRIPT_NAME="$(basename -- "$0")"
OC_STARTED_GROUPS=()  # process-group leaders started by this script (judge server, Ray head)
OC_WATCHER_PID=""
DRY_RUN=${DRY_RUN:-0}

oc_log() { printf '[openclaw-rl] %s\n' "$*" >&2; }
oc_warn() { printf '[openclaw-rl] WARNING: %s\n' "$*" >&2; }
oc_die() {
  printf '[openclaw-rl] ERROR: %s\n' "$*" >&2
  exit 2
}
oc_port_in_use() { (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Steps 1-2 (see the top): the plan, as assignments quoted for a POSIX shell (openclaw_rl/launch/plan.py).
oc_plan() {
  local out rc=0 cwd=${PWD} user_path=${PYTHONPATH:-} dry=()
  command -v "${PYTHON:-python3}" >/dev/null ||
    oc_die "PYTHON=${PYTHON:-python3} not found: set PYTHON to the Python of Slime's environment"
  [[ ${DRY_RUN} == 0 ]] || dry=(--dry-run)
  out=$(cd "${OC_REPO_ROOT}" && PYTHONPATH="${OC_REPO_ROOT}${user_path:+:${user_path}}" "${PYTHON:-python3}" \
    -m openclaw_rl.launch plan "${VARIANT}" --script "${OC_SCRIPT_NAME}" --repo-root "${OC_REPO_ROOT}" --cwd "${cwd}" \
    --user-pythonpath "${user_path}" "${dry[@]}" -- "${OC_EXTRA_ARGS[@]}") || rc=$?
  ((rc == 0)) || exit "${rc}"
  eval "${out}"
}

# Secrets travel only in the environment: never on a command line, never in the run config or the plan.
oc_export_env() {
  export "${OC_ENV[@]}"
  export SGLANG_API_KEY="${SGLANG_API_KEY:-}" PRM_API_KEY="${PRM_API_KEY:-}" TEACHER_API_KEY="${TEACHER_API_KEY:-}"
  local wandb_key=${WANDB_KEY:-${WANDB_API_KEY:-}}
  if [[ -n ${wandb_key} ]]; then export WANDB_API_KEY="${wandb_key}"; fi
}

# --- launch ---------------------------------------------------------------------------------------------

oc_stop_group() {  # PGID: TERM the whole group, KILL what is left after a grace period (30 s)
  local pgid=$1 waited=0
  kill -0 -- "-${pgid}" 2>/dev/null || return 0
  kill -TERM -- "-${pgid}" 2>/dev/null || true
  # checked every 0.1 s: a group that exits at once (most do) is not waited on for a whole second
  while kill -0 -- "-${pgid}" 2>/dev/null && ((waited < 300)); do
    sleep 0.1
    waited=$((waited + 1))
  done
  kill -KILL -- "-${pgid}" 2>/dev/null || true
}

oc_cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n ${OC_WATCHER_PID} ]]; then kill -TERM "${OC_WATCHER_PID}" 2>/dev/null || true; fi
  local i
  for ((i = ${#OC_STARTED_GROUPS[@]} - 1; i >= 0; i--)); do
    oc_log "stopping process group ${OC_STARTED_GROUPS[i]} (started by this script)"
    oc_stop_group "${OC_STARTED_GROUPS[i]}"
  done
  exit "${rc}"
}

oc_wait_http() {  # NAME URL TIMEOUT_S [PID LOG]
  local name=$1 url=$2 timeout=$3 pid=${4:-} log=${5:-}
  local -a auth=()
  [[ ${name} != "external judge" || -z ${PRM_API_KEY} ]] || auth=(-H "Authorization: Bearer ${PRM_API_KEY}")
  local deadline=$((SECONDS + timeout))
  oc_log "waiting for ${name} at ${url} (up to ${timeout}s)"
  until curl -fsS -m 5 -o /dev/null "${auth[@]}" "${url}" 2>/dev/null; do
    if [[ -n ${pid} ]] && ! kill -0 "${pid}" 2>/dev/null; then
      oc_die "${name} exited before it became ready; last lines of ${log}:
$(tail -n 30 "${log}" 2>/dev/null)"
    fi
    ((SECONDS < deadline)) || oc_die "${name} not ready after ${timeout}s (${url}); see ${log:-its logs}"
    sleep 1  # a server that died is named within a second (was 5 s); a health check to it costs nothing
  done
  oc_log "${name} is ready"
}

oc_watch_judge() {  # runs in a background subshell: say loudly when the judge dies mid-run
  local pid=$1
  trap 'kill "${OC_SLEEP_PID:-}" 2>/dev/null; exit 0' TERM
  while kill -0 "${pid}" 2>/dev/null; do
    sleep 15 &
    OC_SLEEP_PID=$!
    wait "${OC_SLEEP_PID}" || true
  done
  oc_warn "the judge server (pid ${pid}) exited: every judge vote now fails and turns score 0. See ${RUN_DIR}/judge.log; stop this run (Ctrl-C) and restart it."
}

oc_join_ray() {  # NODE_RANK > 0 (NUM_NODES > 1): join the head's Ray cluster and stay until stopped
  mkdir -p "${RUN_DIR}"
  trap oc_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  oc_log "joining the Ray cluster of the head node on GPU(s) ${OC_RAY_DEVICES}: log ${RUN_DIR}/ray.log"
  CUDA_VISIBLE_DEVICES=${OC_RAY_DEVICES} setsid "${OC_RAY_CMD[@]}" >"${RUN_DIR}/ray.log" 2>&1 &
  OC_STARTED_GROUPS+=("$!")
  wait "$!"
}

oc_launch() {
  local port
  if [[ ${OC_NODE_RANK:-0} != 0 ]]; then
    oc_join_ray
    return
  fi
  local ports=("${RAY_PORT}" "${RAY_DASHBOARD_PORT}" "${PORT}")
  [[ -z ${OC_RAY_ADDRESS} ]] || ports=("${PORT}")  # RAY_ADDRESS: an existing cluster, its ports are in use
  for port in "${ports[@]}"; do
    if oc_port_in_use "${port}"; then
      oc_die "port ${port} on 127.0.0.1 is already in use (another Ray cluster or proxy?). This script never stops what it did not start: free the port or set RAY_PORT / RAY_DASHBOARD_PORT / PORT"
    fi
  done
  if [[ -z ${PRM_URL} ]] && oc_port_in_use "${PRM_PORT}"; then
    oc_die "port ${PRM_PORT} (judge server) is already in use: set PRM_PORT, or PRM_URL to use a running judge"
  fi
  mkdir -p "${RUN_DIR}"
  trap oc_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  cd "${SLIME_DIR}" || oc_die "cannot cd to SLIME_DIR=${SLIME_DIR}"  # the Slime job inherits Ray's cwd

  if ((${#OC_JUDGE_CMD[@]})); then
    oc_log "starting the judge/teacher on GPU(s) ${OC_JUDGE_DEVICES}: log ${RUN_DIR}/judge.log"
    CUDA_VISIBLE_DEVICES=${OC_JUDGE_DEVICES} setsid "${OC_JUDGE_CMD[@]}" >"${RUN_DIR}/judge.log" 2>&1 &
    OC_JUDGE_PID=$!
    OC_STARTED_GROUPS+=("${OC_JUDGE_PID}")
  fi

  if [[ -n ${OC_RAY_ADDRESS} ]]; then  # RAY_ADDRESS: an existing cluster (not started or stopped here)
    oc_wait_http "Ray cluster" "${OC_RAY_ADDRESS}/api/version" "${RAY_START_TIMEOUT}"
  else
    oc_log "starting a private Ray head on GPU(s) ${OC_RAY_DEVICES}: log ${RUN_DIR}/ray.log"
    CUDA_VISIBLE_DEVICES=${OC_RAY_DEVICES} setsid "${OC_RAY_CMD[@]}" >"${RUN_DIR}/ray.log" 2>&1 &
    local ray_pid=$!
    OC_STARTED_GROUPS+=("${ray_pid}")
    oc_wait_http "Ray dashboard" "http://127.0.0.1:${RAY_DASHBOARD_PORT}/api/version" "${RAY_START_TIMEOUT}" \
      "${ray_pid}" "${RUN_DIR}/ray.log"
  fi

  if ((${#OC_JUDGE_CMD[@]})); then
    oc_wait_http "judge server" "${OC_JUDGE_URL}/health" "${JUDGE_STARTUP_TIMEOUT}" "${OC_JUDGE_PID}" "${RUN_DIR}/judge.log"
    oc_watch_judge "${OC_JUDGE_PID}" &
    OC_WATCHER_PID=$!
  else
    oc_wait_http "external judge" "${OC_JUDGE_URL}/health" 60
  fi

  oc_log "submitting the training job; point OpenClaw at ${OC_PROXY_URL} once the log says the proxy is up"
  local rc=0
  "${OC_TRAIN_CMD[@]}" || rc=$?
  if ((rc != 0)); then oc_warn "the training job ended with status ${rc}; Ray logs: ${RAY_TEMP_DIR}/session_latest/logs"; fi
  return "${rc}"
}

# --- entry point ----------------------------------------------------------------------------------------

oc_main() {
  OC_EXTRA_ARGS=()
  local arg
  for arg in "$@"; do
    if [[ ${arg} == -h || ${arg} == --help ]]; then  # anywhere: never a real launch for Slime to print its help
      sed -n '2,/^set -euo pipefail/p' "$0" | sed -n 's/^# \{0,1\}//p'
      printf '\nEnvironment variables: see the header of %s/lib/common.sh and docs/deployment.md\n' "$(dirname -- "$0")"
      exit 0
    fi
  done
  case ${DRY_RUN,,} in
    1 | true | yes | on) DRY_RUN=1 ;;
    0 | false | no | off | "") DRY_RUN=0 ;;
    *) oc_die "DRY_RUN must be 1/true/yes/on or 0/false/no/off, got '${DRY_RUN}'" ;;
  esac
  for arg in "$@"; do
    case ${arg} in
      --dry-run) DRY_RUN=1 ;;
      --dryrun | --dry_run | --dry-run=* | -dry-run) oc_die "unknown option '${arg}': did you mean --dry-run?" ;;
      --) oc_die "'--' is not an option here: the arguments go to Slime as they are, and Slime's parser would take every flag after '--' as a positional and ignore it (a --dry-run there would not be one)" ;;
      *) OC_EXTRA_ARGS+=("${arg}") ;;
    esac
  done

  oc_plan
  oc_export_env
  if [[ ${DRY_RUN} == 1 ]]; then
    printf '%s\n' "${OC_PLAN}"
    return 0
  fi
  oc_launch
}
