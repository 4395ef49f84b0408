"""What a launch script starts: the judge server, the private Ray head and the ``ray job submit`` command
with Slime's flags, built from the checked settings (``script.ScriptSettings``) and the mode's Slime hooks.

The flags come in upstream's groups and order (cluster, model, checkpoint, rollout, optimizer, algorithm,
performance, LoRA, eval, SGLang, misc, W&B, custom hooks, our run config), then the script's own
arguments, last so that they win (argparse keeps the last occurrence of a flag).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config import is_loopback
from . import layout, memory
from .run_config import LaunchError
from .script import Console, ScriptSettings

TOPK_UNPACK = "openclaw_rl.slime_hooks.topk.unpack_teacher_topk"  # --rollout-data-postprocess-path (top-K OPD)
TRAINER_TEACHER = "openclaw_rl.slime_hooks.trainer_teacher.score_and_unpack"  # the same, teacher_source trainer
TRAINER_TEACHER_OPD = "openclaw_rl.slime_hooks.trainer_teacher.score_opd_advantages"  # opd on the bundled Slime
ZERO = re.compile(r"[+-]?0*\.?0*([eE][+-]?[0-9]+)?")
QWEN3_4B = [  # Slime's scripts/models/qwen3-4B.sh
    "--swiglu", "--num-layers", "36", "--hidden-size", "2560", "--ffn-hidden-size", "9728",
    "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8",
    "--use-rotary-position-embeddings", "--disable-bias-linear", "--normalization", "RMSNorm", "--norm-epsilon",
    "1e-6", "--vocab-size", "151936", "--kv-channels", "128", "--qk-layernorm"]
QWEN35_4B = [  # Slime's scripts/models/qwen3.5-4B.sh (ngquochuy0101/OpenClaw-RL f48ac35); --rotary-base: ROTARY_BASE
    "--spec", "slime_plugins.models.qwen3_5", "get_qwen3_5_spec", "--disable-bias-linear", "--qk-layernorm",
    "--group-query-attention", "--num-attention-heads", "16", "--num-query-groups", "4", "--kv-channels", "256",
    "--num-layers", "32", "--hidden-size", "2560", "--ffn-hidden-size", "9216", "--use-gated-attention",
    "--attention-output-gate", "--normalization", "RMSNorm", "--apply-layernorm-1p", "--position-embedding-type",
    "rope", "--norm-epsilon", "1e-6", "--rotary-percent", "0.25", "--swiglu", "--vocab-size", "248320"]
QWEN3_1_7B = [  # Slime's scripts/models/qwen3-1.7B.sh (its --rotary-base: ROTARY_BASE)
    "--swiglu", "--num-layers", "28", "--hidden-size", "2048", "--ffn-hidden-size", "6144",
    "--num-attention-heads", "16", "--group-query-attention", "--num-query-groups", "8",
    "--use-rotary-position-embeddings", "--disable-bias-linear", "--normalization", "RMSNorm", "--norm-epsilon",
    "1e-6", "--vocab-size", "151936", "--kv-channels", "128", "--qk-layernorm"]
MODEL_ARGS = {"qwen3-4b": QWEN3_4B, "qwen3.5-4b": QWEN35_4B, "qwen3-1.7b": QWEN3_1_7B}  # by LaunchVariant.model
GRPO = ["--advantage-estimator", "grpo", "--disable-rewards-normalization", "--entropy-coef", "0.00", "--eps-clip",
        "0.2", "--eps-clip-high", "0.28"]


@dataclass
class Commands:
    judge: list[str]  # empty with an external judge (PRM_URL)
    ray: list[str]
    submit: list[str]  # ray job submit ... -- python train_async.py
    groups: list[list[str]]  # Slime's flags, group by group (the dry run prints one group a line)

    @property
    def train(self) -> list[str]:
        return [*self.submit, *(w for g in self.groups for w in g)]


def kl_args(s: ScriptSettings) -> list[str]:
    """Upstream passed --use-kl-loss --kl-loss-coef 0.0: the reference model was loaded and evaluated for a
    term that is always zero. The KL group is emitted only for a non-zero KL_LOSS_COEF."""
    return [] if ZERO.fullmatch(s.kl_loss_coef) else [
        "--use-kl-loss", "--kl-loss-coef", s.kl_loss_coef, "--kl-loss-type", "low_var_kl"]


def algorithm_args(s: ScriptSettings) -> list[str]:
    args = _algorithm_args(s)
    if s.teacher_source != "trainer":
        return args
    # the in-trainer teacher (slime_hooks/trainer_teacher.py) scores the packed teacher prompts on the actor:
    # token-level OPD in its advantage hook; the losses (combine, top-K) in the postprocess hook
    # context parallelism: the hook gathers each packed prompt over the CP group and keeps its own rows
    if s.variant.algorithm == "opd_token" and s.opd_advantage == "estimator":
        # the bundled Slime's on_policy_distillation estimator reads teacher_log_probs before any hook: run
        # grpo instead (rewards unused) and set A = teacher - old in the postprocess hook, after it
        return ["--advantage-estimator", "grpo", "--disable-rewards-normalization", "--entropy-coef", "0.00",
                *kl_args(s), "--rollout-data-postprocess-path", TRAINER_TEACHER_OPD]
    if s.variant.algorithm == "opd_token":
        return args
    if TOPK_UNPACK in args:
        return [TRAINER_TEACHER if a == TOPK_UNPACK else a for a in args]
    return [*args, "--rollout-data-postprocess-path", TRAINER_TEACHER]


def _algorithm_args(s: ScriptSettings) -> list[str]:
    hooks, algorithm = s.mode.slime, s.variant.algorithm
    if algorithm == "grpo":  # upstream's GRPO_ARGS; combine's COMBINE_ARGS add its loss (ignored by FSDP: not on LoRA)
        loss = ["--loss-type", "custom_loss", "--custom-loss-function-path", hooks.custom_loss] \
            if hooks.custom_loss and not s.variant.lora else []
        return [*GRPO, *kl_args(s), *loss]
    if algorithm == "opd_token":  # A = teacher - old: the bundled Slime's estimator, or THUDM/slime's hook
        if s.opd_advantage == "estimator":
            adv = ["--advantage-estimator", "on_policy_distillation"]
        else:  # the hook replaces Slime's advantage computation; rewards (the eval score) are not used
            adv = ["--advantage-estimator", "grpo", "--disable-rewards-normalization",
                   "--custom-advantage-function-path", str(hooks.custom_advantage)]
        return [*adv, "--entropy-coef", "0.00", *kl_args(s)]
    if algorithm == "opd_topk":  # the teacher's K comes from openclaw_opd_distill_topk (the run config)
        return ["--loss-type", "custom_loss", "--custom-loss-function-path", str(hooks.topk_loss),
                "--rollout-data-postprocess-path", TOPK_UNPACK, "--disable-compute-advantages-and-returns",
                "--disable-rewards-normalization", "--entropy-coef", "0.00"]
    if algorithm == "topk_select":  # GRPO on the reward + the mode's top-K loss; the teacher's K: the run config
        return [*GRPO, *kl_args(s), "--loss-type", "custom_loss", "--custom-loss-function-path", str(hooks.topk_loss),
                "--rollout-data-postprocess-path", TOPK_UNPACK]
    if algorithm == "none":
        return []
    raise LaunchError(f"launch variant {s.variant.name}: unknown algorithm {algorithm!r}")


def model_args(s: ScriptSettings, cwd: str) -> list[str]:
    """Qwen3-4B's shape, or MODEL_ARGS_FILE: a Bash file setting ``MODEL_ARGS=( ... )`` like Slime's
    scripts/models/*.sh, read by Bash itself (its words, NUL-separated)."""
    if s.variant.lora:
        return []
    if not s.model_args_file:
        return list(MODEL_ARGS[s.variant.model])
    res = subprocess.run(["bash", "-c", 'set -eu; MODEL_ARGS=(); source "$1"; printf "%s\\0" "${MODEL_ARGS[@]}"',
                          "bash", s.model_args_file], cwd=cwd, capture_output=True, check=False)
    if res.returncode != 0:
        raise LaunchError(f"MODEL_ARGS_FILE={s.model_args_file} failed: {res.stderr.decode(errors='replace').strip()}")
    return [w.decode() for w in res.stdout.split(b"\0")[:-1]]


def attention_shape(s: ScriptSettings, margs: Sequence[str]) -> tuple[int, int, str] | None:
    """(attention heads, key/value heads, where from): the Megatron model args, else the checkpoint's
    config.json; None when neither says."""
    flags = dict(zip(margs, margs[1:]))
    if "--num-attention-heads" in flags:
        try:
            heads = int(flags["--num-attention-heads"])
            # Megatron's default for --num-query-groups is 1 (multi-query attention)
            groups = int(flags.get("--num-query-groups", "1")) if "--group-query-attention" in margs else heads
        except ValueError as e:
            raise LaunchError(f"MODEL_ARGS_FILE={s.model_args_file}: --num-attention-heads / --num-query-groups must be "
                              f"integers ({e})") from None
        return heads, groups, "the model args"
    try:
        cfg = json.loads(Path(s.hf_ckpt, "config.json").read_text())
        heads = int(cfg["num_attention_heads"])
        return heads, int(cfg.get("num_key_value_heads") or heads), f"{s.hf_ckpt}/config.json"
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_parallel_sizes(s: ScriptSettings, margs: Sequence[str]) -> None:
    """Tensor-parallel sizes the model's attention can be split by: Megatron needs TRAIN_TP to divide the
    heads and the query groups; SGLang needs TP to divide the heads, and the key/value heads to divide by
    TP or TP by them (it replicates them). Caught here, not minutes later at Megatron's or SGLang's init."""
    shape = attention_shape(s, margs)
    if shape is None:
        return
    heads, groups, source = shape
    if s.train_tp and (heads % s.train_tp or groups % s.train_tp):
        raise LaunchError(f"TRAIN_TP={s.train_tp} does not divide the model's {heads} attention heads and {groups} "
                          f"query groups ({source}); Megatron would refuse it. Set TRAIN_TP to a divisor of both")
    if heads % s.tp or (groups % s.tp and s.tp % groups):
        raise LaunchError(f"TP={s.tp} cannot split the model's {heads} attention heads and {groups} key/value heads "
                          f"({source}); SGLang would refuse it. Set TP (and ROLLOUT_GPUS) accordingly")


# Slime flags whose value the run config repeats for the proxy: given again as an extra argument, Slime
# would take the new value and the proxy the old one (e.g. the trainer's log-probs at another temperature).
MIRRORED = {"--rollout-temperature": "ROLLOUT_TEMPERATURE", "--sglang-tool-call-parser": "TOOL_CALL_PARSER",
            "--custom-config-path": "OPENCLAW_CONFIG"}


def check_extra(extra: Sequence[str]) -> None:
    for arg in extra:
        flag = arg.partition("=")[0]
        if flag in MIRRORED:
            raise LaunchError(f"{flag} cannot be passed as an extra argument: the proxy's run config holds the same "
                              f"value; set {MIRRORED[flag]} instead")


def build(s: ScriptSettings, extra: Sequence[str], console: Console, cwd: str) -> Commands:
    lora = s.variant.lora
    hooks = s.mode.slime
    # Slime places the actor's nodes x GPUs-per-node ranks and the rollout engines itself (launch/layout.py)
    per_node = s.gpus_per_node if s.num_nodes > 1 else s.ray_gpus
    actor_nodes, actor_per_node = s.actor_nodes
    cluster = ["--actor-num-nodes", str(actor_nodes), "--actor-num-gpus-per-node", str(actor_per_node),
               "--rollout-num-gpus", str(s.rollout_gpus), "--num-gpus-per-node", str(per_node),
               *(["--train-backend", "fsdp"] if lora else [])]
    margs = model_args(s, cwd)
    if not lora:
        size_for_long_samples(s, margs, console, extra)
    check_layout(s)
    # --load = --save: a relaunch resumes the last checkpoint (weights, optimizer, rollout id); with no
    # checkpoint there yet Slime starts from REF_LOAD / the HF checkpoint. The spool keeps every batch
    # trained after that checkpoint until the next one is written (openclaw_rl.slime_hooks.bridge).
    ckpt = ["--hf-checkpoint", s.hf_ckpt, "--ref-load", s.ref_load, "--load", s.save_ckpt, "--save", s.save_ckpt,
            "--save-interval", str(s.save_interval)]
    if not lora:  # Qwen3-4B-Thinking-2507 uses rope theta 5e6 (the model file's default is 1e6), as upstream
        ckpt += ["--rotary-base", str(s.rotary_base)]
    rollout = ["--disable-rollout-global-dataset", "--rollout-function-path", hooks.rollout, "--num-rollout",
               "100000000", "--rollout-batch-size", str(s.rollout_batch_size), "--n-samples-per-prompt", "1",
               "--rollout-max-response-len", str(memory.MAX_RESPONSE_TOKENS), "--rollout-max-context-len", str(s.context_length),
               "--rollout-temperature", s.proxy["rollout_temperature"], "--reward-key", "score", "--num-steps-per-rollout", "1"]
    if lora:
        perf = ["--use-dynamic-batch-size", "--max-tokens-per-gpu", str(s.max_tokens_per_gpu), "--gradient-checkpointing"]
    else:
        perf = ["--tensor-model-parallel-size", str(s.train_tp), "--sequence-parallel", "--pipeline-model-parallel-size",
                "1", "--context-parallel-size", str(s.context_parallel), "--expert-model-parallel-size", "1",
                "--expert-tensor-parallel-size", "1", "--recompute-granularity", "full", "--recompute-method", "uniform",
                "--recompute-num-layers", "1", "--use-dynamic-batch-size", "--max-tokens-per-gpu",
                str(s.max_tokens_per_gpu), "--log-probs-chunk-size", "1024"]
    optimizer = ["--optimizer", "adam", "--lr", s.lr, "--lr-decay-style", "constant", "--weight-decay", "0.1",
                 "--adam-beta1", "0.9", "--adam-beta2", "0.98"]
    if not lora:
        optimizer += ["--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer"]
    lora_args = ["--use-lora", "--lora-rank", str(s.lora_rank), "--lora-alpha", str(s.lora_alpha),
                 "--lora-target-modules", s.lora_target_modules] if lora else []
    # SGLang knows every parser name the proxy does except "auto" and "none"; it never parses for us (the
    # proxy calls /generate), so those two simply leave SGLang's own setting unset
    parser = s.proxy["tool_parser"]
    sglang = ["--rollout-num-gpus-per-engine", str(s.tp),
              *(["--sglang-tool-call-parser", parser] if parser not in ("auto", "none") else []),
              "--sglang-mem-fraction-static", s.mem_fraction_static, "--sglang-context-length", str(s.context_length),
              "--sglang-reasoning-parser", "qwen3",
              # each stream chunk carries only its new ids and log-probs (SGLang's default repeats all of them
              # in every chunk: O(n^2) bytes per reply); Slime passes every ServerArgs field as --sglang-*
              "--sglang-incremental-streaming-output"]
    misc = [] if lora else ["--attention-dropout", "0.0", "--hidden-dropout", "0.0",
                            "--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32",
                            "--attention-backend", "flash"]
    wandb: list[str] = []
    if s.use_wandb and s.wandb_key_set:
        wandb = ["--use-wandb", "--wandb-project", s.wandb_project, "--wandb-group", s.variant.run_name]
    elif s.use_wandb:
        console.log("W&B logging off: set WANDB_API_KEY (or WANDB_KEY) to enable it, USE_WANDB=0 to silence this")
    # Slime's eval path only (the rollout function replaces generation for training).
    custom = ["--custom-generate-function-path", hooks.generate, "--custom-rm-path", hooks.reward_func]
    # Our settings (openclaw_* keys, incl. the judge URL) reach the proxy through this YAML.
    openclaw = ["--custom-config-path", s.config_path]
    check_parallel_sizes(s, margs)
    groups = [cluster, margs, ckpt, rollout, optimizer, algorithm_args(s), perf, lora_args, [], sglang,
              misc, wandb, custom, openclaw, list(extra)]

    # Every hook named above lives under openclaw_rl / openclaw_opd / openclaw_combine, so the order does not
    # matter for them (Ray puts SLIME_DIR, whose slime_plugins is a regular package, first in any case).
    runtime_env = json.dumps({"env_vars": {"PYTHONPATH": s.pythonpath(), "CUDA_DEVICE_MAX_CONNECTIONS": "1"}},
                             ensure_ascii=False)
    judge = [] if s.prm_url else [
        s.python, "-m", "sglang.launch_server", "--model-path", s.prm_model_path, "--tp-size", str(s.prm_tp),
        "--dp-size", str(s.prm_gpus // s.prm_tp), "--host", judge_host(s), "--port", str(s.prm_port),
        "--mem-fraction-static", s.prm_mem_fraction, "--context-length", str(s.context_length)]
    ray = ["ray", "start", "--head", "--block", "--node-ip-address", s.master_addr, "--port", str(s.ray_port),
           "--num-gpus", str(s.ray_gpus), "--temp-dir", s.ray_temp_dir, "--dashboard-host", "127.0.0.1",
           "--dashboard-port", str(s.ray_dashboard_port), "--disable-usage-stats"]
    if s.node_rank > 0:  # another node: it only joins the head's Ray cluster with all its GPUs (common.sh)
        judge = []
        ray = ["ray", "start", "--block", "--address", f"{s.master_addr}:{s.ray_port}", "--num-gpus", str(s.ray_gpus),
               *(["--node-ip-address", s.node_ip] if s.node_ip else []), "--temp-dir", s.ray_temp_dir,
               "--disable-usage-stats"]
    if s.ray_address:  # an existing cluster: nothing to start, the job goes to its dashboard
        ray = []
    submit = ["ray", "job", "submit", "--address", s.ray_address or f"http://127.0.0.1:{s.ray_dashboard_port}",
              "--runtime-env-json", runtime_env, "--", s.python, f"{s.slime_dir}/train_async.py"]
    return Commands(judge, ray, submit, groups)


def judge_host(s: ScriptSettings) -> str:
    """One node: loopback. Several: the head's address, since Slime's RolloutManager (whose proxy calls the
    judge) is a Ray actor that may run on any node."""
    return s.master_addr if s.num_nodes > 1 else "127.0.0.1"


LOSS_SHAPES = {  # what each custom loss keeps beside the logits (launch/memory.py); none: Slime's policy loss
    "openclaw_combine.loss.combine_loss_function": memory.PPO_LOSS,
    "openclaw_combine.topk_select.topk_select_loss_function": memory.TOPK_SELECT_LOSS,
    "openclaw_opd.loss.topk_distillation_loss_function": memory.TOPK_LOSS,
}


def loss_shape(s: ScriptSettings) -> memory.LossShape:
    """The loss the Megatron job trains with (the custom loss _algorithm_args passes, else Slime's own)."""
    hooks, algorithm = s.mode.slime, s.variant.algorithm
    path = hooks.custom_loss if algorithm == "grpo" else hooks.topk_loss if algorithm in ("opd_topk",
                                                                                          "topk_select") else None
    return LOSS_SHAPES.get(str(path), memory.TOPK_SELECT_LOSS) if path else memory.SLIME_LOSS


def size_for_long_samples(s: ScriptSettings, margs: Sequence[str], console: Console, extra: Sequence[str] = ()) -> None:
    """TRAIN_TP (unless set), CONTEXT_PARALLEL (unless set) and MAX_TOKENS_PER_GPU (unless set) from CONTEXT_LENGTH
    and GPU_MEMORY_GB (launch/memory.py); the arithmetic goes into the dry run. An extra ``--attention-backend``
    of unfused, local or auto (it overrides the scripts' flash) puts the attention scores into the estimate."""
    cp_set = bool(s.context_parallel)
    choice = memory.choose(memory.shape_from_args(margs), actor_gpus=s.actor_gpus, context=s.context_length,
                           gpu_gb=s.gpu_memory_gb, tp=s.train_tp if s.train_tp_set else None,
                           cp=s.context_parallel or None, max_tokens=s.max_tokens_per_gpu if s.max_tokens_set else None,
                           tp_default=s.train_tp,
                           node_gpus=(s.head_ray_gpus, s.gpus_per_node) if s.num_nodes > 1 else (),
                           teacher=s.teacher_source == "trainer", loss=loss_shape(s),
                           unfused_attention=memory.attention_backend(extra) in memory.UNFUSED_BACKENDS)
    if s.actor_gpus % (choice.tp * choice.cp):
        raise LaunchError(f"ACTOR_GPUS={s.actor_gpus} is not a multiple of TRAIN_TP x CONTEXT_PARALLEL = {choice.tp} x "
                          f"{choice.cp}")
    s.train_tp, s.context_parallel, s.max_tokens_per_gpu = choice.tp, choice.cp, choice.max_tokens_per_gpu
    how = {"TRAIN_TP": s.train_tp_set, "CONTEXT_PARALLEL": cp_set, "MAX_TOKENS_PER_GPU": s.max_tokens_set}
    chosen = ", ".join(f"{k}={v}{'' if how[k] else ' (chosen)'}" for k, v in (
        ("TRAIN_TP", choice.tp), ("CONTEXT_PARALLEL", choice.cp), ("MAX_TOKENS_PER_GPU", choice.max_tokens_per_gpu)))
    s.memory_lines = (f"# long samples: CONTEXT_LENGTH={s.context_length}: {chosen}", *choice.lines)
    if choice.warning and s.node_rank == 0:  # said once, by the head
        console.warn(choice.warning)


def check_layout(s: ScriptSettings) -> None:
    """NUM_NODES > 1: where Slime puts each actor rank and engine; refused when a TP group or an engine would
    span nodes, for any address order of the nodes (launch/layout.py)."""
    if s.num_nodes == 1:
        return
    tp = s.train_tp or 1
    if not s.variant.lora and s.train_tp_set and s.actor_gpus % tp:
        return  # check_split refused it already
    options = layout.layouts(s.num_nodes, s.gpus_per_node, s.head_ray_gpus, s.actor_gpus, s.rollout_gpus,
                             0 if s.variant.lora else tp, s.tp)
    for option in options:
        problems = option.problems()
        if problems:
            where = f" when the head is node {option.head} in address order" if len(options) > 1 else ""
            raise LaunchError(f"this layout cannot work{where}: {problems[0]}. Slime sorts its GPUs by node address and "
                              "fills the actor first, then the rollout engines; make each node's Ray GPUs (GPUS_PER_NODE, "
                              "minus PRM_GPUS on the head) and ACTOR_GPUS multiples of TRAIN_TP and TP, or run the judge "
                              "elsewhere (PRM_URL) so every node gives Ray the same GPUs")
    order = " (Slime orders nodes by address; shown with the head first" + (
        ", every place was checked)" if len(options) > 1 else ")")
    s.layout_lines = (f"# layout over {s.num_nodes} nodes{order}:", *options[0].lines())


def exports(s: ScriptSettings) -> list[tuple[str, str]]:
    """The environment the script exports before ``ray start`` (the Slime job inherits it); secrets are
    exported by the script itself from its own environment and never pass through here."""
    no_proxy = "127.0.0.1,localhost"
    if not is_loopback(s.master_addr):
        no_proxy += f",{s.master_addr}"
    return [("PYTHONUNBUFFERED", "1"), ("PYTHONFAULTHANDLER", "1"), ("RAY_health_check_failure_threshold", "20"),
            ("RAY_health_check_period_ms", "5000"), ("RAY_health_check_timeout_ms", "30000"),
            ("RAY_num_heartbeats_timeout", "60"), ("no_proxy", no_proxy), ("NO_PROXY", no_proxy)]


def write_config(s: ScriptSettings, text: str, console: Console) -> None:
    try:
        os.makedirs(s.run_dir, exist_ok=True)
        with open(s.config_path, "w") as f:
            f.write(text + "\n")
    except OSError:
        console.fail(f"cannot write {s.config_path} (set RUN_DIR to a writable directory)")
        return
    try:
        os.chmod(s.config_path, 0o600)
    except OSError:
        pass
