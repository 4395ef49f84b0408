"""The launch scripts' settings, resolved and checked by the typed config instead of by Bash.

``scripts/run_qwen3_4b_openclaw_*.sh`` stay Bash (process start/stop, the GPU split, the dry-run
printout), but everything that ends up in the run config (``$RUN_DIR/openclaw_<mode>.yaml``, which
Slime's ``--custom-config-path`` sets on its args) is resolved here from the environment variables the
scripts document, parsed by the field types of ``config.Settings`` and validated by the same
``Settings.validate`` the proxy runs (loopback rule, truthy parsing, ranges). So a value a script accepts
is a value the proxy accepts, and a documented variable cannot silently do nothing.

``python -m openclaw_rl.launch config --mode rl --script NAME --base configs/openclaw_rl.yaml
--run-dir DIR --judge-url URL [--judge-tokenizer PATH] [--default KEY=VALUE ...]`` prints shell
assignments (``OC_CONFIG_TEXT`` and the few resolved values the script's Slime flags use) for ``eval``.
Errors go to stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .config import ENV_FALLBACKS, PREFIX, Settings, _apply, is_loopback, load_settings, load_yaml
from .modes import MODES

# Environment variables the launch scripts read into the run config → flat keys. Upstream's names
# (config.ENV_FALLBACKS) plus the scripts' own; secrets (API keys) never enter the run config.
SECRETS = ("SGLANG_API_KEY", "PRM_API_KEY")
SCRIPT_ENV: dict[str, str] = {
    **{var: key for var, key in ENV_FALLBACKS.items() if var not in SECRETS and var != "HOST"},
    "PROXY_HOST": "proxy_host",  # the scripts' name for the bind address (HOST is the proxy CLI's)
    "ALLOW_INSECURE_BIND": "proxy_allow_insecure_bind",
    "ROLLOUT_TEMPERATURE": "proxy_rollout_temperature",
}

# The scripts' defaults where they differ from Settings' (upstream's launch scripts)
# (always written, in this order, so the run config shows every value the run uses).
SCRIPT_DEFAULTS: dict[str, str] = {
    "proxy_host": "127.0.0.1", "proxy_port": "30000", "proxy_allow_insecure_bind": "false",
    "proxy_served_model_name": "qwen3-4b", "proxy_tool_parser": "qwen25", "proxy_rollout_temperature": "0.6",
    "judge_temperature": "0.6",
}
ORDER = ("proxy_host", "proxy_port", "proxy_allow_insecure_bind", "proxy_served_model_name", "proxy_tool_parser",
         "proxy_rollout_temperature", "proxy_record_dir", "judge_url", "judge_api", "judge_tokenizer",
         "judge_votes", "judge_temperature", "judge_max_new_tokens", "spool_dir", "opd_eval_mode",
         "opd_distill_topk", "opd_teacher_concurrency")

# Resolved keys the script's own flags and printout need back (flat key → shell variable)
SHELL_OUT = {"proxy_host": "PROXY_HOST", "proxy_port": "PORT", "proxy_served_model_name": "SERVED_MODEL_NAME",
             "proxy_tool_parser": "TOOL_CALL_PARSER", "proxy_rollout_temperature": "ROLLOUT_TEMPERATURE"}


class LaunchError(ValueError):
    """A setting the script must refuse; the message names the environment variable to change."""


def _sections_for(mode: str) -> set[str]:
    """Settings sections a run of ``mode`` writes: proxy, judge, spool, the mode's own, and opd's when it
    needs the teacher (the hint/teacher options)."""
    out = {"proxy", "judge", "spool", mode}
    if MODES[mode].needs_teacher:
        out.add("opd")
    return out


def resolve(mode: str, env: Mapping[str, str], defaults: Mapping[str, str], fixed: Mapping[str, Any]) -> dict[str, Any]:
    """The run config's resolved keys: ``fixed`` (computed by the script: paths, judge URL) over the
    environment over the variant's ``defaults`` over ``SCRIPT_DEFAULTS``; typed and checked like the proxy."""
    if mode not in MODES:
        raise LaunchError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
    sections = _sections_for(mode)
    probe = Settings()
    raw: dict[str, tuple[Any, str]] = {k: (v, "launch script default") for k, v in SCRIPT_DEFAULTS.items()}
    raw.update({k: (v, "variant default") for k, v in defaults.items()})
    for var, key in SCRIPT_ENV.items():
        if env.get(var, "") != "" and key.partition("_")[0] in sections:
            raw[key] = (env[var], f"environment variable {var}")
    raw.update({k: (v, "launch script") for k, v in fixed.items()})
    out: dict[str, Any] = {}
    for key, (value, source) in raw.items():
        if key.partition("_")[0] not in sections:
            continue
        try:
            _apply(probe, key, value, source)
        except ValueError as e:
            raise LaunchError(str(e)) from None
        section, _, name = key.partition("_")
        out[key] = getattr(getattr(probe, section), name)
    return out


