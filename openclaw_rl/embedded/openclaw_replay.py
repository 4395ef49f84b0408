"""Replay recorded OpenClaw conversations with a scripted user who corrects the style.

Real OpenClaw cannot be scripted cheaply (one Node process per turn, ~5 s of startup), and a person
cannot answer hundreds of turns, so "it learns from OpenClaw conversations" is measured by replaying the
*request shape* OpenClaw sends (tests/data/openclaw-golden): its exact system prompt and 12 tools, the
timestamp prefix on every user message, the Runtime line on the session's first one, the trailing
internal-context block as content parts, ``stream: true`` with usage, ``tool_choice``,
``max_completion_tokens`` and the session-affinity headers. Only the person's words change: the
``simulate.ScriptedUser`` asks the task's requests and thanks or corrects each reply. The proxy, engine,
judge and trainer behind it are ``openclaw-rl local``'s, unchanged.
"""

from __future__ import annotations

import copy
import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openclaw_rl.embedded import task
from openclaw_rl.embedded.simulate import (
    OnInteraction,
    ScriptedUser,
    SimulationResult,
    chat_with_retry,
    run_sessions,
)

_RUNTIME = re.compile(r"\n\nRuntime: agent=.*\Z", re.DOTALL)
_SESSION_FIELDS = re.compile(r"(session=agent:main:explicit:)[^ |]+( \| sessionId=)[^ |]+")


@dataclass(frozen=True, slots=True)
class OpenClawShape:
    """What one recorded OpenClaw request fixes: everything but the person's words."""

    system: dict[str, Any]
    tools: list[dict[str, Any]]
    runtime: str  # "\n\nRuntime: agent=main | session=… | sessionId=<id> | …" (first user message only)
    context: dict[str, Any]  # the internal-context user message, as content parts
    extra: dict[str, Any]  # stream, stream_options, tool_choice, max_completion_tokens, …

    @classmethod
    def from_recording(cls, path: Path, line: int = 0) -> OpenClawShape:
        body = json.loads(Path(path).read_text(encoding="utf-8").splitlines()[line])["body"]
        messages = body["messages"]
        first_user = next(m for m in messages if m["role"] == "user")
        runtime = _RUNTIME.search(first_user["content"])
        if messages[0]["role"] != "system" or runtime is None or not task.is_openclaw_context(
                task.message_text(messages[-1]["content"])):
            raise ValueError(f"{path}#{line} is not an OpenClaw request (system, Runtime line, context block)")
        extra = {k: v for k, v in body.items() if k not in ("messages", "tools", "model", "prompt_cache_key")}
        return cls(messages[0], body["tools"], runtime.group(0), messages[-1], extra)

    def runtime_for(self, session_id: str) -> str:
        return _SESSION_FIELDS.sub(lambda m: f"{m.group(1)}{session_id.lower()}{m.group(2)}{session_id}", self.runtime)

    def request(self, turns: list[dict[str, Any]]) -> dict[str, Any]:
        """The body OpenClaw would send for a session whose visible history is `turns`."""
        return {"messages": [self.system, *turns, copy.deepcopy(self.context)], "tools": self.tools, **self.extra}


def timestamped(text: str, when: float) -> str:
    """OpenClaw's prefix, ``[Tue 2026-12-01 10:18 UTC] text``, at UTC time `when`."""
    return f"[{time.strftime('%a %Y-%m-%d %H:%M UTC', time.gmtime(when))}] {text}"


async def _complete(client: Any, model: str, body: dict[str, Any], headers: dict[str, str]) -> str:
    """One streamed completion, as OpenClaw reads it: the concatenated content deltas."""
    kwargs = {k: v for k, v in body.items() if k in ("messages", "tools", "tool_choice", "stream", "stream_options",
                                                      "max_completion_tokens")}
    extra_body = {k: v for k, v in body.items() if k not in kwargs}
    response = await chat_with_retry(client, model=model, extra_headers=headers, extra_body=extra_body or None,
                                     **kwargs)
    if not kwargs.get("stream"):
        return response.choices[0].message.content or ""
    parts: list[str] = []
    async for chunk in response:
        for choice in chunk.choices:
            if choice.delta and choice.delta.content:
                parts.append(choice.delta.content)
    return "".join(parts)


async def run_openclaw_replay(base_url: str, *, shape: OpenClawShape, interactions: int, concurrency: int = 2,
                              preferred_style: str = task.DEFAULT_STYLE, seed: int = 0, turns_per_session: int = 4,
                              on_interaction: OnInteraction | None = None, model: str = "tiny", window: int = 20,
                              max_completion_tokens: int | None = None, timeout_s: float = 1800.0) -> SimulationResult:
    """Like ``simulate.run_simulation``, but every request has OpenClaw's recorded shape.

    A reply is what OpenClaw would show: the streamed content (the chat format's think block is the
    proxy's to strip). The OpenClaw history keeps each reply as the assistant message, as OpenClaw does.
    """
    from openai import AsyncOpenAI

    if max_completion_tokens is not None:
        shape = OpenClawShape(shape.system, shape.tools, shape.runtime, shape.context,
                              {**shape.extra, "max_completion_tokens": max_completion_tokens})
    result = SimulationResult(preferred_style, window=window)
    started = time.monotonic()
    clock = random.Random(seed)
    client = AsyncOpenAI(base_url=f"{base_url.rstrip('/')}/v1", api_key="openclaw", max_retries=0, timeout=timeout_s)

    async def session(index: int, turns: int) -> None:
        sid = f"replay{seed}x{index}"
        headers = {"session_id": f"{sid}:0", "x-client-request-id": f"{sid}:0", "x-session-affinity": f"{sid}:0"}
        user = ScriptedUser(preferred_style, seed * 1_000_003 + index)
        when = 1_795_000_000 + clock.randrange(10**7)
        history: list[dict[str, Any]] = [{"role": "user",
                                          "content": timestamped(user.open(), when) + shape.runtime_for(sid)}]
        for turn in range(turns):
            reply = await _complete(client, model, shape.request(history), headers)
            next_message = result.judge_reply(user, sid, turn, reply, on_interaction)
            when += 40 + clock.randrange(60)
            history += [{"role": "assistant", "content": reply},
                        {"role": "user", "content": timestamped(next_message, when)}]

    try:
        await run_sessions(session, interactions, turns_per_session, concurrency)
    finally:
        await client.close()
    result.seconds = time.monotonic() - started
    return result


def shaped_prompts(shape: OpenClawShape, n: int, seed: int = 0) -> list[list[dict[str, Any]]]:
    """`n` first requests of fresh sessions (uninstructed task requests) in `shape`, as chat messages."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        request = rng.choice(task.REQUESTS)
        first = {"role": "user", "content": timestamped(request.text, 1_795_000_000 + 997 * i) + shape.runtime_for(f"p{i}")}
        out.append(shape.request([first]))
    return out
