"""The ``openclaw-rl`` command: serve the proxy, inspect the spool, and run the embedded stack.

Every flag maps onto a flat settings key (see ``config.py``); ``--config`` loads the same keys from a
YAML file, and upstream's environment variables still work as fallbacks.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from typing import Any

from .config import load_settings, load_yaml
from .errors import CommandError
from .modes import MODES, mode_names

SERVE_FLAGS: list[tuple[str, str, dict[str, Any]]] = [
    # flag, settings key, argparse kwargs
    ("--mode", "mode", {"choices": mode_names(), "help": "how finished turns become samples"}),
    ("--policy-url", "proxy_policy_url", {"help": "SGLang (or `openclaw-rl engine`) serving the policy; several engines "
                                                 "comma-separated (each session kept on one), or an sglang-router URL"}),
    ("--judge-url", "judge_url", {"help": "SGLang judge/teacher; without it nothing learns (PRM off)"}),
    ("--judge-api", "judge_api", {"choices": ["sglang", "openai"]}),
    ("--tokenizer", "proxy_tokenizer", {"help": "policy tokenizer dir (its chat template renders prompts)"}),
    ("--judge-tokenizer", "judge_tokenizer", {"help": "judge chat template (default: the policy's)"}),
    ("--host", "proxy_host", {"help": "bind address (default 127.0.0.1)"}),
    ("--port", "proxy_port", {"type": int}),
    ("--api-key", "proxy_api_keys", {"action": "append", "help": "bearer key; repeat for several namespaces"}),
    ("--allow-insecure-bind", "proxy_allow_insecure_bind", {"action": "store_const", "const": True,
                                                             "help": "bind a non-loopback address without a key"}),
    ("--served-model-name", "proxy_served_model_name", {}),
    ("--prm-m", "judge_votes", {"type": int, "help": "judge votes per turn (majority wins)"}),
    ("--spool-dir", "spool_dir", {"help": "where finished samples persist"}),
    ("--spool-sync", "spool_sync", {"choices": ["full", "normal"],
                                    "help": "full (default): each commit is fsynced, a sample survives a power loss; "
                                            "normal: it survives a crash of the proxy, not of the machine"}),
    ("--record-dir", "proxy_record_dir", {"help": "write JSONL conversation and judge records here"}),
    *(flag for mode in MODES.values() for flag in mode.cli_flags),  # each mode's own flags (registry)
    ("--session-ttl", "proxy_session_ttl_s", {"type": float, "help": "flush sessions idle this many seconds"}),
    ("--pause-mode", "proxy_pause_mode", {"choices": ["reject", "hold"], "help": (
        "while weights sync: reject (default, upstream's) answers 503 + Retry-After, which clients must retry "
        "(4 of 168 replies were 503s in one user's train run); hold keeps the request until the sync is done")}),
    ("--rollout-temperature", "proxy_rollout_temperature", {
        "help": "main-line turns sample at this temperature (1.0); none lets the client's through (upstream)"}),
    ("--policy-timeout", "proxy_request_timeout_s", {"type": float,
                                                     "help": "seconds before a policy call becomes a 504 (600)"}),
    ("--context-length", "proxy_context_length", {"type": int,
                                                  "help": "policy context in tokens (default: asked from the server)"}),
    ("--header-timeout", "proxy_header_timeout_s", {"type": float,
                                                    "help": "close connections whose request head takes longer (10)"}),
    ("--body-timeout", "proxy_body_timeout_s", {"type": float, "help": "408 for bodies slower than this (60)"}),
    ("--stream-interval", "proxy_stream_interval", {
        "type": int, "help": "tokens per SGLang stream event on streamed turns (8; 0 = the server's default)"}),
    ("--stream-gather-ms", "proxy_stream_gather_ms", {
        "type": float, "help": "a streamed reply's tokens arriving within this long go out in one client write (50; "
                               "more: less CPU per token, coarser updates; the first and last are never held)"}),
    ("--max-connections", "proxy_max_connections", {"type": int, "help": "close connections beyond this (2048)"}),
    ("--max-connections-per-client", "proxy_max_connections_per_client", {
        "type": int, "help": "close connections beyond this from one client address (512; 0 = no limit)"}),
    ("--reserved-connections", "proxy_reserved_connections", {
        "type": int, "help": "last free slots kept for addresses holding fewer than the mean (128; 0 = none)"}),
]


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file of openclaw_* keys (the same file Slime's --custom-config-path takes)")
    for flag, key, kwargs in SERVE_FLAGS:
        p.add_argument(flag, dest=key, default=None, **kwargs)


def settings_from_cli(ns: argparse.Namespace):
    values: dict[str, Any] = load_yaml(ns.config) if getattr(ns, "config", None) else {}
    sources = {key: str(ns.config) for key in values}
    for flag, key, _ in SERVE_FLAGS:
        value = getattr(ns, key, None)
        if value is not None:
            values[key] = value
            sources[key] = flag
    return load_settings(values, sources=sources)


def ensure_port_free(host: str, port: int, setting: str) -> None:
    """Fail in one line, before any model loads, when `host`:`port` cannot be listened on (another server
    has it): the ``CommandError`` names the port and `setting`, the flag or key that changes it. The probe
    binds as uvicorn does (SO_REUSEADDR: a port in TIME_WAIT counts as free) and closes at once."""
    import errno
    import socket

    if not port:
        return
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            taken = exc.errno == errno.EADDRINUSE
            raise CommandError(f"port {port} on {host} is {'already in use' if taken else 'not available'} "
                               f"({exc.strerror or exc}): stop what listens there or choose another port with "
                               f"{setting}") from None


def cmd_serve(ns: argparse.Namespace) -> int:
    settings = settings_from_cli(ns)  # first: a configuration error costs no server import
    if getattr(ns, "workers", 1) < 1:
        raise CommandError(f"--workers must be at least 1, not {ns.workers}")
    ensure_port_free(settings.proxy.host, settings.proxy.port, "--port (openclaw_proxy_port)")
    if getattr(ns, "workers", 1) > 1:  # an owner process and N HTTP workers (openclaw_rl/workers/)
        from .workers.supervisor import serve_workers

        return serve_workers(settings, ns.workers, ns.log_level, ns.log_json)

    from .server import Proxy

    proxy = Proxy.build(settings)
    p = settings.proxy
    logging.getLogger(__name__).info("openclaw-rl proxy (%s mode) on http://%s:%d/v1 → policy %s, spool %s",
                                     settings.mode, p.host, p.port, p.policy_url, proxy.spool.path)
    from .listener import proxy_uvicorn_config
    from .servers import KEEP_ALIVE_S, PromptStopServer

    # SIGTERM and SIGINT both run the app's graceful shutdown (waiting turns stay in the spool).
    config = proxy_uvicorn_config(proxy.app, p, lambda why: proxy.metrics.slow_clients.labels(why).inc(), KEEP_ALIVE_S)
    try:
        PromptStopServer(config).run()
    except KeyboardInterrupt:  # uvicorn re-raises SIGINT after its graceful shutdown
        pass
    return 0


def cmd_samples(ns: argparse.Namespace) -> int:
    from .spool import Spool

    if not os.path.exists(os.path.join(ns.spool_dir, "samples.sqlite3")):
        print(f"no spool at {ns.spool_dir}", file=sys.stderr)
        return 1
    spool = Spool(ns.spool_dir)
    n = 0
    try:
        for sample in spool.iter_samples():
            if ns.session and sample.session_id != ns.session:
                continue
            print(json.dumps(strict_json(sample.summary()), ensure_ascii=False, allow_nan=False))
            n += 1
            if ns.limit and n >= ns.limit:
                break
        sys.stdout.flush()
    except BrokenPipeError:  # `samples | head`: the reader has all it wanted; no traceback, as cat would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's final flush too
    finally:
        spool.close()
    return 0


def strict_json(value: Any) -> Any:
    """Non-finite floats (NaN, ±Infinity) become null: strict JSON parsers (Node's JSON.parse) reject them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict_json(v) for v in value]
    return value


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or, given the ``command`` about to run, only that subcommand's extra
    module: registering them all imports the embedded stack and the benchmarks (0.4 CPU-s), which a
    ``serve`` process would pay at every start. Help and unknown commands get every subcommand."""
    parser = argparse.ArgumentParser(prog="openclaw-rl", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default=os.environ.get("OPENCLAW_LOG_LEVEL", "INFO"))
    parser.add_argument("--log-json", action="store_true", help="structured JSON log lines")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the training proxy (no trainer attached; samples go to the spool)")
    add_serve_flags(serve)
    serve.add_argument("--workers", type=int, default=1, help="HTTP worker processes around one owner of the "
                       "sessions and spool (1: one process, as before; docs/deployment.md)")
    serve.set_defaults(fn=cmd_serve)

    samples = sub.add_parser("samples", help="print the spool's samples, one strict JSON object a line "
                             "(a non-finite float prints as null)")
    samples.add_argument("--spool-dir", required=True, help="the proxy's spool directory (e.g. runs/local-rl/spool)")
    samples.add_argument("--session", help="only this session id")
    samples.add_argument("--limit", type=int, default=0, help="print at most this many (default 0: all)")
    samples.set_defaults(fn=cmd_samples)

    if command in _EXTRA_COMMANDS:
        _EXTRA_COMMANDS[command](sub)
    elif command not in ("serve", "samples"):
        for register in dict.fromkeys(_EXTRA_COMMANDS.values()):  # each once
            register(sub)
    return parser


def _register_local(sub: Any) -> None:
    from .embedded.local_command import register_local_command

    register_local_command(sub)


def _register_train(sub: Any) -> None:
    from .embedded.external import register_train_command

    register_train_command(sub)


def _register_engine(sub: Any) -> None:
    from .engine.serve import register_engine_command

    register_engine_command(sub)


def _register_bench(sub: Any) -> None:
    from .bench.mock import register_mock_command
    from .bench.proxy_bench import register_bench_command

    register_mock_command(sub)
    register_bench_command(sub)


def _register_judge(sub: Any) -> None:
    from .embedded.judge_command import register_judge_command

    register_judge_command(sub)


def _register_simulate(sub: Any) -> None:
    from .embedded.simulate_command import register_simulate_command

    register_simulate_command(sub)


def _register_dashboard(sub: Any) -> None:
    from .dashboard.command import register_dashboard_command

    register_dashboard_command(sub)


def _register_experience(sub: Any) -> None:
    from openclaw_oel.command import register_experience_command

    register_experience_command(sub)


def _register_eval(sub: Any) -> None:
    from .evaluation.command import register_eval_command

    register_eval_command(sub)


def _register_users(sub: Any) -> None:
    from .users.command import register_users_command

    register_users_command(sub)


# subcommand -> what registers it (mock-sglang and bench come together from the benchmarks)
_EXTRA_COMMANDS: dict[str, Any] = {"local": _register_local, "train": _register_train, "engine": _register_engine,
                                   "mock-sglang": _register_bench, "bench": _register_bench,
                                   "simulate": _register_simulate, "judge": _register_judge,
                                   "dashboard": _register_dashboard, "experience": _register_experience,
                                   "eval": _register_eval,
                                   "users": _register_users}


def _command_of(argv: list[str]) -> str | None:
    """The subcommand in ``argv`` (the first word after the top-level options), None for help."""
    args = iter(argv)
    for arg in args:
        if arg in ("-h", "--help"):
            return None
        if arg == "--log-level":
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


class _StderrHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is when a record is emitted, not as it was when logging was set up:
    a background thread that logs after ``sys.stderr`` was replaced (a test harness's capture, a
    daemonising wrapper) writes to the current stream instead of a closed one."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def setup_logging(level: str, as_json: bool) -> None:
    handler = _StderrHandler()
    if as_json:
        class JsonFormatter(logging.Formatter):
            def format(self, record: logging.LogRecord) -> str:
                return json.dumps({"ts": record.created, "level": record.levelname, "logger": record.name,
                                   "msg": record.getMessage()})
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    for noisy in ("httpx", "httpx2", "httpcore"):  # one line per HTTP call would drown the proxy's own log
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("torch").setLevel(logging.WARNING)  # e.g. FakeTensor cache stats at exit, at INFO


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    ns = build_parser(_command_of(args)).parse_args(args)
    setup_logging(ns.log_level, ns.log_json)
    try:
        return int(ns.fn(ns) or 0)
    except (ValueError, FileNotFoundError) as e:
        print(f"openclaw-rl: error: {e}", file=sys.stderr)
        return 2
    except CommandError as e:
        print(f"openclaw-rl {ns.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # one line, not a traceback (e.g. `local` interrupted while it starts)
        print(f"\nopenclaw-rl {ns.command}: interrupted{f' {exc}' if str(exc) else ''}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 130))


if __name__ == "__main__":
    sys.exit(main())