def check_bind(values: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """The proxy's loopback rule in the scripts' words; returns warnings, raises LaunchError."""
    host, port = values.get("proxy_host", "127.0.0.1"), values.get("proxy_port", 30000)
    if is_loopback(host):
        return []
    if env.get("SGLANG_API_KEY"):
        return []
    if not values.get("proxy_allow_insecure_bind"):
        raise LaunchError(
            f"refusing to expose the proxy on PROXY_HOST={host} without an API key: anyone who reaches port "
            f"{port} could use the model and inject training data. Set SGLANG_API_KEY=<secret> (clients send it "
            "as the bearer key), keep PROXY_HOST=127.0.0.1, or set ALLOW_INSECURE_BIND=1 on a trusted network.")
    return [f"the proxy listens on {host}:{port} WITHOUT an API key (ALLOW_INSECURE_BIND=1)"]


def _yaml_value(value: Any) -> str:
    return json.dumps(value)  # JSON scalars (strings, numbers, true/false) are valid YAML


def render(mode: str, script: str, base: Path, values: Mapping[str, Any]) -> str:
    """The run config: ``base`` without the resolved keys (and without ``mode``: each rollout hook names
    its mode), then the resolved keys."""
    names = {"mode"} | {PREFIX + k for k in values}
    kept, overridden = [], []
    for line in base.read_text().splitlines():
        key = line.partition(":")[0].strip() if ":" in line and not line.startswith((" ", "#")) else ""
        if key in names:
            overridden.append(key)
        else:
            kept.append(line)
    return "\n".join([
        f"# Written by scripts/{script}; edit {base} or the script's env vars instead.",
        "# Slime's --custom-config-path sets each key on its args; openclaw_rl.config.load_settings reads them.",
        f"# --- from {base} (without the keys resolved below: {','.join(overridden) or 'none'}) ---",
        *kept,
        f"# --- resolved by scripts/{script} through openclaw_rl.launch (mode {mode}) ---",
        *(f"{PREFIX}{k}: {_yaml_value(v)}" for k, v in values.items()),
    ])


def build(ns: argparse.Namespace, env: Mapping[str, str]) -> tuple[str, dict[str, Any], list[str]]:
    defaults = dict(kv.split("=", 1) for kv in ns.default)
    run_dir = Path(ns.run_dir)
    record = env.get("OPENCLAW_RECORD_ENABLED", "1").strip().lower() in ("1", "true", "yes", "on")
    fixed: dict[str, Any] = {
        "proxy_record_dir": str(run_dir / "records") if record else "", "judge_url": ns.judge_url,
        "judge_api": "sglang", "judge_tokenizer": ns.judge_tokenizer, "spool_dir": str(run_dir / "spool")}
    values = resolve(ns.mode, env, defaults, fixed)
    warnings = check_bind(values, env)
    try:  # everything else the proxy would refuse at start-up (ports, votes, modes), refused now
        base = load_yaml(ns.base)
        base.pop("mode", None)
        api_keys = {"proxy_api_keys": env["SGLANG_API_KEY"]} if env.get("SGLANG_API_KEY") else {}
        load_settings({**base, **{PREFIX + k: v for k, v in values.items()}, **api_keys, "mode": ns.mode}, env={})
    except ValueError as e:
        raise LaunchError(str(e)) from None
    ordered = {k: values[k] for k in sorted(values, key=lambda k: (ORDER.index(k) if k in ORDER else len(ORDER), k))}
    return render(ns.mode, ns.script, Path(ns.base), ordered), values, warnings


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    import os

    p = argparse.ArgumentParser(prog="python -m openclaw_rl.launch", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("config", help="resolve the run config; print shell assignments for eval")
    c.add_argument("--mode", required=True, choices=list(MODES))
    c.add_argument("--script", required=True)
    c.add_argument("--base", required=True, help="configs/openclaw_<mode>.yaml (OPENCLAW_CONFIG)")
    c.add_argument("--run-dir", required=True)
    c.add_argument("--judge-url", required=True)
    c.add_argument("--judge-tokenizer", default="")
    c.add_argument("--default", action="append", default=[], metavar="KEY=VALUE",
                   help="a variant default (flat key), overridden by the environment")
    c.add_argument("--yaml", action="store_true", help="print only the YAML")
    ns = p.parse_args(argv)
    env = os.environ if env is None else env
    try:
        text, values, warnings = build(ns, env)
    except LaunchError as e:
        print(f"[openclaw-rl] ERROR: {e}", file=sys.stderr)
        return 2
    for w in warnings:
        print(f"[openclaw-rl] WARNING: {w}", file=sys.stderr)
    if ns.yaml:
        print(text)
        return 0
    print(f"OC_CONFIG_TEXT={shlex.quote(text)}")
    for key, var in SHELL_OUT.items():
        print(f"{var}={shlex.quote(str(values[key]))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
