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

LOCAL_ARGS = ["local", "--mode", "rl", "--simulate", "--interactions", "100000", "--batch-size", "2"]
"""Small batches: the first step, the signal's cue, comes soon."""


def first_step_logged(metrics, deadline_s: float = 300, stop=lambda: False) -> bool:
    deadline = time.time() + deadline_s
    while time.time() < deadline and not stop():
        if metrics.exists() and metrics.read_text().strip():
            return True
        time.sleep(0.2)
    return False


def assert_stopped_cleanly(output: str, rc: int, name: str, out, port: int) -> None:
    assert rc == 0, output[-3000:]
    assert f"interrupted ({name})" in output
    assert "step    1 |" in output and "\r" not in output  # a log, not a terminal: no tqdm redraws
    report = json.loads((out / "report.json").read_text())
    assert report["steps"] >= 1
    trained = {line["step"] for line in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    assert len(trained) == report["steps"]
    # samples collected but not trained stay in the spool, handed back for the next run
    spool = Spool(out / "spool")
    spool.release_leases()
    assert spool.ready_count() == spool.depth()
    with socket.socket() as s:  # the proxy port is released
        s.bind(("127.0.0.1", port))


def test_ctrl_c_stops_the_process_cleanly_and_keeps_untrained_samples(tmp_path, tiny_model_dir):
    """The real process: Ctrl-C (SIGINT) ends it with exit code 0, nothing left running that holds it."""
    port, out = free_port(), tmp_path / "run"
    env = {**os.environ, "OPENCLAW_RL_CACHE": str(tiny_model_dir.parent), "HF_HUB_OFFLINE": "1"}
    # bytes, not text=True: universal newlines would turn a tqdm redraw's "\r" into "\n" and hide it
    proc = subprocess.Popen([sys.executable, "-m", "openclaw_rl.cli", *LOCAL_ARGS, "--port", str(port),
                             "--out-dir", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        logged = first_step_logged(out / "metrics.jsonl", stop=lambda: proc.poll() is not None)
        assert logged, proc.stdout.read().decode() if proc.poll() is not None else "no training step"
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert_stopped_cleanly(output.decode(), proc.returncode, "Ctrl-C", out, port)


@pytest.fixture
def local_in_this_process(tiny_model_dir, monkeypatch):
    """`cli.main` runs `local` here; the process's logging is left as it was."""
    import logging

    from openclaw_rl import cli

    monkeypatch.setenv("OPENCLAW_RL_CACHE", str(tiny_model_dir.parent))
    monkeypatch.setattr(cli, "setup_logging", lambda *args: None)
    loggers = [logging.getLogger(name) for name in ("httpx2", "openclaw_rl.drops")]  # `local` sets their levels
    levels = [logger.level for logger in loggers]
    yield cli.main
    for logger, level in zip(loggers, levels):
        logger.setLevel(level)  # setLevel, not an attribute: it also clears logging's enabled-level cache


def test_sigterm_is_handled_like_ctrl_c(tmp_path, local_in_this_process, capsys, sigterm_at_the_second_step):
    """SIGTERM (what `kill`, systemd and container runtimes send) through the command's own handler, in this
    process: after the handler, the stop is the Ctrl-C path the test above runs in a real process (a second
    process would spend ~10 CPU-s importing torch and transformers' Qwen3 modelling again)."""
    port, out = free_port(), tmp_path / "run"
    rc = local_in_this_process([*LOCAL_ARGS, "--max-steps", "5", "--port", str(port), "--out-dir", str(out)])
    captured = capsys.readouterr()
    assert sigterm_at_the_second_step() == 2
    assert_stopped_cleanly(captured.out + captured.err, rc, "SIGTERM", out, port)
    assert "provider config" not in captured.out  # simulated users: no OpenClaw to paste it into


def test_a_step_trained_when_ctrl_c_comes_is_logged_and_its_batch_stays_in_the_spool(tmp_path, tiny_model_dir,
                                                                                       monkeypatch):
    """Step 2 has trained (and printed) when Ctrl-C comes while batch 3 fills. It must be in metrics.jsonl
    too, marked as never synced, and its samples, never acknowledged, go back to the spool. (The signal
    tests above hit this window only by chance: CI saw a report of 3 steps with 2 metrics lines.)"""
    from openclaw_rl.embedded import local
    from openclaw_rl.embedded.local import LocalConfig, run_local

    monkeypatch.setenv("OPENCLAW_RL_CACHE", str(tiny_model_dir.parent))
    calls, collect = [], local._collect

    def interrupted_third_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return collect(*args, **kwargs)

    monkeypatch.setattr(local, "_collect", interrupted_third_batch)
    out = tmp_path / "run"
    report = run_local(LocalConfig(mode="rl", port=free_port(), out_dir=str(out), simulate=True, interactions=10_000,
                                   rollout_batch_size=4), progress=False)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert report.steps == 2 and [line["step"] for line in lines] == [1, 2]
    assert "interrupted_before_sync" not in lines[0] and lines[1]["interrupted_before_sync"] == 1.0
    spool = Spool(out / "spool")
    spool.release_leases()
    assert spool.ready_count() == spool.depth() == report.untrained_samples >= 4  # batch 2 (never synced) is kept


@pytest.mark.parametrize(("interrupt", "exit_code"), [("Ctrl-C", 130), ("SIGTERM", 143)])
def test_an_interrupt_while_the_models_load_stops_what_started_and_says_so_in_one_line(
        tmp_path, local_in_this_process, monkeypatch, capsys, interrupt, exit_code):
    """A first `openclaw-rl local` builds its model for a minute or more, so Ctrl-C often comes during the
    start-up: one line and exit code 130 (143 for SIGTERM), not a traceback, and every server already
    started is stopped."""
    from openclaw_rl import servers
    from openclaw_rl.embedded.interrupts import Terminated
    from openclaw_rl.engine import torch_core

    started, start = [], servers.BackgroundServer.start

    def recording_start(self):
        started.append(self)
        return start(self)

    loads, load = [], torch_core.TorchModel.from_pretrained

    def interrupted_second_load(*args, **kwargs):  # the policy engine is serving when the judge's model loads
        loads.append(1)
        if len(loads) == 2:
            raise KeyboardInterrupt if interrupt == "Ctrl-C" else Terminated()
        return load(*args, **kwargs)

    monkeypatch.setattr(servers.BackgroundServer, "start", recording_start)
    monkeypatch.setattr(torch_core.TorchModel, "from_pretrained", staticmethod(interrupted_second_load))
    try:
        rc = local_in_this_process(["local", "--mode", "rl", "--simulate", "--port", str(free_port()),
                                    "--out-dir", str(tmp_path / "run")])
    except KeyboardInterrupt:
        pytest.fail("an interrupt during start-up escaped `openclaw-rl local` as a traceback")
    err = capsys.readouterr().err
    assert rc == exit_code and "openclaw-rl local: interrupted while starting, before any training step" in err
    assert len(loads) == 2 and len(started) == 1  # the policy engine had started
    for server in started:
        with socket.socket() as s:  # stopped: its port is free again
            s.bind(("127.0.0.1", server.port))
