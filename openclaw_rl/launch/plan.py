"""``python -m openclaw_rl.launch plan <variant>``: everything a launch script needs, resolved and checked.

The script (``scripts/lib/common.sh``) keeps what must be shell: refusals of its own, starting and
stopping processes, traps. It runs this with its environment and ``eval``s the output, a list of
assignments whose every word is single-quoted for a POSIX shell (``quote``; the same quoting makes the
printed commands paste-able): the commands to start (``OC_JUDGE_CMD``, ``OC_RAY_CMD``, ``OC_TRAIN_CMD``
arrays), the environment to export (``OC_ENV``), the values its waits and port checks need, and the
dry-run printout (``OC_PLAN``). Along the way the run config is written to ``$RUN_DIR`` (not by a dry run
with ``RUN_DIR`` unset: its default is inside this repository). Warnings go to
stderr as they happen; a refusal is ``[openclaw-rl] ERROR: ...`` on stderr and exit status 2.
``--json`` prints the same as one JSON object instead, for tools.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import is_loopback
from ..modes import launch_variant
from . import refusals, run_config, script, slime_args
from .refusals import TEACHER_SOURCE
from .script import Console, ScriptSettings
from .slime_args import Commands

SCORED_HINT_RULES = ("sequence_optimal", "token_optimal")  # openclaw_opd.selection.SCORED: a teacher call per candidate

SAFE = re.compile(r"[A-Za-z0-9_./:=,@%+-]+")
# run-config defaults of a launch model other than Qwen3-4B (upstream's run_qwen35_4b_openclaw_*.sh)
MODEL_PROXY_DEFAULTS = {"qwen3.5-4b": {"proxy_served_model_name": "qwen3.5-4b", "proxy_tool_parser": "qwen3_coder"},
                        "qwen3-1.7b": {"proxy_served_model_name": "qwen3-1.7b"}}
SECRETS = ("SGLANG_API_KEY", "PRM_API_KEY", "TEACHER_API_KEY", "WANDB_API_KEY")  # exported by the script, shown as "<set>" only


def quote(word: str) -> str:
    """One word for a POSIX shell, quoted only when it needs it."""
    return word if SAFE.fullmatch(word) else "'" + word.replace("'", "'\\''") + "'"


def join(words: Sequence[str]) -> str:
    return " ".join(quote(w) for w in words)


def train_text(s: ScriptSettings, c: Commands) -> str:
    """The training command, one argument group per line (shell continuation lines: paste-able)."""
    sep = c.submit.index("--")
    lines = [join(c.submit[:sep - 2]), f"  --runtime-env-json {quote(c.submit[sep - 1])}", f"  -- {join(c.submit[sep + 1:])}"]
    lines += [f"  {join(g)}" for g in c.groups if g]
    return " \\\n".join(lines)


def proxy_url(s: ScriptSettings) -> str:
    host = s.proxy["host"]
    return f"http://{f'[{host}]' if ':' in host else host}:{s.proxy['port']}/v1"  # an IPv6 address in brackets


def worker_text(s: ScriptSettings, c: Commands) -> str:
    """NODE_RANK > 0: this node only joins the head's Ray cluster (the head runs the judge and the job)."""
    return "\n".join([
        f"# {s.variant.run_name}: node {s.node_rank} of NUM_NODES={s.num_nodes}: joins the Ray cluster of the head "
        f"node {s.master_addr}:{s.ray_port} with its {s.ray_gpus} GPU(s) {s.ray_devices}; the head (NODE_RANK=0) starts "
        "the judge, the Ray head and the training job",
        "", f"# --- Ray worker (log: {s.run_dir}/ray.log) ---", f"CUDA_VISIBLE_DEVICES={s.ray_devices} setsid {join(c.ray)}",
        "", "# --- on exit: stop the process group of the Ray worker (started by this script), nothing else ---"])


