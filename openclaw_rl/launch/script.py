"""A launch script's own settings: its environment variables, resolved over the registry's per-variant
defaults (``modes.LaunchVariant``) and checked (GPU split, tensor-parallel divisibility, paths, tools).

Upstream's names and semantics: ``NAME=""`` counts as unset (Bash's ``${NAME:-default}``), relative paths
are taken from the directory the script was started in, and a problem that only matters for a real launch
(a missing checkpoint, no GPU) is a warning in a dry run (``Console.fail``).

Differences from the Bash this replaced (scripts/lib/common.sh before #13; the recorded dry runs in
tests/data/launch-golden/ are otherwise unchanged): integers are written in canonical form (``ACTOR_GPUS=04``
gives ``4``, where Bash passed ``04`` on and read ``08`` as a bad octal number); ``USE_WANDB`` is truthy
like every other switch (``true``/``yes``/``on`` enable W&B, not only ``1``; a word that is neither yes
nor no is refused); the Ray runtime-env JSON
escapes control characters; a ``MODEL_ARGS_FILE`` is sourced by its own Bash, so only ``MODEL_ARGS`` comes
back from it.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TextIO

from ..config import is_loopback
from ..config_values import FALSE_WORDS, TRUE_WORDS
from ..modes import LaunchVariant, Mode, launch_variant
from .run_config import LaunchError

UINT = re.compile(r"[0-9]+")
NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
HF_NAMES = {"qwen3.5-4b": "Qwen3.5-4B", "qwen3-1.7b": "Qwen3-1.7B"}  # models/<this>: HF_CKPT's default, by model
ROTARY_BASES = {"qwen3.5-4b": 10000000, "qwen3-1.7b": 1000000}  # ROTARY_BASE's default, by model (else 5e6)


def switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    """A yes/no variable: unset or empty is ``default``; a word that is neither yes nor no is refused,
    so a typo (``DRY_RUN=ture``) never quietly means "no"."""
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw not in TRUE_WORDS + FALSE_WORDS:
        raise LaunchError(f"{name} must be one of {'/'.join(w for w in TRUE_WORDS + FALSE_WORDS if w)}, got "
                          f"'{env.get(name)}'")
    return raw in TRUE_WORDS


@dataclass
class Console:
    """The script's messages on stderr, in the order they happen (``[openclaw-rl] ...``)."""

    dry_run: bool
    stream: TextIO = field(default_factory=lambda: sys.stderr)

    def log(self, message: str) -> None:
        print(f"[openclaw-rl] {message}", file=self.stream, flush=True)

    def warn(self, message: str) -> None:
        self.log(f"WARNING: {message}")

    def fail(self, message: str) -> None:
        """A problem that only matters for a real launch: fatal normally, a warning in a dry run."""
        if self.dry_run:
            self.warn(f"{message} (dry run: continuing)")
        else:
            raise LaunchError(message)


