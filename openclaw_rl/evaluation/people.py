"""The simulated people of ``openclaw-rl eval`` and how each conversation is scored.

Stage: **evaluation person** → proxy (``/v1/chat/completions``, as side turns) → checkpoint. Three kinds
of conversation, all from the held-out suite (``suite.py``):

* a *person with a hidden style preference*: scripted (thanks and the next request when a reply is in
  the style, a correction and the same request otherwise, like the training users but on requests they
  never ask), or model-played (``ModelPlayer``: any OpenAI-compatible model writes the person's messages
  from a persona that holds the preference). A reply to a message that states no preference is
  *uninstructed*: only those measure a learned preference; replies after a correction measure
  instruction-following and are scored apart.
* *homework*: an arithmetic question with its ground-truth answer; the reply's last number must be it.
* a *file edit*: a request with an ``edit_file`` tool; the reply must call it with the exact path, old
  and new text.

Each scored reply is an ``Outcome``; ``stats.py`` turns them into rates with intervals.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from openclaw_rl.chat_format import strip_reasoning
from openclaw_rl.embedded import task

from .suite import FileEdit, Homework, Person

EDIT_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "edit_file", "description": "Replace text in a file of the user's workspace.",
    "parameters": {"type": "object", "required": ["path", "old_text", "new_text"], "properties": {
        "path": {"type": "string", "description": "the file to edit"},
        "old_text": {"type": "string", "description": "the exact text to replace"},
        "new_text": {"type": "string", "description": "the text to put in its place"}}}}}


@dataclass(slots=True)
class Outcome:
    """One scored reply."""

    task: str
    """A row of the report: ``first:<preference>``, ``later:<preference>``, ``instructed:<preference>``
    (``style_row``), ``homework`` or ``file_edit``."""
    subject: str
    """The person's name, the question, or the file."""
    conversation: int
    turn: int
    prompt: str
    reply: str
    passed: bool
    detail: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def style_row(preference: str, turn: int, instructed: bool) -> str:
    """Which row a reply to a person counts in. ``first``: a conversation's first reply, with no history,
    the same opening request for every target: only training can move it. ``later``: an uninstructed
    reply further on, where the conversation (an earlier correction, earlier replies) may steer it in
    context. ``instructed``: a reply to a correction, i.e. instruction-following."""
    return f"{'instructed' if instructed else 'first' if turn == 0 else 'later'}:{preference}"


# --- scoring rules --------------------------------------------------------------------------------------

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(strip_reasoning(text).replace(",", ""))
    return numbers[-1] if numbers else None


def homework_passed(reply: str, item: Homework) -> bool:
    got = last_number(reply)
    try:
        return got is not None and float(got) == float(item.answer)
    except ValueError:
        return False


def edit_passed(message: Any, item: FileEdit) -> tuple[bool, dict[str, Any]]:
    """Whether the reply calls ``edit_file`` with the item's exact strings (and what it called)."""
    calls = []
    for call in getattr(message, "tool_calls", None) or []:
        fn = getattr(call, "function", None)
        name = getattr(fn, "name", "")
        try:
            args = json.loads(getattr(fn, "arguments", "") or "{}")
        except json.JSONDecodeError:
            args = None
        calls.append({"name": name, "arguments": args})
        if name == "edit_file" and isinstance(args, dict) and args.get("path") == item.path \
                and args.get("old_text") == item.old and args.get("new_text") == item.new:
            return True, {"tool_calls": calls}
    return False, {"tool_calls": calls}


# --- the people -----------------------------------------------------------------------------------------


class ScriptedPerson:
    """A person of the suite with a hidden preference, reacting by rule (the training users' rule)."""

    def __init__(self, person: Person, conversation: int):
        self.person = person
        self.rng = random.Random(person.seed * 1_000_003 + conversation)
        self.request = person.requests[0]

    def open(self) -> str:
        self.request = self.rng.choice(self.person.requests)
        return self.request

    async def react(self, reply: str, passed: bool) -> str:
        if passed:
            self.request = self.rng.choice(self.person.requests)
            return task.thanks(self.request, self.rng)
        return task.correction(self.person.preference, self.request)


PERSONA = ("You play {name}, a person chatting with an AI assistant. You privately want every answer written "
           "this way: \"{instruction}\" Do not say so while the answers are written that way; then thank the "
           "assistant briefly and ask a new everyday how-to question. When an answer is not written that way, "
           "say so in one short sentence that states the wish, and repeat your question. Write only {name}'s "
           "next message.")


class ModelPlayer(ScriptedPerson):
    """The same person, played by a model: its messages after the first come from `client` (any
    OpenAI-compatible endpoint, here or elsewhere), with a role-inverted history."""

    def __init__(self, person: Person, conversation: int, client: Any, model: str, *, temperature: float = 0.7):
        super().__init__(person, conversation)
        self.client, self.model, self.temperature = client, model, temperature
        self.history: list[dict[str, str]] = []

    def open(self) -> str:
        first = super().open()
        self.history = [{"role": "assistant", "content": first}]
        return first

    async def react(self, reply: str, passed: bool) -> str:
        from openclaw_rl.embedded.simulate import REPLY_PREFIX, chat_with_retry

        self.history.append({"role": "user", "content": REPLY_PREFIX + reply})
        system = PERSONA.format(name=self.person.name, instruction=task.STYLES[self.person.preference].instruction)
        completion = await chat_with_retry(self.client, model=self.model, temperature=self.temperature,
                                           max_tokens=256, messages=[{"role": "system", "content": system},
                                                                     *self.history])
        text = strip_reasoning(completion.choices[0].message.content or "").strip() or self.request
        self.history.append({"role": "assistant", "content": text})
        return text


class VoteJudge:
    """Majority of `votes` yes/no verdicts from a judge model on whether a reply meets a preference
    (instead of the opener rule of ``task.detect_style``)."""

    PROMPT = ("A user wants answers written this way: \"{instruction}\"\n\nThe user asked:\n{prompt}\n\n"
              "The assistant replied:\n{reply}\n\nIs the reply written the way the user wants? Answer with "
              "one word, YES or NO.")

    def __init__(self, client: Any, model: str, votes: int = 3, temperature: float = 0.7):
        if votes < 1:
            raise ValueError("--judge-votes must be at least 1")
        self.client, self.model, self.votes, self.temperature = client, model, votes, temperature

    async def passed(self, preference: str, prompt: str, reply: str) -> tuple[bool, list[str]]:
        import asyncio

        from openclaw_rl.embedded.simulate import chat_with_retry

        content = self.PROMPT.format(instruction=task.STYLES[preference].instruction, prompt=prompt, reply=reply)

        async def vote() -> str:
            completion = await chat_with_retry(self.client, model=self.model, temperature=self.temperature,
                                               max_tokens=64, messages=[{"role": "user", "content": content}])
            words = re.findall(r"[a-z]+", strip_reasoning(completion.choices[0].message.content or "").lower())
            return "yes" if "yes" in words[:3] else "no" if "no" in words[:3] else "invalid"

        votes = list(await asyncio.gather(*(vote() for _ in range(self.votes))))
        return votes.count("yes") > self.votes / 2, votes