def nodes_text(s: ScriptSettings) -> list[str]:
    """Several nodes: who starts what, where Slime puts each actor rank and engine, who reaches the proxy."""
    if s.ray_address:
        head = (f"# nodes: NUM_NODES={s.num_nodes} x GPUS_PER_NODE={s.gpus_per_node} of the existing Ray cluster "
                f"{s.ray_address} (RAY_ADDRESS): nothing is started here but the job; the judge is PRM_URL")
    else:
        head = (f"# nodes: NUM_NODES={s.num_nodes} x GPUS_PER_NODE={s.gpus_per_node}; this is the head (NODE_RANK=0): judge "
                f"and Ray head here; start the others with NODE_RANK=1..{s.num_nodes - 1} MASTER_ADDR={s.master_addr} "
                "(and NODE_IP=<their address> where Ray's guess is wrong)")
    actor_nodes, per_node = s.actor_nodes
    out = [head, f"# Slime: --actor-num-nodes {actor_nodes} --actor-num-gpus-per-node {per_node} --rollout-num-gpus "
           f"{s.rollout_gpus} (the total over all nodes) --num-gpus-per-node {s.gpus_per_node}", *s.layout_lines]
    if s.num_nodes > 1:
        reach = (f"reachable from every node and client at <that node>:{s.proxy['port']}" if not is_loopback(s.proxy["host"])
                 else "on 127.0.0.1 of that node only (PROXY_HOST=0.0.0.0 with SGLANG_API_KEY makes it reachable)")
        out.append(f"# proxy: inside Slime's RolloutManager, a Ray actor that Ray may place on any node; it binds "
                   f"{s.proxy['host']}: {reach}; its log and <run dir>/spool/proxy_address name the node. The judge listens on {s.judge_url}")
    return out


def plan_text(s: ScriptSettings, c: Commands, config_text: str, env: Mapping[str, str]) -> str:
    if s.node_rank > 0:
        return worker_text(s, c)
    if s.prm_url:
        judge = f"external SGLang server {s.prm_url} (not started or stopped by this script)"
    else:
        judge = f"SGLang server on GPU(s) {s.judge_devices} (TP {s.prm_tp}), started by this script"
    auth = "API key required" if env.get("SGLANG_API_KEY") else "no API key"
    secrets_set = {"SGLANG_API_KEY": bool(env.get("SGLANG_API_KEY")), "PRM_API_KEY": bool(env.get("PRM_API_KEY")),
                   "TEACHER_API_KEY": bool(env.get("TEACHER_API_KEY")), "WANDB_API_KEY": s.wandb_key_set}
    out = [
        f"# {s.variant.run_name}: mode {s.mode.name}, {s.variant.trains}",
        f"# GPUs: ACTOR_GPUS={s.actor_gpus} + ROLLOUT_GPUS={s.rollout_gpus} (SGLang TP {s.tp}) + PRM_GPUS={s.prm_gpus} "
        f"of NUM_GPUS={s.num_gpus}; "
        + (f"Ray gets GPU(s) {s.ray_devices}" if not s.ray_address else "Ray: the existing cluster's GPUs"),
        *(nodes_text(s) if s.num_nodes > 1 or s.ray_address else []),
        *s.memory_lines,
        *([f"# judge: {s.judge_url}, {judge}", f"# teacher: external SGLang server {env['TEACHER_URL']} (TEACHER_URL; "
           "not started or stopped by this script)"] if env.get("TEACHER_URL") and s.mode.needs_teacher
          else [f"# judge/teacher: {s.judge_url}, {judge}"]),
        f"# proxy for OpenClaw: {proxy_url(s)} ({auth}), model id "
        f"{s.proxy['served_model_name']}",
        f"# run dir: {s.run_dir} (spool, records, logs); run config: {s.config_path}",
        "",
        "# --- environment, exported before ray start (the Slime job inherits it) ---",
        *(f"export {k}={quote(v)}" for k, v in slime_args.exports(s)),
        *(f"export {k}=<set, not shown>" for k in SECRETS if secrets_set[k]),
        "",
        f"# --- run config ({s.config_path}) ---",
        config_text,
    ]
    if c.judge:
        out += ["", f"# --- 1. judge/teacher server (log: {s.run_dir}/judge.log), then wait for {s.judge_url}/health ---",
                f"CUDA_VISIBLE_DEVICES={s.judge_devices} setsid {join(c.judge)}"]
    else:
        out += ["", f"# --- 1. judge/teacher: external, health-checked at {s.judge_url}/health ---"]
    if s.ray_address:
        out += ["", f"# --- 2. existing Ray cluster {s.ray_address} (RAY_ADDRESS): not started or stopped by this script ---"]
    else:
        out += ["", f"# --- 2. private Ray head (log: {s.run_dir}/ray.log), cwd {s.slime_dir} ---",
                f"CUDA_VISIBLE_DEVICES={s.ray_devices} setsid {join(c.ray)}"]
    out += ["", "# --- 3. training job ---", train_text(s, c),
            "", "# --- on exit: stop the process groups of 1 and 2 (started by this script), nothing else ---"]
    return "\n".join(out)


