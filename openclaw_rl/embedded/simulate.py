"""Simulated users that drive the proxy, so "the policy learns from use" can be measured, not claimed.

Stage: **simulated user** → proxy (``/v1/chat/completions``) → policy; the user's next message is the
turn's next state that the judge scores. Two users:

* ``ScriptedUser`` (the embedded CPU stack): it holds a hidden preferred answer style (``task.py``);
  a reply in that style gets thanks and the next request, any other reply a concrete correction and
  the same request again. ``run_simulation`` records, per interaction, whether the reply matched.
  The learning curve counts only *uninstructed* interactions (fresh requests): after a correction
  the user has spelled the preference out, and a model that merely follows instructions would score
  there without having learned anything.
* ``LLMUser`` (GPU users with a real policy): any OpenAI-compatible endpoint plays a student or a
  teacher with a role-inverted history, like upstream's openclaw-test, until it says its sentinel.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from openclaw_rl.chat_format import strip_reasoning
from openclaw_rl.embedded import task

log = logging.getLogger(__name__)


# --- the scripted user ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Interaction:
    """One policy call and the user's verdict on its reply."""

    session: str
    turn: int
    style: str | None
    matched: bool
    instructed: bool
    """The prompt's last user message asked for the style (a correction): not evidence of learning."""


class ScriptedUser:
    """A user with a hidden preferred style who reacts to each reply as a real user would.

    ``open()`` starts a session and returns its first message; ``react(reply)`` returns the next one:
    "Thanks, perfect! Next: <request>" when the reply is in the preferred style, otherwise
    "No, please <instruction> <same request>". ``instructed`` says whether the pending message
    carries that instruction.
    """

    def __init__(self, preferred_style: str, seed: int):
        if preferred_style not in task.STYLES:
            raise ValueError(f"unknown style {preferred_style!r}; choose one of {list(task.STYLES)}")
        self.preferred = preferred_style
        self.rng = random.Random(seed)
        self.request: task.Request = task.REQUESTS[0]
        self.instructed = False

    def open(self) -> str:
        self.request = self.rng.choice(task.REQUESTS)
        self.instructed = False
        return self.request.text

    def react(self, reply: str) -> tuple[str, bool]:
        """(next user message, whether `reply` matched the preference)."""
        if task.detect_style(reply) == self.preferred:
            self.request = self.rng.choice(task.REQUESTS)
            self.instructed = False
            return task.thanks(self.request.text, self.rng), True
        self.instructed = True
        return task.correction(self.preferred, self.request.text), False


