"""A scripted core that holds a generation before a given token until the test lets it go.

Stage: test support for the **engine** (scripted core). A test that must act in the middle of a request
(pause, abort, weight update) used to slow the core down (a few tokens a second) and hope its action
landed before the reply ended: seconds of waiting, and a race under load. Here the request stops at a
known token on an event the test releases, and the test waits for the core's own signal that it is
there, so the action certainly lands mid-generation and no time passes waiting for it.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from openclaw_rl.engine.model import SamplingConfig, TokenStep
from openclaw_rl.engine.scripted import ScriptedModel


class TokenGate:
    """Holds the next ``times`` generations that reach token index ``at`` (0-based: ``at`` tokens are
    out) until ``release``. The core runs on a server's event loop in another thread: the test waits on
    ``wait_held`` (a condition variable) and releases through that loop."""

    def __init__(self, at: int, times: int = 1):
        self.at = at
        self._left = times
        self._cond = threading.Condition()
        self.held = 0
        """Generations that have reached the gate so far (the signal a test waits for)."""
        self._waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def pass_token(self, index: int) -> None:
        """Before the core samples token ``index``: wait here if this generation is one to hold."""
        with self._cond:
            if index != self.at or self._left <= 0:
                return
            self._left -= 1
            opened = asyncio.Event()
            self._waiting.append((asyncio.get_running_loop(), opened))
            self.held += 1
            self._cond.notify_all()
        await opened.wait()

    def wait_held(self, count: int = 1, timeout: float = 30.0) -> None:
        """Until ``count`` generations in all have reached the gate (the timeout only stops a hang)."""
        with self._cond:
            reached = self._cond.wait_for(lambda: self.held >= count, timeout)
        assert reached, f"{self.held} of {count} generations reached token {self.at}"

    def release(self) -> None:
        """Let every generation held now go on."""
        with self._cond:
            waiting, self._waiting = self._waiting, []
        for loop, opened in waiting:
            loop.call_soon_threadsafe(opened.set)

    def close(self) -> None:
        """Hold nothing more and release what is held (so a failed test leaves no request hanging)."""
        with self._cond:
            self._left = 0
        self.release()


class GatedModel(ScriptedModel):
    """A ``ScriptedModel`` (unpaced) whose generations pass ``gate`` before each token."""

    def __init__(self, tokenizer: Any, gate: TokenGate, **kw: Any):
        super().__init__(tokenizer, **kw)
        self.gate = gate

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> AsyncGenerator[TokenStep, None]:
        steps = super().generate(prompt_ids, sampling)
        try:
            for index in itertools.count():
                await self.gate.pass_token(index)  # before the step: it carries the weights it finds after
                try:
                    step = await anext(steps)
                except StopAsyncIteration:
                    return
                yield step
        finally:
            await steps.aclose()