def make_plan(variant: str, env: Mapping[str, str], *, cwd: str, repo_root: str, script_name: str, dry_run: bool,
              extra: Sequence[str], console: Console) -> dict[str, Any]:
    """Resolve, check, write the run config; the values the script needs. Raises LaunchError."""
    slime_args.check_extra(extra)
    env = {**env, **refusals.check_variant(variant, env, script_name, console)}
    s = script.resolve(variant, env, cwd=cwd, repo_root=repo_root, script=script_name)
    s.teacher_source = refusals.trainer_teacher(env, script_name, variant)
    script.check_split(s, console)
    script.warn_unused(s, env, console)
    script.check_paths(s, console)
    script.check_tools(s, console, env.get("PATH", os.defpath))
    script.assign_devices(s)
    script.check_slime_features(s, env, console)
    v = s.variant
    hint_selection = v.hint_selection
    if s.teacher_source == "trainer" and hint_selection in SCORED_HINT_RULES:
        # the scored rules call the teacher server once per candidate hint in the proxy; the in-trainer teacher
        # runs after the proxy has chosen, so topk_select takes upstream's single (longest) hint
        hint_selection = "longest"
    defaults = {"judge_votes": str(v.prm_m), "judge_max_new_tokens": str(v.prm_max_new_tokens),
                "opd_eval_mode": str(int(v.eval_mode)), "opd_teacher_concurrency": str(v.teacher_concurrency),
                "opd_distill_topk": str(v.distill_topk),
                **({"combine_loss": v.combine_loss} if v.combine_loss else {}),
                **({"opd_hint_selection": hint_selection} if hint_selection else {}),
                **MODEL_PROXY_DEFAULTS.get(v.model, {})}
    config_text, values, warnings = run_config.build(
        s.mode.name, script_name, Path(s.openclaw_config), Path(s.run_dir), s.judge_url, s.prm_model_path,
        defaults, env)
    for w in warnings:
        console.warn(w)
    if hint_selection != v.hint_selection and values.get("opd_hint_selection") == hint_selection:  # the default taken
        console.warn(f"{TEACHER_SOURCE}=trainer: {v.name}'s hint selection {v.hint_selection} scores candidates with a "
                     "teacher server in the proxy; the in-trainer teacher scores the longest hint "
                     "(OPENCLAW_TOPK_HINT_SELECTION=shortest picks the other unscored rule)")
    # the Slime loss is chosen by the variant's algorithm: a run config naming the other combine loss would
    # have the proxy and the job disagree on what is trained
    wanted = values.get("combine_loss")
    if wanted is not None and (wanted == "topk_select") != (v.algorithm == "topk_select"):
        other = "run_qwen3_4b_openclaw_topk_select.sh" if wanted == "topk_select" else "run_qwen3_4b_openclaw_combine.sh"
        raise run_config.LaunchError(f"openclaw_combine_loss is {wanted!r} but {script_name} trains "
                                     f"{v.combine_loss or 'ppo'}; use {other} (unset OPENCLAW_COMBINE_LOSS)")
    s.proxy = {k.removeprefix("proxy_"): str(values[k]) for k in (
        "proxy_host", "proxy_port", "proxy_served_model_name", "proxy_tool_parser", "proxy_rollout_temperature")}
    script.check_ports(s)
    secrets_here = [k for k in SECRETS if env.get(k)]
    if s.ray_address and secrets_here:
        console.warn(f"RAY_ADDRESS: {', '.join(secrets_here)} set here do not reach the job, which runs on the existing "
                     "cluster's head in the environment of its `ray start`: export them there. They are never put on the "
                     "job's command line or in its runtime env (both are visible to anyone who can list Ray's jobs)")
    if s.num_nodes > 1 and s.node_rank == 0 and is_loopback(s.proxy["host"]):
        console.warn(f"NUM_NODES={s.num_nodes}: the proxy runs in Slime's RolloutManager, which Ray may place on any node; "
                     f"PROXY_HOST={s.proxy['host']} is reachable only from that node (PROXY_HOST=0.0.0.0 with "
                     "SGLANG_API_KEY reaches it from every node)")
    commands = slime_args.build(s, extra, console, cwd)
    if dry_run and s.run_dir_default:  # a look at the plan leaves no file in the repository
        console.log(f"dry run: the run config is printed below, not written to {s.config_path} (a real launch "
                    "writes it there; set RUN_DIR to choose the run directory)")
    else:
        slime_args.write_config(s, config_text, console)
    return {
        # resolved by the typed config (the Slime job's environment keeps them consistent with the run config)
        "PROXY_HOST": s.proxy["host"], "PORT": s.proxy["port"], "SERVED_MODEL_NAME": s.proxy["served_model_name"],
        "TOOL_CALL_PARSER": s.proxy["tool_parser"], "ROLLOUT_TEMPERATURE": s.proxy["rollout_temperature"],
        # what the launch itself uses (ports to check, waits, working directory, logs)
        "SLIME_DIR": s.slime_dir, "RUN_DIR": s.run_dir, "PRM_URL": s.prm_url, "PRM_PORT": str(s.prm_port),
        "RAY_PORT": str(s.ray_port), "RAY_DASHBOARD_PORT": str(s.ray_dashboard_port), "RAY_TEMP_DIR": s.ray_temp_dir,
        "RAY_START_TIMEOUT": str(s.ray_start_timeout), "JUDGE_STARTUP_TIMEOUT": str(s.judge_startup_timeout),
        "OC_JUDGE_URL": s.judge_url, "OC_PROXY_URL": proxy_url(s), "OC_JUDGE_DEVICES": s.judge_devices, "OC_RAY_DEVICES": s.ray_devices,
        "OC_ENV": [f"{k}={val}" for k, val in slime_args.exports(s)],
        "OC_JUDGE_CMD": commands.judge, "OC_RAY_CMD": commands.ray, "OC_TRAIN_CMD": commands.train,
        "OC_NODE_RANK": str(s.node_rank), "OC_RAY_ADDRESS": s.ray_address,
        "OC_PLAN": plan_text(s, commands, config_text, env) if dry_run else "",
    }


