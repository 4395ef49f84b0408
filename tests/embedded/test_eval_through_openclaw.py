"""``openclaw-rl eval --through-openclaw``, cheaply: a stand-in `openclaw` executable that does what the
real one does with the eval's sandboxed ``~/.openclaw/openclaw.json`` (one process per turn, its session's
history, the provider's ``headers``, tools in every request, coloured log lines on stdout). The real
OpenClaw runs in ``tests/learning/test_eval_openclaw_real.py``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi import Request
from test_evaluation import FakeModel

from openclaw_rl.errors import CommandError
from openclaw_rl.evaluation.runner import EvalOptions
from openclaw_rl.evaluation.suite import Suite, load_suite
from openclaw_rl.evaluation.through_openclaw import (
    OpenClawInstall,
    evaluate_through_openclaw,
    find_openclaw,
    shown_reply,
)
from openclaw_rl.servers import BackgroundServer

FAKE_OPENCLAW = r'''
import fcntl, json, os, sys, urllib.request
args = sys.argv[1:]
assert args[:2] == ["agent", "--local"], args
sid, message = args[args.index("--session-id") + 1], args[args.index("-m") + 1]
home = os.environ["HOME"]
lock = open(f"{home}/.openclaw/state.lock", "w")
try:  # as the real one: one `openclaw agent --local` at a time per HOME
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    sys.exit("failed to acquire gateway state ownership")
provider = json.load(open(f"{home}/.openclaw/openclaw.json"))["models"]["providers"]["openclaw-rl"]
history_file = f"{home}/.openclaw/{sid}.json"
history = json.load(open(history_file)) if os.path.exists(history_file) else []
history.append({"role": "user", "content": message})
body = {"model": provider["models"][0]["id"], "messages": [{"role": "system", "content": "agent"}] + history,
        "max_tokens": provider["models"][0]["maxTokens"],
        "tools": [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]}
headers = {"Content-Type": "application/json", "Authorization": "Bearer " + provider["apiKey"],
           "x-session-affinity": sid + ":1", **provider.get("headers", {})}
req = urllib.request.Request(provider["baseUrl"] + "/chat/completions", json.dumps(body).encode(), headers)
reply = json.load(urllib.request.urlopen(req, timeout=30))["choices"][0]["message"]["content"]
if os.environ.get("FAKE_OPENCLAW_FAIL"):
    print("\u26a0\ufe0f Agent couldn't generate a response"); sys.exit(1)
history.append({"role": "assistant", "content": reply})
json.dump(history, open(history_file, "w"))
print("\x1b[36m[model-fetch] response provider=openclaw-rl status=200\x1b[0m")
print(reply)
'''


class PairedModel(FakeModel):
    """Answers its first request only once a second one is in flight (or after 10 s): proof that two
    OpenClaw runs happened at once."""

    def __init__(self) -> None:
        super().__init__("formal")
        self.arrived, self.paired = 0, asyncio.Event()

    async def chat(self, request: Request) -> Any:
        self.arrived += 1
        if self.arrived >= 2:
            self.paired.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.paired.wait(), 10)
        return await super().chat(request)


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def fake_install(tmp_path: Path) -> OpenClawInstall:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "node", "#!/bin/sh\necho v24.16.0\n")
    claw = _executable(bin_dir / "openclaw", f"#!{sys.executable}\n{FAKE_OPENCLAW}")
    return OpenClawInstall(str(bin_dir), str(claw))


def test_people_talk_through_openclaw_as_side_turns(fake_install: OpenClawInstall) -> None:
    """Each conversation is one OpenClaw session, each turn one `openclaw agent` run, the reply OpenClaw
    shows is scored, and every model request carries ``X-Turn-Type: side`` although it has tools (which
    the proxy's classifier would otherwise train as a main turn). Two conversations run at once, each in
    its own HOME (two `openclaw agent --local` in one HOME fail)."""
    full = load_suite()
    suite = Suite(full.name, full.people[:1], full.homework[:1], ())
    model = PairedModel()
    with BackgroundServer(model.app) as server:
        opts = EvalOptions(conversations=2, turns=2, concurrency=2)
        outcomes = asyncio.run(evaluate_through_openclaw(f"{server.url}/v1", suite, opts, fake_install,
                                                         label="learned", api_key="k"))
    assert len(outcomes) == 2 * 2 + 2 and model.paired.is_set()
    assert all(o.detail["openclaw_exit"] == 0 for o in outcomes), [o.detail for o in outcomes]
    assert len(model.headers) == 6
    assert all(h["x-turn-type"] == "side" and h["authorization"] == "Bearer k" for h in model.headers)
    assert {h["x-session-affinity"] for h in model.headers} == {
        "eval-learned-ada-0:1", "eval-learned-ada-1:1", "eval-learned-homework-0:1", "eval-learned-homework-1:1"}
    chats = [o for o in outcomes if o.subject == "ada"]
    assert all(o.passed and o.detail == {"style": "formal", "openclaw_exit": 0} for o in chats)
    assert all(not o.reply.startswith("\x1b") and "[model-fetch]" not in o.reply for o in outcomes)
    # the second turn went into the same OpenClaw session (its history), with the person's reaction
    assert {o.turn for o in chats} == {0, 1} and all(o.prompt for o in chats)


def test_failed_openclaw_turns_score_as_failures_and_all_failing_is_an_error(
        fake_install: OpenClawInstall, monkeypatch: pytest.MonkeyPatch) -> None:
    full = load_suite()
    suite = Suite(full.name, full.people[:1], (), ())
    monkeypatch.setenv("FAKE_OPENCLAW_FAIL", "1")
    with BackgroundServer(FakeModel("formal").app) as server, pytest.raises(CommandError, match="couldn't generate"):
        asyncio.run(evaluate_through_openclaw(server.url, suite, EvalOptions(conversations=1, turns=1),
                                              fake_install))


def test_find_openclaw_needs_node_24(tmp_path: Path, fake_install: OpenClawInstall,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", fake_install.node_dir)
    assert find_openclaw(repo_root=tmp_path) == fake_install
    _executable(Path(fake_install.node_dir) / "node", "#!/bin/sh\necho v20.20.2\n")
    assert find_openclaw(repo_root=tmp_path) is None
    assert shown_reply("\x1b[2mlog\x1b[0m\nHello.\n") == "Hello."


def test_eval_command_through_openclaw(fake_install: OpenClawInstall, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from openclaw_rl.cli import main

    monkeypatch.setenv("PATH", f"{fake_install.node_dir}:{os.environ.get('PATH', '')}")
    base = ["eval", "--through-openclaw", "--conversations", "1", "--turns", "1", "--no-plot", "--out", str(tmp_path)]
    with BackgroundServer(FakeModel("formal").app) as server:
        assert main([*base, "--openclaw-bin", fake_install.openclaw, "--target", f"learned={server.url}/v1"]) == 0
    out = capsys.readouterr().out
    assert "4 file edits are skipped" in out and "written:" in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["settings"]["client"].startswith("stock OpenClaw")
    assert set(report["targets"][0]["scores"]) == {"first:formal", "first:casual", "homework"}
    assert main([*base, "--openclaw-bin", str(tmp_path / "missing"), "--target", "http://127.0.0.1:9/v1"]) == 1
    assert "--through-openclaw needs `openclaw` and Node >= 24" in capsys.readouterr().err
