"""OEL's experience: the extraction prompt, its parsing, and the experience-augmented teacher prompt.

Stage: mode scorer (``oel``) → **experience** → judge server. When a session ends, the judge reads the
whole conversation once and answers with concrete do/don't rules between ``[EXPERIENCE_START]`` and
``[EXPERIENCE_END]``, then ``\\boxed{1}`` (rules found) or ``\\boxed{0}`` (none). The rules are
deduplicated (case- and space-insensitive) and capped at ``max_tokens`` policy tokens, whole rules
only. The teacher sees them appended to the last user message (upstream also puts them in the last user
message); the student keeps answering from the bare prompt. The prompt text here is this project's own.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence
from typing import Any

EXTRACT_SYSTEM = """You distil experience for an AI assistant. You read one whole conversation between a \
user and the assistant and write down what the assistant should have known from the start: concrete, \
reusable rules drawn from the user's corrections, complaints, stated preferences and the tool errors \
the assistant met. Write each rule on its own line starting with "- ", as an instruction ("Answer in \
French.", "Do not use markdown tables."). Only rules the conversation supports; no rules about this \
one task's facts."""

EXTRACT_USER = """{previous}## Conversation
{conversation}
## End of conversation

Write the rules between [EXPERIENCE_START] and [EXPERIENCE_END], one "- " line each, then \\boxed{{1}}. \
If the conversation teaches nothing reusable, write \\boxed{{0}} and no rules."""

PREVIOUS = """## Experience already collected (keep what still holds, add what is new)
{experience}

"""

EXPERIENCE_HEADER = "\n\n[experience from earlier interactions with this user]\n"
_BLOCK = re.compile(r"\[EXPERIENCE_START\](.*?)\[EXPERIENCE_END\]", re.DOTALL)
ROLE_HEADER = "### {role}\n"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def render_conversation(messages: Sequence[dict[str, Any]]) -> str:
    """``### role`` sections, one per message, in order (system prompts left out: they are not feedback)."""
    parts = []
    for m in messages:
        role = str(m.get("role") or "user")
        if role in ("system", "developer"):
            continue
        parts.append(ROLE_HEADER.format(role=role) + _text(m.get("content")).strip() + "\n")
    return "\n".join(parts)


def extraction_prompt(messages: Sequence[dict[str, Any]], previous: str = "") -> str:
    prev = PREVIOUS.format(experience=previous) if previous.strip() else ""
    return EXTRACT_USER.format(previous=prev, conversation=render_conversation(messages))


def fit_conversation(messages: Sequence[dict[str, Any]], fits: Callable[[list[dict[str, Any]]], bool],
                     ) -> tuple[list[dict[str, Any]], int]:
    """The longest recent part of ``messages`` whose extraction prompt ``fits`` the judge's context, and
    how many of the oldest messages were left out. A long session would otherwise overflow the judge's
    context and fail every extraction call: its latest messages (the corrections that end a session) are
    kept whole; when even the last one alone is too long, the head of its text is cut (``…`` marks it).
    ``fits`` is monotone (fewer messages, fewer tokens), so a binary search calls it O(log n) times."""
    msgs = list(messages)
    if fits(msgs):
        return msgs, 0
    lo, hi = 1, len(msgs)  # invariant: msgs[hi:] fits (the empty tail trivially), msgs[lo - 1:] does not
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(msgs[mid:]):
            hi = mid
        else:
            lo = mid + 1
    if hi < len(msgs):
        return msgs[hi:], hi
    last = dict(msgs[-1])
    text = _text(last.get("content"))
    lo, hi = 0, len(text)  # the longest tail of the last message's text that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits([{**last, "content": "…" + text[len(text) - mid:]}]):
            lo = mid
        else:
            hi = mid - 1
    last["content"] = "…" + text[len(text) - lo:]
    return [last], len(msgs) - 1


def parse_rules(raw: str) -> list[str]:
    """The rule lines of a judge answer (the last experience block; none without one)."""
    blocks = _BLOCK.findall(raw)
    if not blocks:
        return []
    rules = []
    for line in blocks[-1].splitlines():
        line = line.strip().lstrip("-*•").strip()
        if line:
            rules.append(line)
    return rules


def merge_rules(*rule_lists: Sequence[str]) -> list[str]:
    """Concatenate, dropping repeats (compared lowercase, whitespace collapsed), first occurrence kept."""
    seen, out = set(), []
    for rules in rule_lists:
        for r in rules:
            key = " ".join(r.lower().split()).rstrip(".")
            if key and key not in seen:
                seen.add(key)
                out.append(r)
    return out


def cap_rules(rules: Sequence[str], count_tokens: Callable[[str], int], max_tokens: int) -> tuple[list[str], int]:
    """Whole rules while the rendered experience fits ``max_tokens``; (kept, number cut)."""
    kept: list[str] = []
    for i, r in enumerate(rules):
        if count_tokens(format_experience([*kept, r])) > max_tokens:
            return kept, len(rules) - i
        kept.append(r)
    return kept, 0


def format_experience(rules: Sequence[str]) -> str:
    return "\n".join(f"- {r}" for r in rules)


def experience_messages(messages: list[dict[str, Any]], experience: str) -> list[dict[str, Any]]:
    """The teacher's prompt: the experience appended to the last user message (as upstream, which puts it
    in the last user message; here after the user's text, where OPD's hint goes), or a new user message."""
    out = copy.deepcopy(messages)
    target = next((m for m in reversed(out) if m.get("role") == "user"), None)
    if target is None:
        out.append({"role": "user", "content": (EXPERIENCE_HEADER + experience).strip()})
        return out
    target["content"] = (_text(target.get("content")) + EXPERIENCE_HEADER + experience).strip()
    return out