def moving_average(values: list[bool], window: int) -> list[float]:
    """Trailing mean over up to `window` values at each index (shorter at the start)."""
    out, total = [], 0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _rate(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


@dataclass(slots=True)
class SimulationResult:
    preferred_style: str
    interactions: list[Interaction] = field(default_factory=list)
    window: int = 20
    seconds: float = 0.0

    def judge_reply(self, user: ScriptedUser, session: str, turn: int, reply: str,
                    on_interaction: OnInteraction | None = None) -> str:
        """The scripted user reacts to `reply`: record the interaction, report progress, return the
        user's next message (shared by the simulated chats and the OpenClaw replay)."""
        instructed = user.instructed
        next_message, matched = user.react(reply)
        self.interactions.append(Interaction(session, turn, task.detect_style(reply), matched, instructed))
        if on_interaction is not None:
            on_interaction(self)
        return next_message

    @property
    def matches(self) -> list[bool]:
        """Per uninstructed interaction, in completion order: the reply was in the preferred style."""
        return [i.matched for i in self.interactions if not i.instructed]

    @property
    def matches_all(self) -> list[bool]:
        """Per interaction, corrections included (those mostly measure instruction-following)."""
        return [i.matched for i in self.interactions]

    def rate_curve(self, window: int | None = None) -> list[float]:
        return moving_average(self.matches, window or self.window)

    @property
    def first_window_rate(self) -> float:
        return _rate(self.matches[:self.window])

    @property
    def last_window_rate(self) -> float:
        return _rate(self.matches[-self.window:])

    @property
    def opening_matches(self) -> list[bool]:
        """Per session, in completion order: its first reply was in the preferred style. A first reply sees
        no earlier correction, so only training can move this rate; the later uninstructed replies of a
        session may follow a correction still in its history."""
        return [i.matched for i in self.interactions if i.turn == 0]

    def opening_rates(self) -> tuple[float, float]:
        """The opening-reply rate over the first and over the last window of sessions."""
        return _rate(self.opening_matches[:self.window]), _rate(self.opening_matches[-self.window:])

    def summary(self) -> str:
        return (f"{len(self.interactions)} interactions ({len(self.matches)} uninstructed) in {self.seconds:.0f}s; "
                f"preferred '{self.preferred_style}' rate: first {self.window} {self.first_window_rate:.0%} → "
                f"last {self.window} {self.last_window_rate:.0%}")

    def save_plot(self, path: str, title: str | None = None) -> None:
        """A learning-curve PNG: moving preferred-style rate, the initial baseline and the 80% target."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        curve = self.rate_curve()
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        ax.plot(range(1, len(curve) + 1), curve, label=f"moving rate (window {self.window})")
        ax.axhline(self.first_window_rate, color="grey", linestyle="--", label=f"baseline {self.first_window_rate:.0%}")
        ax.axhline(1 / len(task.STYLES), color="grey", linestyle=":", label="chance")
        ax.axhline(0.8, color="green", linestyle="--", label="80% target")
        ax.set(xlabel="uninstructed interaction", ylabel=f"'{self.preferred_style}' replies", ylim=(0, 1.02),
               title=title or f"preferred style '{self.preferred_style}'")
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


OnInteraction = Callable[[SimulationResult], None]
"""Called after every interaction with the live result (its newest record is ``interactions[-1]``)."""


async def chat_with_retry(client: Any, *, retry_timeout_s: float = 600.0, **kwargs: Any) -> Any:
    """``client.chat.completions.create`` that waits out 503/429 (Retry-After) and dropped connections.

    The proxy answers 503 + Retry-After while the trainer syncs weights; that is a pause, not a failure.
    """
    import openai

    deadline = time.monotonic() + retry_timeout_s
    while True:
        try:
            return await client.chat.completions.create(**kwargs)
        except openai.APIStatusError as exc:
            if exc.status_code not in (429, 503) or time.monotonic() > deadline:
                raise
            try:
                delay = float(exc.response.headers.get("retry-after", "1"))
            except ValueError:
                delay = 1.0
        except openai.APIConnectionError:
            if time.monotonic() > deadline:
                raise
            delay = 1.0
        await asyncio.sleep(max(0.0, min(delay, deadline - time.monotonic())))


def proxy_base_url(url: str) -> str:
    """The proxy's base URL from what a user pastes: ``http://host:port``, with or without ``/v1`` and
    trailing slashes (``local`` and ``serve`` print the ``/v1`` form, which OpenClaw's provider takes)."""
    base = url.strip().rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3].rstrip("/")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--proxy-url {url!r} is not an http(s) URL; give the one the proxy printed, "
                         "e.g. http://127.0.0.1:30000/v1")
    return base


async def run_simulation(base_url: str, *, interactions: int, concurrency: int,
                         preferred_style: str = task.DEFAULT_STYLE, seed: int = 0,
                         api_key: str = "x", session_headers: bool = True,
                         on_interaction: OnInteraction | None = None, turns_per_session: int = 4,
                         model: str = "default", max_tokens: int = 64, temperature: float | None = None,
                         window: int = 20, timeout_s: float = 120.0) -> SimulationResult:
    """Drive the proxy with `concurrency` simulated users for `interactions` policy calls in total.

    Each worker runs sessions of up to `turns_per_session` calls, with ``X-Session-Id`` and, on a
    session's last call, ``X-Session-Done``. Session k's user is seeded from (seed, k), so a run's
    requests do not depend on timing; the order of completions (and so the curve) may.
    """
    from openai import AsyncOpenAI

    result = SimulationResult(preferred_style, window=window)
    started = time.monotonic()
    client = AsyncOpenAI(base_url=f"{proxy_base_url(base_url)}/v1", api_key=api_key, max_retries=0, timeout=timeout_s)

    async def session(index: int, turns: int) -> None:
        sid = f"sim-{seed}-{index}"
        user = ScriptedUser(preferred_style, seed * 1_000_003 + index)
        messages: list[dict[str, str]] = [{"role": "user", "content": user.open()}]
        for turn in range(turns):
            last = turn == turns - 1
            headers = {"X-Session-Id": sid, **({"X-Session-Done": "true"} if last else {})} if session_headers else {}
            extra = {} if temperature is None else {"temperature": temperature}
            completion = await chat_with_retry(client, model=model, messages=messages, max_tokens=max_tokens,
                                               extra_headers=headers, **extra)
            reply = completion.choices[0].message.content or ""
            next_message = result.judge_reply(user, sid, turn, reply, on_interaction)
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": next_message}]

    try:
        await run_sessions(session, interactions, turns_per_session, concurrency)
    finally:
        await client.close()
    result.seconds = time.monotonic() - started
    return result


