"""The run config of a launch script: ``$RUN_DIR/openclaw_<mode>.yaml``, resolved by the proxy's own types.

Everything that ends up in the run config (Slime's ``--custom-config-path`` sets each key on its args) is
resolved here from the environment variables the scripts document, parsed by the field types of
``config.Settings`` and validated by the same ``Settings.validate`` the proxy runs (loopback rule, truthy
parsing, ranges). So a value a script accepts is a value the proxy accepts, and a documented variable
cannot silently do nothing. Secrets (API keys) never enter the file: they travel in the environment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config import ENV_FALLBACKS, PREFIX, Settings, _apply, is_loopback, load_settings, load_yaml
from ..modes import MODES

# Environment variables the launch scripts read into the run config → flat keys. Upstream's names
# (config.ENV_FALLBACKS) plus the scripts' own; secrets (API keys) never enter the run config.
SECRETS = ("SGLANG_API_KEY", "PRM_API_KEY", "TEACHER_API_KEY")
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


def _named(message: str, env: Mapping[str, str]) -> str:
    """A settings error about a key the environment set, with that variable named (the user set PORT, not
    openclaw_proxy_port)."""
    key = message.partition(":")[0].removeprefix(PREFIX)
    if key == "proxy_api_keys" and env.get("SGLANG_API_KEY"):
        return f"SGLANG_API_KEY: {message}"
    var = next((v for v, k in SCRIPT_ENV.items() if k == key and env.get(v)), None)
    return f"{var}={env[var]}: {message}" if var else message


def _replaced(base: Mapping[str, Any], values: Mapping[str, Any]) -> list[str]:
    """A warning per key that ``base`` sets to something else than the run will use."""
    by_key = {key: var for var, key in SCRIPT_ENV.items()}
    out = []
    for key, value in values.items():
        mine = base.get(PREFIX + key)
        if mine is not None and mine != value and not (isinstance(value, list) and str(mine) == ",".join(value)):
            how = f"set {by_key[key]} to change it" if key in by_key else "the script computes it"
            out.append(f"OPENCLAW_CONFIG sets {PREFIX}{key}: {mine!r}, but the run uses {value!r} ({how})")
    return out


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


def build(mode: str, script: str, base: Path, run_dir: Path, judge_url: str, judge_tokenizer: str,
          defaults: Mapping[str, str], env: Mapping[str, str]) -> tuple[str, dict[str, Any], list[str]]:
    """The run config's text, its resolved values and the warnings to print; raises LaunchError."""
    from .script import switch  # script imports this module's LaunchError

    record = switch(env, "OPENCLAW_RECORD_ENABLED", True)
    fixed: dict[str, Any] = {
        "proxy_record_dir": str(run_dir / "records") if record else "", "judge_url": judge_url,
        "judge_api": "sglang", "judge_tokenizer": judge_tokenizer, "spool_dir": str(run_dir / "spool")}
    values = resolve(mode, env, defaults, fixed)
    warnings = check_bind(values, env)
    try:  # everything else the proxy would refuse at start-up (ports, votes, modes), refused now
        data = load_yaml(str(base))
        data.pop("mode", None)
        api_keys = {"proxy_api_keys": env["SGLANG_API_KEY"]} if env.get("SGLANG_API_KEY") else {}
        settings = load_settings({**data, **{PREFIX + k: v for k, v in values.items()}, **api_keys, "mode": mode},
                                 env={})
    except ValueError as e:
        raise LaunchError(_named(str(e), env)) from None
    sections = _sections_for(mode)
    warnings += [f"{var} is ignored: mode {mode} has no {key.partition('_')[0]} settings ({PREFIX}{key})"
                 for var, key in SCRIPT_ENV.items() if env.get(var) and key.partition("_")[0] not in sections]
    if env.get("HOST") and env["HOST"] != values.get("proxy_host"):
        warnings.append(f"HOST={env['HOST']} is ignored: the launch scripts bind the proxy to PROXY_HOST "
                        f"({values.get('proxy_host')})")
    if env.get("OPENCLAW_RECORD_FILE"):
        warnings.append("OPENCLAW_RECORD_FILE is ignored: the launch scripts record to $RUN_DIR/records "
                        "(OPENCLAW_RECORD_ENABLED=0 turns that off)")
    if env.get("OPENCLAW_CONFIG"):  # the user's own file: say which of its values the launch replaces
        warnings += _replaced(data, values)
    if not settings.proxy.rollout_temperature:  # the trainer's log-probs are taken at this temperature
        raise LaunchError("ROLLOUT_TEMPERATURE / openclaw_proxy_rollout_temperature must be a number above 0 here: "
                          "it is also Slime's --rollout-temperature, the temperature the trainer divides its logits "
                          "by to compute log-probs")
    ordered = {k: values[k] for k in sorted(values, key=lambda k: (ORDER.index(k) if k in ORDER else len(ORDER), k))}
    return render(mode, script, base, ordered), values, warnings
