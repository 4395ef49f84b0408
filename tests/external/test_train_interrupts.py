"""Ctrl-C and SIGTERM on `openclaw-rl train`: the same clean stop as `local` (untrained samples stay in the
spool, the proxy's port is freed), and an interrupt while it starts is one line."""

from __future__ import annotations

import json
import socket

import pytest

from openclaw_rl import cli
from openclaw_rl.servers import free_port


@pytest.fixture
def train_in_this_process(monkeypatch):
    monkeypatch.setattr(cli, "setup_logging", lambda *args: None)  # leave the test process's logging alone
    return lambda *args: cli.main(["train", "--mode", "rl", "--device", "cpu", "--dtype", "float32", *args])


def test_sigterm_stops_train_like_ctrl_c(policy_engine, rule_judge, tiny_model_dir, tmp_path, train_in_this_process,
                                         capsys, sigterm_at_the_second_step):
    """Before, `train` had no SIGTERM handler: `kill` ended it at once, without the graceful stop."""
    port, out = free_port(), tmp_path / "run"
    rc = train_in_this_process("--model", str(tiny_model_dir), "--policy-url", policy_engine.url, "--judge-url",
                               rule_judge.url, "--served-model-name", "tiny", "--batch-size", "4", "--lr", "5e-4",
                               "--max-steps", "5", "--simulate", "400", "--port", str(port), "--out-dir", str(out))
    output = "".join(capsys.readouterr())
    assert rc == 0 and "interrupted (SIGTERM)" in output, output[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert sigterm_at_the_second_step() == 2 and report["steps"] == 1
    with socket.socket() as s:  # the proxy's port is released
        s.bind(("127.0.0.1", port))


@pytest.mark.parametrize(("interrupt", "exit_code"), [("Ctrl-C", 130), ("SIGTERM", 143)])
def test_an_interrupt_while_train_starts_is_one_line(tiny_model_dir, tmp_path, train_in_this_process, monkeypatch,
                                                     capsys, interrupt, exit_code):
    from openclaw_rl.embedded.interrupts import Terminated
    from openclaw_rl.embedded.weight_sync import SGLangWeightSync

    closed = []

    def interrupted(self):  # the first call to the policy server, after the weight-sync client is made
        raise KeyboardInterrupt if interrupt == "Ctrl-C" else Terminated()

    close = SGLangWeightSync.close
    monkeypatch.setattr(SGLangWeightSync, "server_version", interrupted)
    monkeypatch.setattr(SGLangWeightSync, "close", lambda self: (closed.append(1), close(self)))
    try:
        rc = train_in_this_process("--model", str(tiny_model_dir), "--policy-url", "http://127.0.0.1:9",
                                   "--port", str(free_port()), "--out-dir", str(tmp_path / "run"))
    except KeyboardInterrupt:
        pytest.fail("an interrupt during start-up escaped `openclaw-rl train` as a traceback")
    err = capsys.readouterr().err
    assert rc == exit_code and "openclaw-rl train: interrupted while starting, before any training step" in err
    assert closed == [1]  # the client it had made is closed