async def run_sessions(session: Callable[[int, int], Awaitable[None]], interactions: int,
                       turns_per_session: int, concurrency: int) -> None:
    """Play `interactions` calls as sessions of up to `turns_per_session` turns on `concurrency` workers.

    Session k is ``session(k, turns)``. It reserves its turns before it starts, so it knows which call is
    its last (the one that says X-Session-Done) whatever the other workers do.
    """
    issued = sessions = 0

    async def worker() -> None:
        nonlocal issued, sessions
        while (turns := min(turns_per_session, interactions - issued)) > 0:
            issued += turns
            index, sessions = sessions, sessions + 1
            await session(index, turns)

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))


# --- the LLM-driven user -------------------------------------------------------------------------------

REPLY_PREFIX = "The AI assistant replied:\n\n"
SCENARIOS: dict[str, dict[str, str]] = {
    "student": {
        "sentinel": "HOMEWORK_DONE",
        "system": "You play a lazy, casual student chatting with an AI assistant about your math homework; "
                  "you cannot solve it yourself. You want the full step-by-step solution written so that it "
                  "does not look AI-written: plain sentences, no bold, no numbered lists, no 'Final answer' "
                  "headings. If the reply looks AI-written or skips steps, ask for a natural rewrite. Write "
                  "short, casual messages as the student, never as the assistant. When you are satisfied, "
                  "reply with exactly HOMEWORK_DONE.",
        "opening": "hey, can you solve this homework problem for me? show me the answer first, then the "
                   "steps.\n\nProblem:\n{question}",
    },
    "teacher": {
        "sentinel": "GRADING_DONE",
        "system": "You play a busy, casual teacher who asks an AI assistant to write grading comments for a "
                  "student's homework. You want warm, patient, encouraging and detailed comments that explain "
                  "each mistake. If the comments are cold, short or vague, ask for a warmer or more detailed "
                  "rewrite. Write short messages as the teacher, never as the assistant. When you are "
                  "satisfied, reply with exactly GRADING_DONE.",
        "opening": "Please write grading comments for this homework, directly, no intro or summary.\n\n"
                   "Problem:\n{question}\nCorrect answer: {answer}\n\nStudent's answer: {student_answer}",
    },
}


def strip_thinking(text: str) -> str:
    return strip_reasoning(text)  # the LLM user's family is unknown: every known family's think blocks


class LLMUser:
    """An OpenAI-compatible model playing the user of `scenario` for one problem at a time.

    The simulator's history is role-inverted: its own messages are ``assistant`` messages, the policy's
    replies come back as ``user`` messages prefixed with "The AI assistant replied:".
    """

    def __init__(self, client: Any, model: str, scenario: str = "student", *, temperature: float = 0.7,
                 max_tokens: int = 1024):
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; choose one of {sorted(SCENARIOS)}")
        self.client, self.model, self.scenario = client, model, SCENARIOS[scenario]
        self.temperature, self.max_tokens = temperature, max_tokens
        self.history: list[dict[str, str]] = []

    @property
    def sentinel(self) -> str:
        return self.scenario["sentinel"]

    def open(self, problem: dict[str, str]) -> str:
        """The fixed first message for `problem` (the teacher grades a deliberately off-by-one answer)."""
        first = self.scenario["opening"].format(question=problem["question"], answer=problem["answer"],
                                                student_answer=_off_by_one(problem["answer"]))
        self.history = [{"role": "assistant", "content": first}]
        return first

    async def react(self, reply: str) -> str | None:
        """The user's next message, or None when it said its sentinel (the sentinel is not sent)."""
        self.history.append({"role": "user", "content": REPLY_PREFIX + reply})
        completion = await chat_with_retry(self.client, model=self.model, temperature=self.temperature,
                                           max_tokens=self.max_tokens,
                                           messages=[{"role": "system", "content": self.scenario["system"]},
                                                     *self.history])
        text = strip_thinking(completion.choices[0].message.content or "")
        if self.sentinel in text:
            return None
        self.history.append({"role": "assistant", "content": text})
        return text


