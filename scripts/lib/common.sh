# shellcheck shell=bash
# shellcheck disable=SC2154,SC2153  # VARIANT, MODE, LORA, DEF_*, WANDB_GROUP, OC_TRAINS come from the variant script; PORT, PROXY_HOST, SERVED_MODEL_NAME, TOOL_CALL_PARSER, ROLLOUT_TEMPERATURE from openclaw_rl.launch (oc_build_config)
#
# Shared skeleton of scripts/run_qwen3_4b_openclaw_*.sh, the Slime launch scripts of openclaw-rl.
#
# A variant script sets its identity (VARIANT, MODE, LORA), upstream OpenClaw-RL's per-script defaults
# (DEF_*), defines `oc_algorithm_args` (fills ALGO_ARGS) and optionally `oc_variant_checks` (refusals),
# sources this file and calls `oc_main "$@"`. oc_main then:
#   1. resolves the shell-side settings from environment variables (upstream's names and defaults) and
#      checks them: GPU split, TP divisibility, paths, GPUs, Slime features;
#   2. has `python -m openclaw_rl.launch config` resolve and check everything the proxy reads (bind and
#      API-key rule, judge votes, mode options: typed by openclaw_rl.config) and writes the run config,
#      $RUN_DIR/openclaw_<mode>.yaml = configs/openclaw_<mode>.yaml plus those values (Slime's
#      --custom-config-path sets each key on its args);
#   3. starts the judge/teacher as a plain SGLang server on the PRM GPUs (unless PRM_URL names one)
#      and waits for its /health;
#   4. starts a private Ray head (own port and temp dir, dashboard on 127.0.0.1) on the actor and
#      rollout GPUs;
#   5. runs `ray job submit ... python3 train_async.py <flags>` with this repository first on PYTHONPATH;
#   6. on exit stops exactly the process groups it started in 3 and 4. Nothing else is ever killed.
# DRY_RUN=1, or --dry-run as first argument, does 1-2 and prints 3-5 without starting anything; problems
# that only matter for a real launch (missing paths, no GPU) are then warnings. Arguments after the
# optional --dry-run are appended to the train_async.py flags (the last occurrence of a flag wins).
#
# Environment (default in brackets; "v" = differs per script, see the variant's DEF_* lines):
#   SLIME_DIR [$PWD]             Slime checkout holding train_async.py (run the script from it, like upstream)
#   MEGATRON_DIR [SLIME_DIR/../Megatron-LM if present]   added to PYTHONPATH after this repository
#   NUM_GPUS ACTOR_GPUS ROLLOUT_GPUS PRM_GPUS [v]         ACTOR + ROLLOUT + PRM <= NUM_GPUS
#   TP [v] PRM_TP [TP] TRAIN_TP [min(4, ACTOR_GPUS)]     SGLang rollout TP, judge TP, Megatron TP
#   HF_CKPT [models/<v>] REF_LOAD [HF_CKPT] SAVE_CKPT [ckpt/<run>] PRM_MODEL_PATH [HF_CKPT]
#                                (SAVE_CKPT is both --save and --load: a relaunch resumes its last checkpoint)
#   PRM_URL []                   an external SGLang judge/teacher; then PRM_GPUS defaults to 0
#   PRM_API_KEY []               bearer key of that external judge
#   PRM_PORT [30010] PRM_M [v] PRM_TEMPERATURE [0.6] PRM_MAX_NEW_TOKENS [v] PRM_MEM_FRACTION [v]
#   PROXY_HOST [127.0.0.1] PORT [30000] SGLANG_API_KEY [] ALLOW_INSECURE_BIND [0] SERVED_MODEL_NAME [qwen3-4b]
#   TOOL_CALL_PARSER [qwen25] OPENCLAW_RECORD_ENABLED [1] ROLLOUT_TEMPERATURE [0.6]
#   OPENCLAW_EVAL_MODE [v] OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY [v]
#   OPENCLAW_COMBINE_W_RL [1.0] OPENCLAW_COMBINE_W_OPD [1.0]
#   ROLLOUT_BATCH_SIZE LR SAVE_INTERVAL MEM_FRACTION_STATIC MAX_TOKENS_PER_GPU [v] KL_LOSS_COEF [0.0]
#   ROTARY_BASE [5000000] CONTEXT_LENGTH [32768] MODEL_ARGS_FILE [] LORA_RANK [16] LORA_ALPHA [32]
#   USE_WANDB [1] WANDB_PROJECT [openclaw_rl] WANDB_KEY / WANDB_API_KEY []
#   MASTER_ADDR [127.0.0.1] RAY_PORT [6379] RAY_DASHBOARD_PORT [8265] RAY_TEMP_DIR [/tmp/openclaw_rl_ray_<port>]
#   RUN_DIR [results/<run>] OPENCLAW_CONFIG [configs/openclaw_<mode>.yaml] PYTHON [python3]
#   JUDGE_STARTUP_TIMEOUT [1200] RAY_START_TIMEOUT [180] SKIP_SLIME_FEATURE_CHECK [0] ALLOW_LORA_FALLBACK [0]
#   OPD_ADVANTAGE [auto]          token-level OPD: estimator (bundled Slime) or custom (THUDM/slime's hook)

OC_LIB_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
OC_REPO_ROOT="$(cd -- "${OC_LIB_DIR}/../.." && pwd)"
OC_SCRIPT_NAME="$(basename -- "$0")"
OC_STARTED_GROUPS=()  # process-group leaders started by this script (judge server, Ray head)
OC_WATCHER_PID=""
DRY_RUN=${DRY_RUN:-0}