def shell_assignments(values: Mapping[str, Any]) -> str:
    return "\n".join(f"{k}=({join(v)})" if isinstance(v, list) else f"{k}={quote(v)}"
                     for k, v in values.items())


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:  # the script's own arguments: appended to Slime's flags
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    p = argparse.ArgumentParser(prog="python -m openclaw_rl.launch", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("plan", help="resolve and check a launch script's settings; print shell assignments")
    c.add_argument("variant", help="the script's variant (rl, rl_lora, opd, ...: modes.LaunchVariant)")
    c.add_argument("--script", help="the script's file name (messages, run config header; default "
                   "the variant's LaunchVariant.script)")
    c.add_argument("--repo-root", default=str(Path(__file__).resolve().parents[2]),
                   help="this repository, as the script sees it (default: the one this module is in)")
    c.add_argument("--cwd", default=os.getcwd(), help="where the script was started (relative paths; default: here)")
    c.add_argument("--user-pythonpath", help="the PYTHONPATH the script was started with (default: this one's), "
                   "appended to the Slime job's")
    c.add_argument("--dry-run", action="store_true", help="missing paths and GPUs are warnings; fill OC_PLAN")
    c.add_argument("--json", action="store_true", help="one JSON object instead of shell assignments")
    ns = p.parse_args(argv)
    env = os.environ if env is None else env
    if ns.user_pythonpath is not None:
        env = {**env, "PYTHONPATH": ns.user_pythonpath}
    try:
        values = make_plan(ns.variant, env, cwd=ns.cwd, repo_root=ns.repo_root,
                           script_name=ns.script or launch_variant(ns.variant)[1].script,
                           dry_run=ns.dry_run, extra=extra, console=Console(ns.dry_run))
    except ValueError as e:  # LaunchError, or an unknown variant
        print(f"[openclaw-rl] ERROR: {e}", file=sys.stderr)
        return 2
    print(json.dumps(values, indent=1) if ns.json else shell_assignments(values))
    return 0
