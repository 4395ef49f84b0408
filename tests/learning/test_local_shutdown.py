"""Ctrl-C or SIGTERM on `openclaw-rl local`: everything stops, nothing collected is lost, the port is free
again; its output, redirected to a pipe, has plain step lines and no progress-bar carriage returns."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from openclaw_rl.servers import free_port
from openclaw_rl.spool import Spool


@pytest.mark.parametrize(("sig", "name"), [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_a_signal_stops_cleanly_and_keeps_untrained_samples(tmp_path, tiny_model_dir, sig, name):
    port, out = free_port(), tmp_path / "run"
    env = {**os.environ, "OPENCLAW_RL_CACHE": str(tiny_model_dir.parent), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "openclaw_rl.cli", "local", "--mode", "rl", "--simulate",
                             "--interactions", "100000", "--port", str(port), "--out-dir", str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 2):
        time.sleep(0.5)
    assert metrics.exists(), proc.stdout.read() if proc.poll() is not None else "no training step"
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output[-3000:]
    assert f"interrupted ({name})" in output
    assert "step    1 |" in output and "\r" not in output  # a log, not a terminal: no tqdm redraws
    report = json.loads((out / "report.json").read_text())
    assert report["steps"] >= 2
    trained = {line["step"] for line in map(json.loads, metrics.read_text().splitlines())}
    assert len(trained) == report["steps"]
    # samples collected but not trained stay in the spool, handed back for the next run
    spool = Spool(out / "spool")
    spool.release_leases()
    assert spool.ready_count() == spool.depth()
    with socket.socket() as s:  # the proxy port is released
        s.bind(("127.0.0.1", port))
