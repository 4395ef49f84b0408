"""`openclaw-rl serve` and `openclaw-rl samples` as a user runs them (subprocesses on loopback)."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from support import http_client

from openclaw_rl.servers import free_port

REQUIRED = {"session_id", "turn", "tokens", "response_length", "loss_mask", "rollout_log_probs", "reward"}


def cli(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "openclaw_rl.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def test_serve_then_samples(policy_server, judge_server, tiny_model_dir, tmp_path):
    port = free_port()
    spool = tmp_path / "spool"
    proc = cli("serve", "--mode", "rl", "--policy-url", policy_server.url, "--judge-url", judge_server.url,
               "--tokenizer", str(tiny_model_dir), "--port", str(port), "--prm-m", "1", "--spool-dir", str(spool))
    url = f"http://127.0.0.1:{port}"
    http = http_client()
    try:
        deadline = time.monotonic() + 180  # start-up imports transformers: tens of seconds on a loaded machine
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if http.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        convo = [{"role": "user", "content": "hello"}]
        for text in ("thanks!", "bye"):
            r = http.post(f"{url}/v1/chat/completions", json={"messages": convo, "session_id": "cli"})
            assert r.status_code == 200, r.text
            convo += [r.json()["choices"][0]["message"], {"role": "user", "content": text}]
        for _ in range(100):
            if "openclaw_samples_total{kind=\"rl\"} 1.0" in http.get(f"{url}/metrics").text:
                break
            time.sleep(0.1)
    finally:
        http.close()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    out = subprocess.run([sys.executable, "-m", "openclaw_rl.cli", "samples", "--spool-dir", str(spool)],
                         capture_output=True, text=True, timeout=60)
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == 1 and set(rows[0]) >= REQUIRED
    assert rows[0]["session_id"] == "cli" and rows[0]["reward"] == 1.0
    assert len(rows[0]["loss_mask"]) == rows[0]["response_length"] == len(rows[0]["rollout_log_probs"])


def test_cli_errors_are_clear(tmp_path):
    out = subprocess.run([sys.executable, "-m", "openclaw_rl.cli", "serve", "--host", "0.0.0.0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "without an API key" in out.stderr
    out = subprocess.run([sys.executable, "-m", "openclaw_rl.cli", "samples", "--spool-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "no spool" in out.stderr


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "openclaw_rl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_serve_refuses_a_key_variable_that_parses_to_no_key(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SGLANG_API_KEY": " "}
    out = subprocess.run([sys.executable, "-m", "openclaw_rl.cli", "serve", "--spool-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, env=env)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "SGLANG_API_KEY: openclaw_proxy_api_keys" in lines[0], out.stderr


def test_config_errors_are_one_clear_line(tmp_path):
    cfg = tmp_path / "proxy.yaml"
    cases = {
        "openclaw_proxy_api_keys: 12345\n": "proxy.yaml: openclaw_proxy_api_keys: expected a list of strings",
        "openclaw_judge_votes: three\n": "proxy.yaml: openclaw_judge_votes: expected an integer, got 'three'",
        "openclaw_judge_votes: [\n": "proxy.yaml: malformed YAML at line",
        "openclaw_proxy_tokenizer: /nonexistent/tok\n": "openclaw_proxy_tokenizer: tokenizer directory "
                                                        "'/nonexistent/tok' does not exist",
    }
    for text, message in cases.items():
        cfg.write_text(text)
        out = run_cli("serve", "--config", str(cfg), "--spool-dir", str(tmp_path / "spool"))
        assert out.returncode == 2, (text, out.stderr[-2000:])
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("openclaw-rl: error: ") and message in lines[0], out.stderr
    out = run_cli("serve", "--port", "70000")
    assert out.returncode == 2 and "openclaw_proxy_port: expected a TCP port 0-65535 (0 = any free port), got 70000" in out.stderr
    out = run_cli("serve", "--api-key", "")  # what --api-key "$KEY" becomes with KEY unset
    assert out.returncode == 2 and "openclaw_proxy_api_keys: key #1 is empty" in out.stderr
    out = run_cli("serve", "--policy-timeout", "abc")
    assert out.returncode == 2 and "--policy-timeout" in out.stderr


def test_train_without_its_policy_server_is_one_line_not_a_traceback(tmp_path, tiny_model_dir, capsys):
    from openclaw_rl.cli import main
    from openclaw_rl.servers import free_port

    down = f"http://127.0.0.1:{free_port()}"
    rc = main(["train", "--mode", "rl", "--model", str(tiny_model_dir), "--policy-url", down, "--judge-url", down,
               "--port", str(free_port()), "--out-dir", str(tmp_path / "run"), "--device", "cpu", "--batch-size", "2", "--max-steps", "1", "--spool-dir", str(tmp_path / "spool")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err[-1].startswith(f"openclaw-rl train: error: policy server {down} unreachable"), err
    assert not any("Traceback" in line for line in err)


def test_train_draws_no_transformers_progress_bars(monkeypatch, capsys):
    """`train` loads the checkpoint and writes every sync's weights with transformers, whose bars redrew
    once per shard at every step in the step log; they are off while it runs, and back on after."""
    from transformers.utils import logging as hf_logging

    from openclaw_rl.cli import main
    from openclaw_rl.embedded import external
    from openclaw_rl.servers import free_port

    seen = []
    monkeypatch.setattr(external, "run_train",
                        lambda cfg: (seen.append(hf_logging.is_progress_bar_enabled()), external.TrainReport())[1])
    hf_logging.enable_progress_bar()
    assert main(["train", "--model", "/m", "--policy-url", "http://127.0.0.1:9", "--port", str(free_port())]) == 0
    assert seen == [False] and hf_logging.is_progress_bar_enabled()


def test_corrupt_spool_refuses_to_start_with_advice(tmp_path, tiny_model_dir):
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "samples.sqlite3").write_bytes(b"not a database at all" * 100)
    for args in (("serve", "--tokenizer", str(tiny_model_dir), "--spool-dir", str(spool), "--port", str(free_port())),
                 ("samples", "--spool-dir", str(spool))):
        out = run_cli(*args)
        lines = [line for line in out.stderr.splitlines() if "Traceback" in line or "error" in line.lower()]
        assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]  # (warnings may precede it)
        assert lines[0].startswith("openclaw-rl: error: spool ")
        assert "is corrupt" in lines[0] and "aside" in lines[0] and ".recover" in lines[0]


@pytest.mark.parametrize(("command", "flag"), [
    (["serve"], "--port (openclaw_proxy_port)"),
    (["train", "--model", "/nonexistent/model"], "--port (openclaw_proxy_port)"),
    (["local", "--simulate"], "--port"),
    (["judge", "--model", "/nonexistent/model"], "--port"),
])
def test_a_busy_port_is_one_line_naming_the_port_and_the_flag(command, flag, capsys):
    """Another server on the port: one line before any model loads (it was a 22-line traceback after)."""
    import socket

    from openclaw_rl.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc = main([*command, "--port", str(port)])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1, err
    assert f"port {port} on 127.0.0.1 is already in use" in err and f"choose another port with {flag}" in err


def test_config_paths_expand_the_home_directory(tmp_path, monkeypatch):
    """configs/*.yaml keep their spool under ~ (not results/ in the repository): `~` must expand."""
    from openclaw_rl.cli import build_parser, settings_from_cli

    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = tmp_path / "c.yaml"
    cfg.write_text("openclaw_spool_dir: ~/openclaw-rl/spool\nopenclaw_proxy_record_dir: ~/rec\n")
    settings = settings_from_cli(build_parser("serve").parse_args(["serve", "--config", str(cfg)]))
    assert settings.spool.dir == str(tmp_path / "openclaw-rl" / "spool")
    assert settings.proxy.record_dir == str(tmp_path / "rec")


def test_samples_prints_strict_json(tmp_path):
    from openclaw_rl.samples import TrainingSample
    from openclaw_rl.spool import Spool

    spool = Spool(tmp_path)
    spool.put([TrainingSample(session_id="s", turn=1, kind="rl", prompt_ids=[1], response_ids=[2, 3],
                              rollout_log_probs=[float("-inf"), float("nan")], loss_mask=[1, 1], reward=1.0)])
    spool.close()
    out = run_cli("samples", "--spool-dir", str(tmp_path))
    assert out.returncode == 0 and "Infinity" not in out.stdout and "NaN" not in out.stdout
    row = json.loads(out.stdout, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert row["rollout_log_probs"] == [None, None]


def test_samples_piped_into_head_ends_quietly(tmp_path):
    """`openclaw-rl samples ... | head -1`, as the README shows it: the reader closing the pipe early is
    no error (it was a BrokenPipeError traceback and exit code 1)."""
    from openclaw_rl.samples import TrainingSample
    from openclaw_rl.spool import Spool

    spool = Spool(tmp_path)
    spool.put([TrainingSample(session_id=f"s{i}", turn=1, kind="rl", prompt_ids=[1] * 2000, response_ids=[2],
                              rollout_log_probs=[-0.5], loss_mask=[1], reward=1.0) for i in range(200)])
    spool.close()
    cli = subprocess.Popen([sys.executable, "-m", "openclaw_rl.cli", "samples", "--spool-dir", str(tmp_path)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert cli.stdout is not None and json.loads(cli.stdout.readline())["session_id"] == "s0"
    cli.stdout.close()  # what head does after its first line
    _, err = cli.communicate(timeout=60)
    assert cli.returncode == 0 and b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()


def test_a_command_registers_only_its_own_module_and_help_lists_them_all():
    """`serve` must not import the embedded stack and the benchmarks to build its parser (0.4 CPU-s per
    start); `--help` and a mistyped command still see every subcommand."""
    probe = ("import sys; from openclaw_rl.cli import build_parser, _command_of; "
             "build_parser(_command_of(sys.argv[1:])).parse_known_args(sys.argv[1:]); "
             "print(sorted(m for m in sys.modules if m.startswith(('openclaw_rl.bench', 'openclaw_rl.embedded'))))")
    loaded = {}
    for argv in (["--log-level", "WARNING", "serve", "--port", "1"], ["samples", "--spool-dir", "x"],
                 ["bench", "--quick"], ["local", "--simulate"]):
        out = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, check=True)
        loaded[argv[2] if argv[0] == "--log-level" else argv[0]] = ast.literal_eval(out.stdout)
    assert loaded["serve"] == loaded["samples"] == []
    assert "openclaw_rl.bench.proxy_bench" in loaded["bench"] and "openclaw_rl.embedded.local" not in loaded["bench"]
    assert "openclaw_rl.embedded.local" in loaded["local"] and "openclaw_rl.bench.mock" not in loaded["local"]
    usage = subprocess.run([sys.executable, "-m", "openclaw_rl.cli", "--help"], capture_output=True, text=True).stdout
    assert all(name in usage for name in ("serve", "samples", "local", "train", "engine", "mock-sglang", "bench",
                                          "simulate", "judge"))
    wrong = subprocess.run([sys.executable, "-m", "openclaw_rl.cli", "sevre"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "invalid choice: 'sevre'" in wrong.stderr and "'simulate'" in wrong.stderr
