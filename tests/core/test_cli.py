"""`openclaw-rl serve` and `openclaw-rl samples` as a user runs them (subprocesses on loopback)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx

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
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        convo = [{"role": "user", "content": "hello"}]
        for text in ("thanks!", "bye"):
            r = httpx.post(f"{url}/v1/chat/completions", json={"messages": convo, "session_id": "cli"}, timeout=30)
            assert r.status_code == 200, r.text
            convo += [r.json()["choices"][0]["message"], {"role": "user", "content": text}]
        for _ in range(100):
            if "openclaw_samples_total{kind=\"rl\"} 1.0" in httpx.get(f"{url}/metrics").text:
                break
            time.sleep(0.1)
    finally:
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
