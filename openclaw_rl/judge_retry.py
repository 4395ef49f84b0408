"""Retries and context learning for judge/teacher calls: a failure that can pass must not drop a turn.

Stage: sessions → judge → **retry** → judge server. A judge call that fails for a reason that can pass
(the server unreachable, a 5xx, a timeout) is tried again with exponential backoff, within a bounded
number of attempts and a bounded time per call (``judge.retry_attempts``, ``judge.retry_max_s``); the
turn meanwhile stays in the spool as a waiting turn, so a restart re-judges it. Only then does the call
fail, and the turn is dropped as ``judge_failed`` as before. A 400 saying the request exceeds the judge's
context means the proxy used a stale or unknown context: the context is re-learned (from the message,
else from the server) and the call is retried at once, clamped. Anything else (a 4xx, an answer that
does not parse) fails at once: retrying cannot change it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from .errors import BackendTimeout, BackendUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

BACKOFF_CAP_S = 30.0  # the longest single wait between two attempts
# SGLang 0.5.23's 400s (tests/data/sglang-golden, error_too_long_with_output / error_too_long)
_CONTEXT_TOTAL = re.compile(r"exceeds the model's maximum context length of (\d+) tokens")
_CONTEXT_INPUT = re.compile(r"longer than the model's context length \((\d+) tokens\)")
_CONTEXT_OPENAI = re.compile(r"maximum context length is (\d+) tokens")  # OpenAI's and vLLM's wording


class JudgeStatusError(BackendUnavailable):
    """The judge answered with a status other than 200."""

    def __init__(self, path: str, status: int, text: str):
        super().__init__(f"judge {path} answered {status}: {text[:200]}")
        self.status, self.text = status, text


class ContextRelearned(BackendUnavailable):
    """A context-length 400 taught a new context: the same call, clamped again, may now pass."""


def context_from_error(text: str) -> int | None:
    """The judge's context in tokens as a context-length 400 states it (None if it is not one)."""
    match = _CONTEXT_TOTAL.search(text) or _CONTEXT_INPUT.search(text) or _CONTEXT_OPENAI.search(text)
    return int(match.group(1)) if match else None


def is_context_error(error: BaseException) -> bool:
    """A 400 about the request not fitting the judge's context (SGLang's or an OpenAI-style server's)."""
    if not isinstance(error, JudgeStatusError) or error.status != 400:
        return False
    text = error.text.lower()
    return "context length" in text or "context_length_exceeded" in text


def retry_reason(error: BaseException) -> str | None:
    """Why a failed call may pass when tried again ("unreachable", "timeout", "5xx", "context"), or None."""
    if isinstance(error, ContextRelearned):
        return "context"
    if isinstance(error, BackendTimeout):
        return "timeout"
    if isinstance(error, JudgeStatusError):
        return "5xx" if error.status >= 500 else None
    if isinstance(error, BackendUnavailable) and "unreachable" in error.message:
        return "unreachable"
    return None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 5  # tries per call, the first included (1 = never retry)
    max_s: float = 300.0  # no new attempt starts this long after the first one did
    backoff_s: float = 1.0  # wait before the 2nd attempt; doubles each time, at most BACKOFF_CAP_S


Hook = Callable[[str, str, str], None]  # (event "retry" | "gave_up", call "votes" | "teacher", reason)


class Retrier:
    """Runs one call's attempts under a ``RetryPolicy``; ``on_event`` counts retries and give-ups."""

    def __init__(self, policy: RetryPolicy, on_event: Hook | None = None, *,
                 sleep: Callable[[float], Awaitable[None]] | None = None, clock: Callable[[], float] = time.monotonic):
        self.policy, self.on_event = policy, on_event or (lambda event, call, reason: None)
        self.sleep, self.clock = sleep or self._backoff, clock
        self._stopping: asyncio.Event | None = None  # created on the loop that first waits

    def stop(self) -> None:
        """Graceful shutdown: calls waiting to retry end now, cancelled, so their turns stay in the spool
        and are judged again after the restart (as a judgement cut off by the drain timeout is)."""
        if self._stopping is None:
            self._stopping = asyncio.Event()
        self._stopping.set()

    async def _backoff(self, seconds: float) -> None:
        if self._stopping is None:
            self._stopping = asyncio.Event()
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except asyncio.TimeoutError:
            return
        raise asyncio.CancelledError("shutting down: the turn is judged again after the restart")

    async def run(self, attempt: Callable[[], Awaitable[T]], call: str) -> T:
        started, delay = self.clock(), self.policy.backoff_s
        for n in range(1, self.policy.attempts + 1):
            try:
                return await attempt()
            except (BackendUnavailable, BackendTimeout) as e:
                reason = retry_reason(e)
                if reason is None:
                    raise
                left = self.policy.max_s - (self.clock() - started)
                if n >= self.policy.attempts or left <= 0:
                    self.on_event("gave_up", call, reason)
                    log.warning("judge %s call gave up after %d attempts in %.1fs (%s): %s", call, n,
                                self.clock() - started, reason, e)
                    raise
                self.on_event("retry", call, reason)
                wait = 0.0 if reason == "context" else min(delay, left)
                log.info("judge %s call failed (%s), attempt %d of %d; next in %.1fs: %s", call, reason, n,
                         self.policy.attempts, wait, e)
                if wait > 0:
                    await self.sleep(wait)
                    delay = min(delay * 2, BACKOFF_CAP_S)
        raise AssertionError("unreachable: the loop returns or raises")  # attempts >= 1 (validated)