def _off_by_one(answer: str) -> str:
    digits = answer.replace(",", "")
    try:
        return str(int(float(digits)) + 1)
    except ValueError:
        return "I don't know"


@dataclass(slots=True)
class ProblemOutcome:
    index: int
    completed: bool
    turns: int
    first_reply: str


async def run_llm_simulation(base_url: str, user_client: Any, user_model: str, *, scenario: str = "student",
                             problems: list[Any] | None = None, num_problems: int = 5, max_turns: int = 8,
                             concurrency: int = 1, api_key: str = "x", model: str = "default",
                             on_problem: Callable[[ProblemOutcome], None] | None = None) -> list[ProblemOutcome]:
    """Each problem is one proxy session; the LLM user talks until its sentinel or `max_turns` replies."""
    from openai import AsyncOpenAI

    from openclaw_rl.embedded.problems import PROBLEMS

    pool = list(problems if problems is not None else PROBLEMS)[:num_problems]
    policy = AsyncOpenAI(base_url=f"{proxy_base_url(base_url)}/v1", api_key=api_key, max_retries=0, timeout=300.0)
    slots = asyncio.Semaphore(max(1, concurrency))

    async def one(index: int, problem: Any) -> ProblemOutcome:
        async with slots:
            user = LLMUser(user_client, user_model, scenario)
            message: str | None = user.open(problem)
            messages: list[dict[str, str]] = []
            sid, first, turns = f"{scenario}-{index}-{time.time_ns()}", "", 0
            while message is not None and turns < max_turns:
                messages.append({"role": "user", "content": message})
                turns += 1
                headers = {"X-Session-Id": sid, **({"X-Session-Done": "true"} if turns == max_turns else {})}
                completion = await chat_with_retry(policy, model=model, messages=messages, extra_headers=headers)
                reply = completion.choices[0].message.content or ""
                first = first or reply
                messages.append({"role": "assistant", "content": reply})
                message = await user.react(reply)
            outcome = ProblemOutcome(index, message is None, turns, first)
            if on_problem is not None:
                on_problem(outcome)
            return outcome

    try:
        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(pool))))
    finally:
        await policy.close()


def drive_simulation(base_url: str, stop_event: Any, out: dict[str, Any], *, run: Any = None, **kwargs: Any) -> None:
    """Run ``run_simulation`` (or `run`, same signature) on a fresh event loop in the calling (background) thread.

    ``out`` is how the stack's main thread sees it: ``loop``/``task`` (to cancel on Ctrl-C), ``live`` (the
    running tally, for progress lines), ``result`` and ``done``. ``stop_event`` is set when the users are
    finished, so a trainer waiting for the next batch stops waiting."""
    loop = asyncio.new_event_loop()
    task_ = loop.create_task((run or run_simulation)(base_url, on_interaction=lambda r: out.__setitem__("live", r),
                                                     **kwargs))
    out["loop"], out["task"] = loop, task_
    try:
        out["result"] = loop.run_until_complete(task_)
    except asyncio.CancelledError:
        pass
    except Exception:
        log.exception("the simulated users failed")
    finally:
        out["done"] = True
        stop_event.set()
        try:  # as asyncio.run does: finalize the clients' async generators on this loop, not at garbage collection
            loop.run_until_complete(loop.shutdown_asyncgens())  # (that printed "Task was destroyed but it is pending")
        finally:
            loop.close()