@dataclass
class ScriptSettings:
    """Every value the launch uses besides the run config; paths absolute, integers checked."""

    mode: Mode
    variant: LaunchVariant
    script: str  # the script's file name
    repo_root: str
    python: str
    num_gpus: int
    actor_gpus: int
    rollout_gpus: int
    prm_gpus: int
    tp: int
    prm_tp: int
    train_tp: int  # Megatron TP (unused with LoRA)
    prm_url: str
    slime_dir: str
    megatron_dir: str
    hf_ckpt: str
    ref_load: str
    save_ckpt: str
    prm_model_path: str
    run_dir: str
    openclaw_config: str
    model_args_file: str
    context_length: int
    prm_port: int
    mem_fraction_static: str
    prm_mem_fraction: str
    judge_url: str
    rollout_batch_size: int
    lr: str
    save_interval: int
    max_tokens_per_gpu: int
    kl_loss_coef: str
    rotary_base: int
    lora_rank: int
    lora_alpha: int
    lora_target_modules: str
    master_addr: str
    ray_port: int
    ray_dashboard_port: int
    ray_temp_dir: str
    ray_start_timeout: int
    judge_startup_timeout: int
    use_wandb: bool
    wandb_project: str
    wandb_key_set: bool
    user_pythonpath: str
    cuda_visible_devices: str
    num_nodes: int = 1  # NUM_NODES: nodes of the one Ray cluster (check_nodes says what is supported)
    ray_address: str = ""  # RAY_ADDRESS: an existing Ray cluster's dashboard (http://host:8265): joined, not started
    node_ip: str = ""  # NODE_IP: this node's address for Ray (--node-ip-address; a worker's default: Ray's guess)
    single_host_nodes: bool = False  # SINGLE_HOST_NODES: several Ray nodes of one machine on loopback addresses
    train_tp_set: bool = True  # TRAIN_TP given (else chosen with the context parallelism: launch/memory.py)
    context_parallel: int = 0  # CONTEXT_PARALLEL (0: chosen)
    max_tokens_set: bool = True  # MAX_TOKENS_PER_GPU given (else chosen)
    gpu_memory_gb: float = 80.0  # GPU_MEMORY_GB: each actor GPU's memory, for the estimate
    memory_lines: tuple[str, ...] = ()  # the printed arithmetic (slime_args.build)
    layout_lines: tuple[str, ...] = ()  # the printed node layout (slime_args.build)
    gpus_per_node: int = 0  # GPUS_PER_NODE [NUM_GPUS / NUM_NODES]
    node_rank: int = 0  # NODE_RANK: 0 = the head (judge, Ray head, job); others only join Ray
    opd_advantage: str = "auto"  # check_slime_features
    teacher_source: str = "server"  # OPENCLAW_COMBINE_OPD_TEACHER_SOURCE: server, or trainer (slime_hooks/trainer_teacher.py)
    ray_devices: str = ""  # assign_devices
    judge_devices: str = ""
    proxy: dict[str, str] = field(default_factory=dict)  # the run config's resolved proxy values the flags use
    run_dir_default: bool = False  # RUN_DIR unset: results/<run> in this repository (a dry run writes nothing there)

    @property
    def ray_gpus(self) -> int:
        """GPUs this node gives Ray: one node, the actor and rollout ones; several, the head keeps the judge's
        (the judge/teacher server runs on the head, outside Ray) and every other node gives all of its GPUs."""
        if self.num_nodes == 1:
            return self.actor_gpus + self.rollout_gpus
        return self.gpus_per_node - (self.prm_gpus if self.node_rank == 0 else 0)

    @property
    def head_ray_gpus(self) -> int:
        """The GPUs the head node gives Ray (several nodes; an existing cluster: all of them, the judge is PRM_URL)."""
        return self.gpus_per_node - (0 if self.ray_address else self.prm_gpus)

    @property
    def actor_nodes(self) -> tuple[int, int]:
        """Slime's ``--actor-num-nodes`` and ``--actor-num-gpus-per-node`` (their product is what Slime places)."""
        if self.num_nodes > 1 and self.actor_gpus > self.gpus_per_node and self.actor_gpus % self.gpus_per_node == 0:
            return self.actor_gpus // self.gpus_per_node, self.gpus_per_node
        return 1, self.actor_gpus

    @property
    def config_path(self) -> str:  # the run config Slime's --custom-config-path names
        return f"{self.run_dir}/openclaw_{self.mode.name}.yaml"

    def pythonpath(self) -> str:
        """This repository first, then Megatron, then Slime (Ray puts Slime's dir at sys.path[0] anyway)."""
        parts = [self.repo_root, *([self.megatron_dir] if self.megatron_dir else []), self.slime_dir]
        return ":".join(parts + ([self.user_pythonpath] if self.user_pythonpath else []))