# --- output -------------------------------------------------------------------------------------------

oc_log() { printf '[openclaw-rl] %s\n' "$*" >&2; }
oc_warn() { printf '[openclaw-rl] WARNING: %s\n' "$*" >&2; }
oc_die() {
  printf '[openclaw-rl] ERROR: %s\n' "$*" >&2
  exit 2
}
# A problem that only matters for a real launch: fatal normally, a warning in a dry run.
oc_fail() {
  if [[ ${DRY_RUN} == 1 ]]; then
    oc_warn "$* (dry run: continuing)"
  else
    oc_die "$*"
  fi
}

# One word, quoted for a POSIX shell only when it needs it (the printed commands can be pasted).
oc_quote() {
  local s=$1
  if [[ -n ${s} && ${s} =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
    printf '%s' "${s}"
  else
    printf "'%s'" "${s//\'/\'\\\'\'}"
  fi
}

oc_join_quoted() {
  local out="" w
  for w in "$@"; do
    out+="$(oc_quote "${w}") "
  done
  printf '%s' "${out% }"
}

oc_json_str() {
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  printf '"%s"' "${s}"
}


# --- small predicates -----------------------------------------------------------------------------------

oc_truthy() { [[ ${1,,} =~ ^(1|true|yes|on)$ ]]; }
oc_is_zero() { [[ $1 =~ ^[+-]?0*\.?0*([eE][+-]?[0-9]+)?$ ]]; }
oc_is_loopback() { [[ $1 == localhost || $1 == ::1 || $1 == 127.* ]]; }
oc_abspath() {
  case $1 in
    /*) printf '%s' "$1" ;;
    *) printf '%s/%s' "${PWD}" "$1" ;;
  esac
}
oc_require_uint() {
  local name
  for name in "$@"; do
    [[ ${!name} =~ ^[0-9]+$ ]] || oc_die "${name} must be a non-negative integer, got '${!name}'"
  done
}
oc_require_number() {
  local name
  for name in "$@"; do
    [[ ${!name} =~ ^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$ ]] ||
      oc_die "${name} must be a number, got '${!name}'"
  done
}
oc_port_in_use() { (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# --- settings -------------------------------------------------------------------------------------------

oc_resolve_settings() {
  OC_RUN_NAME="qwen3-4b-openclaw-${VARIANT//_/-}"
  PYTHON=${PYTHON:-python3}

  # GPU layout (upstream's names; PRM = the judge/teacher)
  NUM_GPUS=${NUM_GPUS:-${DEF_NUM_GPUS}}
  ACTOR_GPUS=${ACTOR_GPUS:-${DEF_ACTOR_GPUS}}
  ROLLOUT_GPUS=${ROLLOUT_GPUS:-${DEF_ROLLOUT_GPUS}}
  PRM_URL=${PRM_URL:-}
  PRM_URL=${PRM_URL%/}
  if [[ -n ${PRM_URL} ]]; then
    PRM_GPUS=${PRM_GPUS:-0}
  else
    PRM_GPUS=${PRM_GPUS:-${DEF_PRM_GPUS}}
  fi
  TP=${TP:-${DEF_TP}}
  PRM_TP=${PRM_TP:-${TP}}
  oc_require_uint NUM_GPUS ACTOR_GPUS ROLLOUT_GPUS PRM_GPUS TP PRM_TP
  if [[ ${LORA} == 0 ]]; then
    TRAIN_TP=${TRAIN_TP:-$((ACTOR_GPUS < 4 ? ACTOR_GPUS : 4))}
    oc_require_uint TRAIN_TP
  fi

  # paths (made absolute: the Slime job runs with SLIME_DIR as its working directory)
  local def_hf_name=Qwen3-4B-Thinking-2507 def_tokens=32768
  if [[ ${LORA} == 1 ]]; then def_hf_name=Qwen3-4B def_tokens=8192; fi
  SLIME_DIR=$(oc_abspath "${SLIME_DIR:-${PWD}}")
  MEGATRON_DIR=${MEGATRON_DIR:-}
  if [[ -z ${MEGATRON_DIR} && -d ${SLIME_DIR}/../Megatron-LM ]]; then
    MEGATRON_DIR=$(cd -- "${SLIME_DIR}/../Megatron-LM" && pwd)
  fi
  [[ -z ${MEGATRON_DIR} ]] || MEGATRON_DIR=$(oc_abspath "${MEGATRON_DIR}")
  HF_CKPT=$(oc_abspath "${HF_CKPT:-${OC_REPO_ROOT}/models/${def_hf_name}}")
  REF_LOAD=$(oc_abspath "${REF_LOAD:-${HF_CKPT}}")
  SAVE_CKPT=$(oc_abspath "${SAVE_CKPT:-${OC_REPO_ROOT}/ckpt/${OC_RUN_NAME}}")
  if [[ -n ${PRM_URL} ]]; then
    PRM_MODEL_PATH=${PRM_MODEL_PATH:-}  # optional: the judge's tokenizer (default: the policy's)
  else
    PRM_MODEL_PATH=${PRM_MODEL_PATH:-${HF_CKPT}}
  fi
  [[ -z ${PRM_MODEL_PATH} ]] || PRM_MODEL_PATH=$(oc_abspath "${PRM_MODEL_PATH}")
  RUN_DIR=$(oc_abspath "${RUN_DIR:-${OC_REPO_ROOT}/results/${OC_RUN_NAME}}")
  OPENCLAW_CONFIG=$(oc_abspath "${OPENCLAW_CONFIG:-${OC_REPO_ROOT}/configs/openclaw_${MODE}.yaml}")
  MODEL_ARGS_FILE=${MODEL_ARGS_FILE:-}

  # proxy, judge votes and mode options: resolved and checked by openclaw_rl.launch (oc_build_config)
  SGLANG_API_KEY=${SGLANG_API_KEY:-}
  CONTEXT_LENGTH=${CONTEXT_LENGTH:-32768}
  oc_require_uint CONTEXT_LENGTH

  # judge / teacher
  PRM_PORT=${PRM_PORT:-30010}
  PRM_API_KEY=${PRM_API_KEY:-}
  MEM_FRACTION_STATIC=${MEM_FRACTION_STATIC:-${DEF_MEM_FRACTION}}
  PRM_MEM_FRACTION=${PRM_MEM_FRACTION:-${MEM_FRACTION_STATIC}}
  JUDGE_STARTUP_TIMEOUT=${JUDGE_STARTUP_TIMEOUT:-1200}
  OC_JUDGE_URL=${PRM_URL:-http://127.0.0.1:${PRM_PORT}}
  oc_require_uint PRM_PORT JUDGE_STARTUP_TIMEOUT
  oc_require_number MEM_FRACTION_STATIC PRM_MEM_FRACTION

  # training
  ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-${DEF_ROLLOUT_BATCH_SIZE}}
  LR=${LR:-${DEF_LR}}
  SAVE_INTERVAL=${SAVE_INTERVAL:-${DEF_SAVE_INTERVAL}}
  MAX_TOKENS_PER_GPU=${MAX_TOKENS_PER_GPU:-${def_tokens}}
  KL_LOSS_COEF=${KL_LOSS_COEF:-0.0}
  ROTARY_BASE=${ROTARY_BASE:-5000000}
  LORA_RANK=${LORA_RANK:-16}
  LORA_ALPHA=${LORA_ALPHA:-32}
  LORA_TARGET_MODULES=${LORA_TARGET_MODULES:-q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj}
  oc_require_uint ROLLOUT_BATCH_SIZE SAVE_INTERVAL MAX_TOKENS_PER_GPU ROTARY_BASE LORA_RANK LORA_ALPHA
  oc_require_number LR KL_LOSS_COEF

  # Ray (a private head: nothing of another cluster is touched)
  MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
  RAY_PORT=${RAY_PORT:-6379}
  RAY_DASHBOARD_PORT=${RAY_DASHBOARD_PORT:-8265}
  RAY_TEMP_DIR=$(oc_abspath "${RAY_TEMP_DIR:-/tmp/openclaw_rl_ray_${RAY_PORT}}")
  RAY_START_TIMEOUT=${RAY_START_TIMEOUT:-180}
  oc_require_uint RAY_PORT RAY_DASHBOARD_PORT RAY_START_TIMEOUT

  # Weights & Biases (the key travels in the environment, never on a command line)
  USE_WANDB=${USE_WANDB:-1}
  WANDB_PROJECT=${WANDB_PROJECT:-openclaw_rl}
  OC_WANDB_KEY=${WANDB_KEY:-${WANDB_API_KEY:-}}
}

oc_check_split() {
  local used=$((ACTOR_GPUS + ROLLOUT_GPUS + PRM_GPUS))
  if ((ACTOR_GPUS < 1 || ROLLOUT_GPUS < 1)); then
    oc_die "ACTOR_GPUS (${ACTOR_GPUS}) and ROLLOUT_GPUS (${ROLLOUT_GPUS}) must both be at least 1"
  fi
  if ((used > NUM_GPUS)); then
    oc_die "bad GPU split: ACTOR_GPUS + ROLLOUT_GPUS + PRM_GPUS = ${ACTOR_GPUS} + ${ROLLOUT_GPUS} + ${PRM_GPUS} = ${used}, more than NUM_GPUS=${NUM_GPUS}. Lower one of them, or run the judge elsewhere (PRM_URL=http://host:port, PRM_GPUS=0). Layouts: docs/deployment.md"
  fi
  if [[ -n ${PRM_URL} ]]; then
    [[ ${PRM_URL} =~ ^https?://[^/[:space:]]+ ]] || oc_die "PRM_URL must look like http://host:port, got '${PRM_URL}'"
    if ((PRM_GPUS > 0)); then
      oc_warn "PRM_URL is set, so no judge server is launched here and the ${PRM_GPUS} PRM_GPUS stay idle; using PRM_GPUS=0"
      PRM_GPUS=0
    fi
  elif ((PRM_GPUS == 0)); then
    oc_die "PRM_GPUS=0 but no PRM_URL: the judge/teacher needs either its own GPUs (PRM_GPUS >= 1) or an external SGLang server (PRM_URL=http://host:port). Without a judge every turn scores 0 and nothing is learned."
  fi
  if ((TP < 1 || ROLLOUT_GPUS % TP != 0)); then
    oc_die "ROLLOUT_GPUS=${ROLLOUT_GPUS} is not a multiple of the rollout engine TP=${TP}"
  fi
  if ((PRM_GPUS > 0)) && ((PRM_TP < 1 || PRM_GPUS % PRM_TP != 0)); then
    oc_die "PRM_GPUS=${PRM_GPUS} is not a multiple of the judge TP PRM_TP=${PRM_TP}"
  fi
  if [[ ${LORA} == 0 ]] && ((TRAIN_TP < 1 || ACTOR_GPUS % TRAIN_TP != 0)); then
    oc_die "ACTOR_GPUS=${ACTOR_GPUS} is not a multiple of the Megatron tensor-parallel size TRAIN_TP=${TRAIN_TP}"
  fi
}

oc_check_path() {  # NAME PATH WHAT
  [[ -e $2 ]] || oc_fail "$1=$2 does not exist ($3)"
}

oc_check_paths() {
  if [[ ! -f ${SLIME_DIR}/train_async.py ]]; then
    oc_fail "no train_async.py in SLIME_DIR=${SLIME_DIR}: run this script from a Slime checkout (cd /path/to/slime && bash ${OC_REPO_ROOT}/scripts/${OC_SCRIPT_NAME}) or set SLIME_DIR"
  fi
  oc_check_path HF_CKPT "${HF_CKPT}" "the Hugging Face checkpoint of the policy"
  oc_check_path REF_LOAD "${REF_LOAD}" "the reference / initial checkpoint"
  if [[ -z ${PRM_URL} ]]; then
    oc_check_path PRM_MODEL_PATH "${PRM_MODEL_PATH}" "the judge/teacher model served on the PRM GPUs"
  elif [[ -n ${PRM_MODEL_PATH} ]]; then
    oc_check_path PRM_MODEL_PATH "${PRM_MODEL_PATH}" "the external judge's tokenizer"
  fi
  [[ -f ${OPENCLAW_CONFIG} ]] || oc_die "OPENCLAW_CONFIG=${OPENCLAW_CONFIG} does not exist"
  if [[ -n ${MODEL_ARGS_FILE} && ! -f ${MODEL_ARGS_FILE} ]]; then
    oc_die "MODEL_ARGS_FILE=${MODEL_ARGS_FILE} does not exist"
  fi
  if [[ -n ${MEGATRON_DIR} && ! -d ${MEGATRON_DIR} ]]; then
    oc_fail "MEGATRON_DIR=${MEGATRON_DIR} does not exist"
  fi
}

oc_check_tools() {
  local tool
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    oc_fail "nvidia-smi not found: this script needs ${NUM_GPUS} NVIDIA GPU(s). Without GPUs use the embedded stack (bash scripts/run_local.sh)"
  else
    local count
    count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    if ((count < NUM_GPUS)); then
      oc_fail "NUM_GPUS=${NUM_GPUS} but nvidia-smi lists ${count} GPU(s); lower NUM_GPUS and the split (docs/deployment.md)"
    fi
  fi
  for tool in ray curl setsid "${PYTHON}"; do
    command -v "${tool}" >/dev/null 2>&1 || oc_fail "'${tool}' not found on PATH (install Slime's environment: Ray, SGLang, curl, util-linux)"
  done
}

# The GPUs Ray manages come first (actor, then rollout, in Slime's placement order), the judge's last.
oc_assign_devices() {
  local -a visible=()
  local i
  if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
    IFS=, read -r -a visible <<<"${CUDA_VISIBLE_DEVICES}"
  else
    for ((i = 0; i < NUM_GPUS; i++)); do visible+=("${i}"); done
  fi
  local need=$((ACTOR_GPUS + ROLLOUT_GPUS + PRM_GPUS))
  if ((${#visible[@]} < need)); then
    oc_die "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} lists ${#visible[@]} GPU(s) but the split needs ${need}"
  fi
  OC_RAY_GPUS=$((ACTOR_GPUS + ROLLOUT_GPUS))
  OC_RAY_DEVICES=$(IFS=,; printf '%s' "${visible[*]:0:OC_RAY_GPUS}")
  OC_JUDGE_DEVICES=""
  if ((PRM_GPUS > 0)); then
    OC_JUDGE_DEVICES=$(IFS=,; printf '%s' "${visible[*]:OC_RAY_GPUS:PRM_GPUS}")
  fi
}

# --- Slime features -------------------------------------------------------------------------------------
# Slime silently ignores unknown flags, so a variant run on a Slime that lacks one of its features would
# start, wait for live chat and then train something else or crash. openclaw_rl.slime_hooks.features
# imports the Slime in SLIME_DIR (its argument provider and Sample type) and says what is missing, with
# a Slime commit that has it; for token-level OPD it also picks the advantage path (OPD_ADVANTAGE).

oc_pythonpath() {  # this repository first, then Megatron, then Slime (Ray puts Slime's dir at sys.path[0] anyway)
  local path="${OC_REPO_ROOT}"
  [[ -z ${MEGATRON_DIR} ]] || path+=":${MEGATRON_DIR}"
  printf '%s' "${path}:${SLIME_DIR}${PYTHONPATH:+:${PYTHONPATH}}"
}

oc_check_slime_features() {
  OPD_ADVANTAGE=${OPD_ADVANTAGE:-auto}
  case ${OPD_ADVANTAGE} in auto | estimator | custom) ;; *) oc_die "OPD_ADVANTAGE must be auto, estimator or custom, got '${OPD_ADVANTAGE}'" ;; esac
  if oc_truthy "${SKIP_SLIME_FEATURE_CHECK:-0}"; then
    oc_warn "SKIP_SLIME_FEATURE_CHECK=1: the Slime in ${SLIME_DIR} is not checked for what ${VARIANT} needs"
  else
    local out rc=0
    out=$(cd "${OC_REPO_ROOT}" && PYTHONPATH="$(oc_pythonpath)" "${PYTHON}" -m openclaw_rl.slime_hooks.features \
      "${VARIANT}" --opd-advantage "${OPD_ADVANTAGE}" 2>&1) || rc=$?
    local line messages=""
    while IFS= read -r line; do
      if [[ ${line} == opd_advantage=* ]]; then OPD_ADVANTAGE=${line#opd_advantage=}; else messages+="${messages:+; }${line}"; fi
    done <<<"${out}"
    case ${rc} in
      0) ;;
      3) oc_fail "the Slime in SLIME_DIR=${SLIME_DIR} cannot run ${VARIANT}: ${messages} (SKIP_SLIME_FEATURE_CHECK=1 skips this check)" ;;
      4) oc_fail "cannot check the Slime in SLIME_DIR=${SLIME_DIR} (run this script in Slime's Python environment, or set PYTHON): ${out//$'\n'/; }" ;;
      *) oc_die "the Slime feature check failed (status ${rc}): ${out}" ;;
    esac
  fi
  if [[ ${MODE} == opd && ${OPD_ADVANTAGE} == auto ]]; then
    OPD_ADVANTAGE=custom  # not inspected: THUDM/slime's advantage hook
  fi
  [[ ${VARIANT} != opd ]] || oc_log "token-level OPD advantage: OPD_ADVANTAGE=${OPD_ADVANTAGE}"
}

# --- argument groups ------------------------------------------------------------------------------------

# Upstream passed --use-kl-loss --kl-loss-coef 0.0: the reference model was loaded and evaluated for a
# term that is always zero. The KL group is emitted only for a non-zero KL_LOSS_COEF.
# upstream's GRPO_ARGS (rl, rl_lora, combine_lora; combine appends its custom loss), then the KL group.
oc_grpo_args() {
  ALGO_ARGS=(
    --advantage-estimator grpo
    --disable-rewards-normalization
    --entropy-coef 0.00
    --eps-clip 0.2
    --eps-clip-high 0.28
  )
  oc_add_kl_args
}

oc_add_kl_args() {
  if ! oc_is_zero "${KL_LOSS_COEF}"; then
    ALGO_ARGS+=(--use-kl-loss --kl-loss-coef "${KL_LOSS_COEF}" --kl-loss-type low_var_kl)
  fi
}

oc_build_args() {
  local mod="openclaw_${MODE}.rollout"
  local rollout_fn="generate_rollout_openclaw"
  [[ ${MODE} == rl ]] || rollout_fn+="_${MODE}"

  CLUSTER_ARGS=(
    --actor-num-nodes 1
    --actor-num-gpus-per-node "${ACTOR_GPUS}"
    --rollout-num-gpus "${ROLLOUT_GPUS}"
    --num-gpus-per-node "${OC_RAY_GPUS}"
  )
  [[ ${LORA} == 0 ]] || CLUSTER_ARGS+=(--train-backend fsdp)

  MODEL_ARGS=()
  if [[ ${LORA} == 0 ]]; then
    if [[ -n ${MODEL_ARGS_FILE} ]]; then
      # shellcheck source=/dev/null
      source "${MODEL_ARGS_FILE}"  # must set MODEL_ARGS=( ... ) like Slime's scripts/models/*.sh
    else
      MODEL_ARGS=(  # Qwen3-4B (Slime's scripts/models/qwen3-4B.sh)
        --swiglu
        --num-layers 36
        --hidden-size 2560
        --ffn-hidden-size 9728
        --num-attention-heads 32
        --group-query-attention
        --num-query-groups 8
        --use-rotary-position-embeddings
        --disable-bias-linear
        --normalization RMSNorm
        --norm-epsilon 1e-6
        --vocab-size 151936
        --kv-channels 128
        --qk-layernorm
      )
    fi
  fi

  # --load = --save: a relaunch resumes the last checkpoint (weights, optimizer, rollout id); with no
  # checkpoint there yet Slime starts from REF_LOAD / the HF checkpoint. The spool keeps every batch
  # trained after that checkpoint until the next one is written (openclaw_rl.slime_hooks.bridge).
  CKPT_ARGS=(--hf-checkpoint "${HF_CKPT}" --ref-load "${REF_LOAD}" --load "${SAVE_CKPT}" --save "${SAVE_CKPT}"
    --save-interval "${SAVE_INTERVAL}")
  if [[ ${LORA} == 0 ]]; then
    # Qwen3-4B-Thinking-2507 uses rope theta 5e6 (the model file's default is 1e6), as upstream.
    CKPT_ARGS+=(--rotary-base "${ROTARY_BASE}")
  fi

  ROLLOUT_ARGS=(
    --disable-rollout-global-dataset
    --rollout-function-path "${mod}.${rollout_fn}"
    --num-rollout 100000000
    --rollout-batch-size "${ROLLOUT_BATCH_SIZE}"
    --n-samples-per-prompt 1
    --rollout-max-response-len 8192
    --rollout-max-context-len "${CONTEXT_LENGTH}"
    --rollout-temperature "${ROLLOUT_TEMPERATURE}"
    --reward-key score
    --num-steps-per-rollout 1
  )

  if [[ ${LORA} == 0 ]]; then
    PERF_ARGS=(
      --tensor-model-parallel-size "${TRAIN_TP}"
      --sequence-parallel
      --pipeline-model-parallel-size 1
      --context-parallel-size 1
      --expert-model-parallel-size 1
      --expert-tensor-parallel-size 1
      --recompute-granularity full
      --recompute-method uniform
      --recompute-num-layers 1
      --use-dynamic-batch-size
      --max-tokens-per-gpu "${MAX_TOKENS_PER_GPU}"
      --log-probs-chunk-size 1024
    )
  else
    PERF_ARGS=(--use-dynamic-batch-size --max-tokens-per-gpu "${MAX_TOKENS_PER_GPU}" --gradient-checkpointing)
  fi

  ALGO_ARGS=()
  oc_algorithm_args

  OPTIMIZER_ARGS=(
    --optimizer adam
    --lr "${LR}"
    --lr-decay-style constant
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.98
  )
  [[ ${LORA} == 1 ]] || OPTIMIZER_ARGS+=(--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer)

  LORA_ARGS=()
  if [[ ${LORA} == 1 ]]; then
    LORA_ARGS=(--use-lora --lora-rank "${LORA_RANK}" --lora-alpha "${LORA_ALPHA}" --lora-target-modules "${LORA_TARGET_MODULES}")
  fi

  EVAL_ARGS=()

  SGLANG_ARGS=(
    --rollout-num-gpus-per-engine "${TP}"
    --sglang-tool-call-parser "${TOOL_CALL_PARSER}"
    --sglang-mem-fraction-static "${MEM_FRACTION_STATIC}"
    --sglang-context-length "${CONTEXT_LENGTH}"
    --sglang-reasoning-parser qwen3
  )

  # Slime's eval path only (the rollout function replaces generation for training).
  CUSTOM_ARGS=(
    --custom-generate-function-path "${mod}.generate"
    --custom-rm-path "${mod}.reward_func"
  )

  # Our settings (openclaw_* keys, incl. the judge URL) reach the proxy through this YAML.
  OPENCLAW_ARGS=(--custom-config-path "${OC_CONFIG_PATH}")

  MISC_ARGS=()
  if [[ ${LORA} == 0 ]]; then
    MISC_ARGS=(
      --attention-dropout 0.0
      --hidden-dropout 0.0
      --accumulate-allreduce-grads-in-fp32
      --attention-softmax-in-fp32
      --attention-backend flash
    )
  fi

  WANDB_ARGS=()
  if [[ ${USE_WANDB} == 1 && -n ${OC_WANDB_KEY} ]]; then
    WANDB_ARGS=(--use-wandb --wandb-project "${WANDB_PROJECT}" --wandb-group "${WANDB_GROUP}")
  elif [[ ${USE_WANDB} == 1 ]]; then
    oc_log "W&B logging off: set WANDB_API_KEY (or WANDB_KEY) to enable it, USE_WANDB=0 to silence this"
  fi

  # Every hook named above lives under openclaw_rl / openclaw_opd / openclaw_combine, so the order does not
  # matter for them (Ray puts SLIME_DIR, whose slime_plugins is a regular package, first in any case).
  OC_RUNTIME_ENV="{\"env_vars\": {\"PYTHONPATH\": $(oc_json_str "$(oc_pythonpath)"), \"CUDA_DEVICE_MAX_CONNECTIONS\": \"1\"}}"

  OC_JUDGE_CMD=()
  if [[ -z ${PRM_URL} ]]; then
    OC_JUDGE_CMD=(
      "${PYTHON}" -m sglang.launch_server
      --model-path "${PRM_MODEL_PATH}"
      --tp-size "${PRM_TP}"
      --dp-size "$((PRM_GPUS / PRM_TP))"
      --host 127.0.0.1
      --port "${PRM_PORT}"
      --mem-fraction-static "${PRM_MEM_FRACTION}"
      --context-length "${CONTEXT_LENGTH}"
    )
  fi
  OC_RAY_CMD=(
    ray start --head --block
    --node-ip-address "${MASTER_ADDR}"
    --port "${RAY_PORT}"
    --num-gpus "${OC_RAY_GPUS}"
    --temp-dir "${RAY_TEMP_DIR}"
    --dashboard-host 127.0.0.1
    --dashboard-port "${RAY_DASHBOARD_PORT}"
    --disable-usage-stats
  )
  OC_SUBMIT_HEAD=(
    ray job submit --address "http://127.0.0.1:${RAY_DASHBOARD_PORT}" --runtime-env-json "${OC_RUNTIME_ENV}"
    -- "${PYTHON}" "${SLIME_DIR}/train_async.py"
  )
  # Upstream's order of groups; OC_EXTRA_ARGS (the script's own arguments) last, so they win.
  OC_TRAIN_CMD=("${OC_SUBMIT_HEAD[@]}" "${CLUSTER_ARGS[@]}" "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}"
    "${ROLLOUT_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" "${ALGO_ARGS[@]}" "${PERF_ARGS[@]}" "${LORA_ARGS[@]}"
    "${EVAL_ARGS[@]}" "${SGLANG_ARGS[@]}" "${MISC_ARGS[@]}" "${WANDB_ARGS[@]}" "${CUSTOM_ARGS[@]}"
    "${OPENCLAW_ARGS[@]}" "${OC_EXTRA_ARGS[@]}")
}

# --- run config -----------------------------------------------------------------------------------------

oc_build_config() {  # sets OC_CONFIG_TEXT and PROXY_HOST PORT SERVED_MODEL_NAME TOOL_CALL_PARSER ROLLOUT_TEMPERATURE
  OC_CONFIG_PATH="${RUN_DIR}/openclaw_${MODE}.yaml"
  local out rc=0
  out=$(cd "${OC_REPO_ROOT}" && PYTHONPATH="$(oc_pythonpath)" "${PYTHON}" -m openclaw_rl.launch config \
    --mode "${MODE}" --script "${OC_SCRIPT_NAME}" --base "${OPENCLAW_CONFIG}" --run-dir "${RUN_DIR}" \
    --judge-url "${OC_JUDGE_URL}" --judge-tokenizer "${PRM_MODEL_PATH}" \
    --default "judge_votes=${DEF_PRM_M}" --default "judge_max_new_tokens=${DEF_PRM_MAX_NEW_TOKENS}" \
    --default "opd_eval_mode=${DEF_EVAL_MODE:-0}" --default "opd_teacher_concurrency=${DEF_TEACHER_CONCURRENCY:-3}" \
    --default "opd_distill_topk=${DEF_DISTILL_TOPK:-0}") || rc=$?
  ((rc == 0)) || exit "${rc}"
  eval "${out}"
}

oc_write_config() {
  if mkdir -p "${RUN_DIR}" 2>/dev/null && printf '%s\n' "${OC_CONFIG_TEXT}" >"${OC_CONFIG_PATH}"; then
    chmod 600 "${OC_CONFIG_PATH}" 2>/dev/null || true
  else
    oc_fail "cannot write ${OC_CONFIG_PATH} (set RUN_DIR to a writable directory)"
  fi
}

# --- dry run --------------------------------------------------------------------------------------------

oc_print_exports() {
  local name
  for name in "$@"; do
    case ${name} in
      SGLANG_API_KEY | PRM_API_KEY | WANDB_API_KEY)
        if [[ -n ${!name:-} ]]; then printf 'export %s=<set, not shown>\n' "${name}"; fi
        ;;
      *) printf 'export %s=%s\n' "${name}" "$(oc_quote "${!name:-}")" ;;
    esac
  done
}

# The training command, one argument group per line (shell continuation lines: paste-able).
oc_print_train_cmd() {
  OC_PRINT_LINES=("$(oc_join_quoted ray job submit --address "http://127.0.0.1:${RAY_DASHBOARD_PORT}")"
    "  --runtime-env-json $(oc_quote "${OC_RUNTIME_ENV}")"
    "  -- $(oc_join_quoted "${PYTHON}" "${SLIME_DIR}/train_async.py")")
  oc_print_group "${CLUSTER_ARGS[@]}"
  oc_print_group "${MODEL_ARGS[@]}"
  oc_print_group "${CKPT_ARGS[@]}"
  oc_print_group "${ROLLOUT_ARGS[@]}"
  oc_print_group "${OPTIMIZER_ARGS[@]}"
  oc_print_group "${ALGO_ARGS[@]}"
  oc_print_group "${PERF_ARGS[@]}"
  oc_print_group "${LORA_ARGS[@]}"
  oc_print_group "${EVAL_ARGS[@]}"
  oc_print_group "${SGLANG_ARGS[@]}"
  oc_print_group "${MISC_ARGS[@]}"
  oc_print_group "${WANDB_ARGS[@]}"
  oc_print_group "${CUSTOM_ARGS[@]}"
  oc_print_group "${OPENCLAW_ARGS[@]}"
  oc_print_group "${OC_EXTRA_ARGS[@]}"
  local i n=${#OC_PRINT_LINES[@]}
  for ((i = 0; i < n; i++)); do
    if ((i + 1 < n)); then printf '%s \\\n' "${OC_PRINT_LINES[i]}"; else printf '%s\n' "${OC_PRINT_LINES[i]}"; fi
  done
}

oc_print_group() {
  if (($#)); then OC_PRINT_LINES+=("  $(oc_join_quoted "$@")"); fi
}

oc_print_plan() {
  local judge_desc
  if [[ -n ${PRM_URL} ]]; then
    judge_desc="external SGLang server ${PRM_URL} (not started or stopped by this script)"
  else
    judge_desc="SGLang server on GPU(s) ${OC_JUDGE_DEVICES} (TP ${PRM_TP}), started by this script"
  fi
  local auth="no API key"
  [[ -z ${SGLANG_API_KEY} ]] || auth="API key required"
  cat <<EOF
# ${OC_RUN_NAME}: mode ${MODE}, ${OC_TRAINS}
# GPUs: ACTOR_GPUS=${ACTOR_GPUS} + ROLLOUT_GPUS=${ROLLOUT_GPUS} (SGLang TP ${TP}) + PRM_GPUS=${PRM_GPUS} of NUM_GPUS=${NUM_GPUS}; Ray gets GPU(s) ${OC_RAY_DEVICES}
# judge/teacher: ${OC_JUDGE_URL}, ${judge_desc}
# proxy for OpenClaw: http://${PROXY_HOST}:${PORT}/v1 (${auth}), model id ${SERVED_MODEL_NAME}
# run dir: ${RUN_DIR} (spool, records, logs); run config: ${OC_CONFIG_PATH}

# --- environment, exported before ray start (the Slime job inherits it) ---
EOF
  oc_print_exports "${OC_EXPORTS[@]}"
  printf '\n# --- run config (%s) ---\n%s\n' "${OC_CONFIG_PATH}" "${OC_CONFIG_TEXT}"
  if ((${#OC_JUDGE_CMD[@]})); then
    printf '\n# --- 1. judge/teacher server (log: %s/judge.log), then wait for %s/health ---\n' "${RUN_DIR}" "${OC_JUDGE_URL}"
    printf 'CUDA_VISIBLE_DEVICES=%s setsid %s\n' "${OC_JUDGE_DEVICES}" "$(oc_join_quoted "${OC_JUDGE_CMD[@]}")"
  else
    printf '\n# --- 1. judge/teacher: external, health-checked at %s/health ---\n' "${OC_JUDGE_URL}"
  fi
  printf '\n# --- 2. private Ray head (log: %s/ray.log), cwd %s ---\n' "${RUN_DIR}" "${SLIME_DIR}"
  printf 'CUDA_VISIBLE_DEVICES=%s setsid %s\n' "${OC_RAY_DEVICES}" "$(oc_join_quoted "${OC_RAY_CMD[@]}")"
  printf '\n# --- 3. training job ---\n'
  oc_print_train_cmd
  printf '\n# --- on exit: stop the process groups of 1 and 2 (started by this script), nothing else ---\n'
}

# --- launch ---------------------------------------------------------------------------------------------

oc_export_env() {
  export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
  export RAY_health_check_failure_threshold=20 RAY_health_check_period_ms=5000
  export RAY_health_check_timeout_ms=30000 RAY_num_heartbeats_timeout=60
  local no_proxy_hosts="127.0.0.1,localhost"
  oc_is_loopback "${MASTER_ADDR}" || no_proxy_hosts+=",${MASTER_ADDR}"
  export no_proxy="${no_proxy_hosts}" NO_PROXY="${no_proxy_hosts}"
  # Secrets travel only in the environment: never on a command line, never in the run config.
  export SGLANG_API_KEY PRM_API_KEY
  if [[ -n ${OC_WANDB_KEY} ]]; then export WANDB_API_KEY="${OC_WANDB_KEY}"; fi
  OC_EXPORTS=(PYTHONUNBUFFERED PYTHONFAULTHANDLER RAY_health_check_failure_threshold RAY_health_check_period_ms
    RAY_health_check_timeout_ms RAY_num_heartbeats_timeout no_proxy NO_PROXY SGLANG_API_KEY PRM_API_KEY WANDB_API_KEY)
}

oc_stop_group() {  # PGID: TERM the whole group, KILL what is left after a grace period
  local pgid=$1 waited=0
  kill -0 -- "-${pgid}" 2>/dev/null || return 0
  kill -TERM -- "-${pgid}" 2>/dev/null || true
  while kill -0 -- "-${pgid}" 2>/dev/null && ((waited < 30)); do
    sleep 1
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
    sleep 5
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

oc_launch() {
  local port
  for port in "${RAY_PORT}" "${RAY_DASHBOARD_PORT}" "${PORT}"; do
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

  oc_log "starting a private Ray head on GPU(s) ${OC_RAY_DEVICES}: log ${RUN_DIR}/ray.log"
  CUDA_VISIBLE_DEVICES=${OC_RAY_DEVICES} setsid "${OC_RAY_CMD[@]}" >"${RUN_DIR}/ray.log" 2>&1 &
  local ray_pid=$!
  OC_STARTED_GROUPS+=("${ray_pid}")
  oc_wait_http "Ray dashboard" "http://127.0.0.1:${RAY_DASHBOARD_PORT}/api/version" "${RAY_START_TIMEOUT}" \
    "${ray_pid}" "${RUN_DIR}/ray.log"

  if ((${#OC_JUDGE_CMD[@]})); then
    oc_wait_http "judge server" "${OC_JUDGE_URL}/health" "${JUDGE_STARTUP_TIMEOUT}" "${OC_JUDGE_PID}" "${RUN_DIR}/judge.log"
    oc_watch_judge "${OC_JUDGE_PID}" &
    OC_WATCHER_PID=$!
  else
    oc_wait_http "external judge" "${OC_JUDGE_URL}/health" 60
  fi

  oc_log "submitting the training job; point OpenClaw at http://${PROXY_HOST}:${PORT}/v1 once the log says the proxy is up"
  local rc=0
  "${OC_TRAIN_CMD[@]}" || rc=$?
  if ((rc != 0)); then oc_warn "the training job ended with status ${rc}; Ray logs: ${RAY_TEMP_DIR}/session_latest/logs"; fi
  return "${rc}"
}

# --- entry point ----------------------------------------------------------------------------------------

oc_main() {
  OC_EXTRA_ARGS=()
  if [[ ${1:-} == --dry-run ]]; then
    DRY_RUN=1
    shift
  fi
  if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    sed -n '2,/^set -euo pipefail/p' "$0" | sed -n 's/^# \{0,1\}//p'
    printf '\nEnvironment variables: see the header of %s/lib/common.sh and docs/deployment.md\n' "$(dirname -- "$0")"
    exit 0
  fi
  OC_EXTRA_ARGS=("$@")
  if oc_truthy "${DRY_RUN}"; then DRY_RUN=1; else DRY_RUN=0; fi

  if declare -F oc_variant_checks >/dev/null; then oc_variant_checks; fi
  oc_resolve_settings
  oc_check_split
  oc_check_paths
  oc_check_tools
  oc_assign_devices
  oc_check_slime_features
  oc_build_config
  oc_build_args
  oc_export_env
  oc_write_config
  if [[ ${DRY_RUN} == 1 ]]; then
    oc_print_plan
    return 0
  fi
  oc_launch
}