def resolve(variant: str, env: Mapping[str, str], *, cwd: str, repo_root: str, script: str) -> ScriptSettings:
    """The environment over the variant's defaults, each value checked in the order upstream's script did."""
    mode, v = launch_variant(variant)

    def get(name: str, default: object = "") -> str:
        return env.get(name) or str(default)

    def uint(name: str, default: object, minimum: int = 0, maximum: int | None = None) -> int:
        raw = get(name, default)
        if not UINT.fullmatch(raw):
            raise LaunchError(f"{name} must be a non-negative integer, got '{raw}'")
        if int(raw) < minimum or (maximum is not None and int(raw) > maximum):
            bounds = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
            raise LaunchError(f"{name} must be {bounds}, got {raw}")
        return int(raw)

    def port(name: str, default: object) -> int:
        return uint(name, default, 1, 65535)

    def number(name: str, default: object, above: float | None = None, at_least: float | None = None,
               at_most: float | None = None) -> str:  # verbatim on the command line ("1e-5" stays "1e-5")
        raw = get(name, default)
        if not NUMBER.fullmatch(raw):
            raise LaunchError(f"{name} must be a number, got '{raw}'")
        x = float(raw)
        if not math.isfinite(x):
            raise LaunchError(f"{name} must be a finite number, got '{raw}'")
        if above is not None and not x > above:
            raise LaunchError(f"{name} must be above {above:g}, got {raw}")
        if at_least is not None and not x >= at_least:
            raise LaunchError(f"{name} must be at least {at_least:g}, got {raw}")
        if at_most is not None and not x <= at_most:
            raise LaunchError(f"{name} must be at most {at_most:g}, got {raw}")
        return raw

    def absolute(path: str) -> str:
        return path if not path or path.startswith("/") else f"{cwd}/{path}"

    prm_url = get("PRM_URL").rstrip("/")
    num_nodes = uint("NUM_NODES", v.num_nodes, 1)
    # several nodes: GPUS_PER_NODE [the variant's NUM_GPUS / its nodes] and NUM_GPUS [NUM_NODES x GPUS_PER_NODE],
    # upstream's _2nodes formula; one node: NUM_GPUS as before (GPUS_PER_NODE unused)
    gpus_per_node = uint("GPUS_PER_NODE", max(v.num_gpus // v.num_nodes, 1), 1)
    num_gpus = uint("NUM_GPUS", gpus_per_node * num_nodes if num_nodes > 1 else v.num_gpus, 1)
    actor_gpus = uint("ACTOR_GPUS", v.actor_gpus)
    node_rank = uint("NODE_RANK", 0, 0, num_nodes - 1)
    rollout_gpus, prm_gpus = uint("ROLLOUT_GPUS", v.rollout_gpus), uint("PRM_GPUS", 0 if prm_url else v.prm_gpus)
    tp = uint("TP", v.tp, 1)
    prm_tp = uint("PRM_TP", tp, 1)
    train_tp = 0 if v.lora else uint("TRAIN_TP", v.train_tp or min(actor_gpus, 4), 1)
    context_parallel = uint("CONTEXT_PARALLEL", 0, 0, 64)
    gpu_memory_gb = float(number("GPU_MEMORY_GB", 80, above=0))

    slime_dir = absolute(get("SLIME_DIR", cwd))
    megatron_dir = get("MEGATRON_DIR")
    if not megatron_dir and os.path.isdir(f"{slime_dir}/../Megatron-LM"):
        megatron_dir = os.path.normpath(f"{slime_dir}/../Megatron-LM")
    hf_name = HF_NAMES.get(v.model) or ("Qwen3-4B" if v.lora else "Qwen3-4B-Thinking-2507")
    # Qwen3.5's rope theta is 1e7 (Slime's scripts/models/qwen3.5-4B.sh; upstream's rl/opd scripts then pass 5e6);
    # Qwen3-1.7B's 1e6 (Slime's scripts/models/qwen3-1.7B.sh, which upstream's OEL script sources)
    rotary = ROTARY_BASES.get(v.model, 5000000)
    hf_ckpt = absolute(get("HF_CKPT", f"{repo_root}/models/{hf_name}"))
    prm_model_path = get("PRM_MODEL_PATH", "" if prm_url else hf_ckpt)  # with PRM_URL: the judge's tokenizer
    context_length = uint("CONTEXT_LENGTH", 32768, 1)
    prm_port = port("PRM_PORT", 30010)
    judge_startup_timeout = uint("JUDGE_STARTUP_TIMEOUT", 1200, 1)
    mem_fraction = number("MEM_FRACTION_STATIC", v.mem_fraction, above=0, at_most=1)
    prm_mem_fraction = number("PRM_MEM_FRACTION", mem_fraction, above=0, at_most=1)
    ints = {name: uint(name, default, 1) for name, default in (
        ("ROLLOUT_BATCH_SIZE", v.rollout_batch_size), ("SAVE_INTERVAL", v.save_interval),
        ("MAX_TOKENS_PER_GPU", 8192 if v.lora else 32768), ("ROTARY_BASE", rotary), ("LORA_RANK", 16),
        ("LORA_ALPHA", 32))}
    lr, kl_loss_coef = number("LR", v.lr, above=0), number("KL_LOSS_COEF", "0.0", at_least=0)
    ray_port_raw = get("RAY_PORT", 6379)
    ray_port, ray_dashboard_port = port("RAY_PORT", 6379), port("RAY_DASHBOARD_PORT", 8265)
    ray_start_timeout = uint("RAY_START_TIMEOUT", 180, 1)
    return ScriptSettings(
        mode=mode, variant=v, script=script, repo_root=repo_root, python=get("PYTHON", "python3"),
        num_nodes=num_nodes, gpus_per_node=gpus_per_node, node_rank=node_rank,
        num_gpus=num_gpus, actor_gpus=actor_gpus, rollout_gpus=rollout_gpus, prm_gpus=prm_gpus, tp=tp,
        prm_tp=prm_tp, train_tp=train_tp, prm_url=prm_url, slime_dir=slime_dir,
        megatron_dir=absolute(megatron_dir) if megatron_dir else "", hf_ckpt=hf_ckpt,
        ref_load=absolute(get("REF_LOAD", hf_ckpt)), save_ckpt=absolute(get("SAVE_CKPT", f"{repo_root}/ckpt/{v.run_name}")),
        prm_model_path=absolute(prm_model_path) if prm_model_path else "",
        run_dir=absolute(get("RUN_DIR", f"{repo_root}/results/{v.run_name}")),
        openclaw_config=absolute(get("OPENCLAW_CONFIG", f"{repo_root}/configs/openclaw_{mode.name}.yaml")),
        model_args_file=absolute(get("MODEL_ARGS_FILE")), context_length=context_length, prm_port=prm_port,
        mem_fraction_static=mem_fraction, prm_mem_fraction=prm_mem_fraction,
        judge_url=prm_url or f"http://{get('MASTER_ADDR', '127.0.0.1') if num_nodes > 1 else '127.0.0.1'}:{prm_port}", rollout_batch_size=ints["ROLLOUT_BATCH_SIZE"], lr=lr,
        save_interval=ints["SAVE_INTERVAL"], max_tokens_per_gpu=ints["MAX_TOKENS_PER_GPU"], kl_loss_coef=kl_loss_coef,
        rotary_base=ints["ROTARY_BASE"], lora_rank=ints["LORA_RANK"], lora_alpha=ints["LORA_ALPHA"],
        lora_target_modules=get("LORA_TARGET_MODULES", LORA_TARGETS), master_addr=get("MASTER_ADDR", "127.0.0.1"),
        ray_port=ray_port, ray_dashboard_port=ray_dashboard_port,
        ray_temp_dir=absolute(get("RAY_TEMP_DIR", f"/tmp/openclaw_rl_ray_{ray_port_raw}")),
        ray_start_timeout=ray_start_timeout, judge_startup_timeout=judge_startup_timeout,
        use_wandb=switch(env, "USE_WANDB", True), wandb_project=get("WANDB_PROJECT", "openclaw_rl"),
        wandb_key_set=bool(get("WANDB_KEY") or get("WANDB_API_KEY")), user_pythonpath=get("PYTHONPATH"),
        cuda_visible_devices=get("CUDA_VISIBLE_DEVICES"), run_dir_default=not env.get("RUN_DIR"),
        ray_address=get("RAY_ADDRESS").rstrip("/"), node_ip=get("NODE_IP"),
        single_host_nodes=switch(env, "SINGLE_HOST_NODES", False), train_tp_set=bool(env.get("TRAIN_TP")),
        context_parallel=context_parallel, max_tokens_set=bool(env.get("MAX_TOKENS_PER_GPU")),
        gpu_memory_gb=gpu_memory_gb)


def check_split(s: ScriptSettings, console: Console) -> None:
    """The GPU split and tensor-parallel sizes; frees PRM_GPUS when an external judge is used."""
    used = s.actor_gpus + s.rollout_gpus + s.prm_gpus
    if s.actor_gpus < 1 or s.rollout_gpus < 1:
        raise LaunchError(f"ACTOR_GPUS ({s.actor_gpus}) and ROLLOUT_GPUS ({s.rollout_gpus}) must both be at least 1")
    if used > s.num_gpus:
        raise LaunchError(
            f"bad GPU split: ACTOR_GPUS + ROLLOUT_GPUS + PRM_GPUS = {s.actor_gpus} + {s.rollout_gpus} + {s.prm_gpus} = "
            f"{used}, more than NUM_GPUS={s.num_gpus}. Lower one of them, or run the judge elsewhere "
            "(PRM_URL=http://host:port, PRM_GPUS=0). Layouts: docs/deployment.md")
    if s.prm_url:
        if not re.fullmatch(r"https?://[^/\s?#]+(/[^\s?#]*)?", s.prm_url, re.IGNORECASE):
            raise LaunchError(f"PRM_URL must look like http://host:port (or a path prefix a gateway serves SGLang "
                              f"under), got '{s.prm_url}'")
        if re.search(r"/(v1|generate|health)$", s.prm_url):
            raise LaunchError(f"PRM_URL is the server's base URL, without {s.prm_url[s.prm_url.rindex('/'):]}: the "
                              f"script checks <PRM_URL>/health and the judge calls <PRM_URL>/generate; got "
                              f"'{s.prm_url}'")
        if s.prm_gpus > 0:
            console.warn(f"PRM_URL is set, so no judge server is launched here and the {s.prm_gpus} PRM_GPUS stay "
                         "idle; using PRM_GPUS=0")
            s.prm_gpus = 0
    elif s.prm_gpus == 0:
        raise LaunchError(
            "PRM_GPUS=0 but no PRM_URL: the judge/teacher needs either its own GPUs (PRM_GPUS >= 1) or an external "
            "SGLang server (PRM_URL=http://host:port). Without a judge every turn scores 0 and nothing is learned.")
    if s.tp < 1 or s.rollout_gpus % s.tp:
        raise LaunchError(f"ROLLOUT_GPUS={s.rollout_gpus} is not a multiple of the rollout engine TP={s.tp}")
    if s.prm_gpus > 0 and (s.prm_tp < 1 or s.prm_gpus % s.prm_tp):
        raise LaunchError(f"PRM_GPUS={s.prm_gpus} is not a multiple of the judge TP PRM_TP={s.prm_tp}")
    if not s.variant.lora and (s.train_tp < 1 or s.actor_gpus % s.train_tp):
        raise LaunchError(f"ACTOR_GPUS={s.actor_gpus} is not a multiple of the Megatron tensor-parallel size "
                          f"TRAIN_TP={s.train_tp}")
    check_nodes(s)


def check_nodes(s: ScriptSettings) -> None:
    """NUM_NODES > 1: one Ray cluster over the nodes, started by this script (node 0: the judge/teacher server
    outside Ray, the Ray head and the job; the others join with all their GPUs) or an existing one
    (RAY_ADDRESS; the judge then is PRM_URL). Every Ray GPU is used (Slime's PACK placement group over fewer
    GPUs than Ray has would choose the nodes itself); where the actor ranks and engines land and whether a TP
    group spans nodes: ``launch/layout.py`` (checked in ``slime_args.build``, once TRAIN_TP is known)."""
    if s.ray_address:
        if not re.fullmatch(r"https?://[^/\s?#]+", s.ray_address):
            raise LaunchError(f"RAY_ADDRESS must be the existing Ray cluster's dashboard, http://host:8265 (what "
                              f"`ray job submit --address` takes), got '{s.ray_address}'")
        if not s.prm_url:
            raise LaunchError("RAY_ADDRESS joins an existing Ray cluster, whose GPUs this script does not manage: run "
                              "the judge/teacher as its own SGLang server and set PRM_URL=http://host:port (PRM_GPUS=0)")
        if s.node_rank:
            raise LaunchError("RAY_ADDRESS: the cluster is up already, there is no node to join; unset NODE_RANK")
    if s.num_nodes == 1:
        return
    if s.num_gpus != s.num_nodes * s.gpus_per_node:
        raise LaunchError(f"NUM_GPUS={s.num_gpus} must be NUM_NODES x GPUS_PER_NODE = {s.num_nodes} x "
                          f"{s.gpus_per_node} with NUM_NODES > 1")
    if s.prm_gpus >= s.gpus_per_node:
        raise LaunchError(f"PRM_GPUS={s.prm_gpus} must leave Ray at least one GPU on the head node "
                          f"(GPUS_PER_NODE={s.gpus_per_node}); or run the judge elsewhere (PRM_URL)")
    ray_total = s.num_nodes * s.gpus_per_node - (0 if s.ray_address else s.prm_gpus)
    if s.actor_gpus + s.rollout_gpus != ray_total:
        raise LaunchError(
            f"too few or too many GPUs for the nodes: Ray gets NUM_NODES x GPUS_PER_NODE - PRM_GPUS = {s.num_nodes} x "
            f"{s.gpus_per_node} - {0 if s.ray_address else s.prm_gpus} = {ray_total} GPUs, but ACTOR_GPUS + "
            f"ROLLOUT_GPUS = {s.actor_gpus} + {s.rollout_gpus} = {s.actor_gpus + s.rollout_gpus}. ROLLOUT_GPUS is "
            f"the total over all nodes (not per node): set ROLLOUT_GPUS={ray_total - s.actor_gpus} (Slime's placement "
            "group must take every Ray GPU, or it chooses the nodes itself)")
    if is_loopback(s.master_addr) and not s.ray_address and not s.single_host_nodes:
        raise LaunchError(f"NUM_NODES={s.num_nodes} needs MASTER_ADDR set to the head node's address that the other "
                          f"nodes reach (got {s.master_addr}; SINGLE_HOST_NODES=1 for Ray nodes of one machine)")


def check_ports(s: ScriptSettings) -> None:
    """The proxy, the judge server and Ray each need a port of their own (a clash would surface only after
    the judge and Ray had started, as a proxy that cannot bind inside the Slime job)."""
    ports = {"PORT": int(s.proxy["port"]), "RAY_PORT": s.ray_port, "RAY_DASHBOARD_PORT": s.ray_dashboard_port,
             **({} if s.prm_url else {"PRM_PORT": s.prm_port})}
    if ports["PORT"] == 0:
        raise LaunchError("PORT must be a fixed port (1-65535): OpenClaw is configured with it")
    seen: dict[int, str] = {}
    for name, value in ports.items():
        if value in seen:
            raise LaunchError(f"{name} and {seen[value]} are both {value}: each service needs a port of its own")
        seen[value] = name


def warn_unused(s: ScriptSettings, env: Mapping[str, str], console: Console) -> None:
    """Variables this variant does not read, named in a warning rather than silently dropped."""
    if s.prm_url:
        judge_only = [n for n in ("PRM_TP", "PRM_PORT", "PRM_MEM_FRACTION") if env.get(n)]
        if judge_only:
            console.warn(f"{', '.join(judge_only)} ignored: PRM_URL names an external judge, which this script does "
                         "not start")
    unused = [n for n in ("LORA_RANK", "LORA_ALPHA", "LORA_TARGET_MODULES") if env.get(n) and not s.variant.lora]
    unused += [n for n in ("TRAIN_TP",) if env.get(n) and s.variant.lora]
    unused += [n for n in ("OPD_ADVANTAGE",) if env.get(n) and s.variant.algorithm != "opd_token"]
    if unused:
        console.warn(f"{', '.join(unused)} ignored by {s.script} (not used by the {s.variant.name} variant)")
    if s.mode.name == "oel":
        for name, instead in UPSTREAM_OEL_VARS.items():
            if env.get(name):
                console.warn(f"{name} (upstream's OEL script) is ignored: {instead}")


# Upstream's run_qwen3_1.7b_openclaw_oel_online.sh variables and what this repository has instead
UPSTREAM_OEL_VARS = {
    "OPENCLAW_OEL_SESSION_EXPERIENCE": "experience is extracted once a session ends (upstream's 2); "
                                       "openclaw_oel_accumulate: true in OPENCLAW_CONFIG merges it across sessions (0)",
    "OPENCLAW_OEL_EXPERIENCE_MAX_LENGTH": "set openclaw_oel_max_experience_tokens in OPENCLAW_CONFIG",
    "OPENCLAW_OEL_EXTRACTION_PROMPT": "one extraction prompt, openclaw_oel/experience.py",
    "TOPK_SOURCE": "the top-K ids are the teacher's (upstream's default, teacher)",
    "OPENCLAW_UPDATE_PRM_WEIGHTS": "the teacher stays frozen (upstream's default, 0)",
    "TRAIN_STEPS": "one optimizer step per rollout; ROLLOUT_BATCH_SIZE sets the samples a step",
}


def check_paths(s: ScriptSettings, console: Console) -> None:
    if not os.path.isfile(f"{s.slime_dir}/train_async.py"):
        console.fail(f"no train_async.py in SLIME_DIR={s.slime_dir}: run this script from a Slime checkout (cd "
                     f"/path/to/slime && bash {s.repo_root}/scripts/{s.script}) or set SLIME_DIR")
    for name, path, what in (("HF_CKPT", s.hf_ckpt, "the Hugging Face checkpoint of the policy"),
                             ("REF_LOAD", s.ref_load, "the reference / initial checkpoint")):
        if not os.path.exists(path):
            console.fail(f"{name}={path} does not exist ({what})")
    if s.prm_model_path and not os.path.exists(s.prm_model_path):
        what = "the external judge's tokenizer" if s.prm_url else "the judge/teacher model served on the PRM GPUs"
        console.fail(f"PRM_MODEL_PATH={s.prm_model_path} does not exist ({what})")
    if not os.path.isfile(s.openclaw_config):
        raise LaunchError(f"OPENCLAW_CONFIG={s.openclaw_config} does not exist")
    if s.model_args_file and not os.path.isfile(s.model_args_file):
        raise LaunchError(f"MODEL_ARGS_FILE={s.model_args_file} does not exist")
    if s.megatron_dir and not os.path.isdir(s.megatron_dir):
        console.fail(f"MEGATRON_DIR={s.megatron_dir} does not exist")


def check_tools(s: ScriptSettings, console: Console, path: str) -> None:
    nvidia_smi = shutil.which("nvidia-smi", path=path)
    if s.ray_address:  # an existing cluster: this machine only submits the job
        pass
    elif nvidia_smi is None:
        console.fail(f"nvidia-smi not found: this script needs {s.num_gpus} NVIDIA GPU(s). Without GPUs use the "
                     "embedded stack (bash scripts/run_local.sh)")
    else:
        listing = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, check=False).stdout
        count = sum(line.startswith("GPU ") for line in listing.splitlines())
        here = s.num_gpus if s.num_nodes == 1 else s.gpus_per_node
        if count < here:
            node = f" ({here} on this node)" if s.num_nodes > 1 else ""
            console.fail(f"NUM_GPUS={s.num_gpus}{node} but nvidia-smi lists {count} GPU(s); lower NUM_GPUS and the split "
                         "(docs/deployment.md)")
    for tool in ("ray", "curl", "setsid", s.python):
        if shutil.which(tool, path=path) is None:
            console.fail(f"'{tool}' not found on PATH (install Slime's environment: Ray, SGLang, curl, util-linux)")


def assign_devices(s: ScriptSettings) -> None:
    """The GPUs Ray manages come first (actor, then rollout, in Slime's placement order), the judge's last."""
    if s.ray_address:  # an existing cluster: this machine only submits the job
        return
    here = s.num_gpus if s.num_nodes == 1 else s.gpus_per_node  # the GPUs of this node
    visible = s.cuda_visible_devices.split(",") if s.cuda_visible_devices else [str(i) for i in range(here)]
    if visible and visible[-1] == "":  # "0,1," lists two devices, as Bash's read does
        visible.pop()
    if any(d != d.strip() or not d for d in visible) or len(set(visible)) != len(visible):
        raise LaunchError(f"CUDA_VISIBLE_DEVICES={s.cuda_visible_devices} must list distinct devices separated by "
                          "commas, without spaces")
    judge_here = s.prm_gpus if s.node_rank == 0 else 0  # several nodes: the judge runs on the head only
    need = s.ray_gpus + judge_here
    if len(visible) < need:
        raise LaunchError(f"CUDA_VISIBLE_DEVICES={s.cuda_visible_devices} lists {len(visible)} GPU(s) but the split "
                          f"needs {need}")
    s.ray_devices = ",".join(visible[:s.ray_gpus])
    s.judge_devices = ",".join(visible[s.ray_gpus:need]) if judge_here > 0 else ""


def check_slime_features(s: ScriptSettings, env: Mapping[str, str], console: Console) -> None:
    """Slime silently ignores unknown flags, so a variant run on a Slime that lacks one of its features would
    start, wait for live chat and then train something else or crash. ``openclaw_rl.slime_hooks.features``
    imports the Slime in SLIME_DIR (with Slime's Python, PYTHON) and says what is missing, with a Slime
    commit that has it; for token-level OPD it also picks the advantage path (OPD_ADVANTAGE)."""
    s.opd_advantage = env.get("OPD_ADVANTAGE") or "auto"
    if s.opd_advantage not in ("auto", "estimator", "custom"):
        raise LaunchError(f"OPD_ADVANTAGE must be auto, estimator or custom, got '{s.opd_advantage}'")
    name = s.variant.name
    if switch(env, "SKIP_SLIME_FEATURE_CHECK", False):
        console.warn(f"SKIP_SLIME_FEATURE_CHECK=1: the Slime in {s.slime_dir} is not checked for what {name} needs")
    else:
        res = subprocess.run([s.python, "-m", "openclaw_rl.slime_hooks.features", name, "--opd-advantage",
                              s.opd_advantage, "--teacher-source", s.teacher_source], cwd=s.repo_root, env={**env, "PYTHONPATH": s.pythonpath()},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        out = res.stdout.rstrip("\n")
        messages = ""
        for line in out.split("\n"):
            if line.startswith("opd_advantage="):
                s.opd_advantage = line.removeprefix("opd_advantage=")
            else:
                messages += ("; " if messages else "") + line
        if res.returncode == 3:
            console.fail(f"the Slime in SLIME_DIR={s.slime_dir} cannot run {name}: {messages} "
                         "(SKIP_SLIME_FEATURE_CHECK=1 skips this check)")
        elif res.returncode == 4:
            console.fail(f"cannot check the Slime in SLIME_DIR={s.slime_dir} (run this script in Slime's Python "
                         f"environment, or set PYTHON): {out.replace(chr(10), '; ')}")
        elif res.returncode != 0:
            raise LaunchError(f"the Slime feature check failed (status {res.returncode}): {out}")
    if s.mode.name == "opd" and s.opd_advantage == "auto":
        s.opd_advantage = "custom"  # not inspected: THUDM/slime's advantage hook
    if s.variant.algorithm == "opd_token":
        how = " (the teacher inside the trainer: Slime's grpo, then A = teacher - old in the postprocess hook)" \
            if s.teacher_source == "trainer" and s.opd_advantage == "estimator" else ""
        console.log(f"token-level OPD advantage: OPD_ADVANTAGE={s.opd_advantage}{how}")
