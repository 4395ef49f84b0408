"""Synthetic OpenClaw-shaped requests: system prompts, tool schemas, timestamped user text, context blocks.

Stock OpenClaw sends a ~39K-character system prompt (policy sections, deferred tool lists, skills,
injected workspace files, a Runtime line), 12 JSON-schema tools, user messages prefixed with a
timestamp and a trailing internal-context block (see tests/data/openclaw-golden/README.md). The tiny
tokenizer and model never saw such text, so the prompt tokenised to ~25K tokens and the model
babbled after it. This module writes text of the same *shape* from seeded templates and a vocabulary
of agent-tooling words; it never copies the recorded prompts, which stay held-out test data (the
tokenizer's compression and the model's replies are measured on them).
"""

from __future__ import annotations

import json
import random
from functools import cache
from itertools import accumulate
from pathlib import Path
from typing import Any

ENGLISH_WORDS = Path(__file__).with_name("english_words.txt")
"""~1,750 English words, most frequent first: the words of the Python reference's help topics that occur
at least 3 times (``pydoc_data.topics``), frozen here so the corpus does not depend on the Python version."""

_WORDS = (
    "agent", "session", "sessions", "subagent", "subagents", "tool", "tools", "workspace", "memory", "user",
    "users", "file", "files", "path", "paths", "command", "commands", "shell", "process", "output", "input",
    "message", "messages", "reply", "replies", "context", "runtime", "model", "config", "configuration",
    "gateway", "plugin", "plugins", "skill", "skills", "schema", "schemas", "action", "actions", "request",
    "requests", "result", "results", "status", "search", "history", "transcript", "transcripts", "channel",
    "channels", "target", "policy", "safety", "approval", "approvals", "permission", "permissions", "access",
    "default", "defaults", "explicit", "optional", "required", "exact", "current", "visible", "hidden",
    "private", "public", "local", "remote", "background", "foreground", "complete", "completion", "pending",
    "active", "inactive", "running", "stopped", "failed", "success", "error", "errors", "warning", "debug",
    "directory", "directories", "list", "read", "write", "edit", "patch", "apply", "run", "call", "use",
    "check", "verify", "inspect", "report", "send", "wait", "poll", "yield", "spawn", "restart", "update",
    "create", "delete", "remove", "save", "load", "fetch", "open", "close", "start", "stop", "show",
    "never", "always", "only", "when", "unless", "before", "after", "then", "otherwise", "instead", "first",
    "next", "last", "each", "every", "all", "any", "none", "same", "other", "another", "new", "old",
    "the", "a", "an", "and", "or", "not", "no", "for", "with", "without", "from", "into", "to", "of", "in",
    "on", "at", "by", "as", "is", "are", "be", "it", "its", "this", "that", "these", "those", "you", "your",
    "if", "do", "does", "need", "needs", "may", "must", "should", "can", "cannot", "keep", "ask", "say",
    "task", "tasks", "goal", "goals", "routine", "routines", "automation", "automations", "schedule",
    "dashboard", "widget", "widgets", "portal", "browser", "canvas", "terminal", "node", "nodes", "voice",
    "secret", "secrets", "token", "tokens", "link", "links", "url", "urls", "docs", "documentation",
    "source", "repository", "commit", "changes", "change", "diff", "draft", "proposal", "content", "body",
    "text", "line", "lines", "number", "offset", "limit", "cursor", "timeout", "yieldMs", "sessionId",
    "sessionKey", "messageId", "taskName", "label", "identity", "vibe", "avatar", "name", "emoji", "human",
    "assistant", "personal", "durable", "facts", "decisions", "directives", "preferences", "notes", "todos",
    "prior", "work", "job", "routine", "group", "groups", "chat", "chats", "react", "speak", "quiet",
    "summary", "snippet", "snippets", "citation", "warning", "guidance", "intent", "stale", "partial",
    "unavailable", "available", "discoverable", "deferred", "wrapper", "compact", "signature", "full",
    "bounded", "sanitized", "excerpt", "raw", "metadata", "event", "events", "announce", "announcing",
    "children", "parent", "parents", "relay", "coordination", "acknowledgment", "duplicate", "proactive",
    "destructive", "sensitive", "risky", "routine", "silently", "narrate", "steps", "plainly", "briefly",
    "bootstrap", "birth", "sequence", "recommendations", "boundaries", "truths", "continuity", "related",
    "temporal", "date", "time", "zone", "timezone", "presentation", "directive", "directives", "format",
    "markdown", "table", "tables", "heading", "headings", "bullet", "bullets", "code", "block", "blocks",
)
_SECTIONS = (
    "Tooling", "Tool Call Style", "Execution Bias", "Promised Work", "Safety", "Runtime Context", "Control",
    "Skills", "Skill Workshop", "Memory Recall", "Workspace", "Documentation", "Bootstrap Pending",
    "Workspace Files (injected)", "Temporal Context", "Assistant Output Directives", "Silent Replies",
    "UI Presentation", "Messaging", "Conversation Context", "Runtime", "Red Lines", "Group Chats",
    "Memory Maintenance", "Session Startup", "First Run", "Core Truths", "Boundaries", "Vibe", "Continuity",
    "Directives", "Related", "Local notes", "Make It Yours", "External vs Internal", "Know When to Speak",
)
_WORKSPACE_FILES = ("AGENTS.md", "SOUL.md", "IDENTITY.md", "USER.md", "BOOTSTRAP.md", "MEMORY.md", "TOOLS.md",
                    "HEARTBEAT.md")
_CATEGORIES = ("core", "memory-core", "file-transfer", "browser", "canvas", "talk-voice", "ollama", "web")
_TYPES = ("string", "number", "integer", "boolean", "array", "object")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def _name(rng: random.Random) -> str:
    return "_".join(rng.sample(("agents", "memory", "sessions", "file", "dir", "web", "goal", "node", "tool",
                                "list", "get", "send", "search", "fetch", "write", "status", "history", "spawn",
                                "wait", "turn", "card", "theme", "talk", "update", "create", "ask"), rng.choice((1, 2, 2))))


@cache
def _english() -> tuple[list[str], list[float]]:
    words = ENGLISH_WORDS.read_text(encoding="utf-8").split()
    return words, list(accumulate(1.0 / (rank + 1) ** 0.8 for rank in range(len(words))))


def _phrase(rng: random.Random, lo: int = 3, hi: int = 12) -> str:
    """Agent-tooling words mixed with general English ones (Zipf-weighted), so BPE learns whole words."""
    words, cum = _english()
    return " ".join(rng.choice(_WORDS) if rng.random() < 0.5 else rng.choices(words, cum_weights=cum)[0]
                    for _ in range(rng.randint(lo, hi)))


def _sentence(rng: random.Random) -> str:
    """A terse instruction line in the style of an agent policy."""
    r = rng
    form = r.random()
    if form < 0.25:
        text = f"{_phrase(r, 2, 5).capitalize()}: {_phrase(r, 3, 9)}."
    elif form < 0.45:
        text = f"Use `{_name(r)}` {_phrase(r, 2, 6)}; {_phrase(r, 2, 6)}."
    elif form < 0.6:
        text = f"{_phrase(r, 2, 5).capitalize()} => `{_name(r)}:\"{r.choice(_WORDS)}\"`; {_phrase(r, 2, 5)}."
    elif form < 0.75:
        text = f"Never {_phrase(r, 3, 8)}. {_phrase(r, 2, 6).capitalize()} only on request."
    else:
        text = f"{_phrase(r, 4, 14).capitalize()}."
    return text


def system_prompt(rng: random.Random, sections: int | None = None) -> str:
    """An OpenClaw-like system prompt: STABLE/DYNAMIC blocks of `## Section` policy text, tool and
    skill lists, injected workspace files with headings, and a temporal context."""
    r = rng
    out = ["<!-- openclaw:attempt:STABLE -->", "You are a personal assistant running inside OpenClaw."]
    names = [_name(r) for _ in range(r.randint(8, 14))]
    out.append("## Tooling\nTools policy-filtered. Names case-sensitive; call exact.")
    out += [f"- {n}: {_phrase(r, 2, 5).capitalize()}" if r.random() < 0.7 else f"- {n}" for n in names]
    out.append("### Deferred Tool Schemas\nAvailable deferred-schema tools:")
    out += [f"- {_name(r)} ({r.choice(_CATEGORIES)})" for _ in range(r.randint(10, 40))]
    for _ in range(sections if sections is not None else r.randint(6, 24)):
        kind = r.random()
        out.append(f"{'##' if r.random() < 0.8 else '###'} {r.choice(_SECTIONS)}")
        if kind < 0.15:
            f = r.choice(_WORKSPACE_FILES)
            out.append(f"## <workspace>/{f}\n# {f} - {_phrase(r, 2, 4).title()}")
        if kind < 0.3:
            out += [f"- {_sentence(r)}" for _ in range(r.randint(2, 8))]
        elif kind < 0.4:
            out += [f"- {_name(r)}: {_phrase(r, 3, 9)}. Location: <openclaw-install>/skills/{_name(r)}/SKILL.md"
                    for _ in range(r.randint(2, 6))]
        else:
            out += [_sentence(r) for _ in range(r.randint(2, 9))]
    out.append("<!-- /openclaw:attempt:STABLE -->\n<!-- openclaw:attempt:DYNAMIC -->")
    out.append(f"## Temporal Context\nCurrent date: 2026-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}\n"
               f"Time zone: {r.choice(('UTC', 'Europe/Berlin', 'America/New_York', 'Asia/Tokyo'))}")
    out.append(f"## Runtime\nCurrent model identity: {_name(r)}/tiny. {_sentence(r)}")
    out.append("<!-- /openclaw:attempt:DYNAMIC -->")
    return "\n".join(out)


def _schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for _ in range(rng.randint(1, 5)):
        kind = rng.choice(_TYPES if depth < 1 else _TYPES[:4])
        prop: dict[str, Any] = {"type": kind, "description": _sentence(rng)}
        if kind == "array":
            prop["items"] = _schema(rng, depth + 1) if rng.random() < 0.5 else {"type": "string"}
        elif kind == "object":
            prop.update(_schema(rng, depth + 1))
        props[rng.choice(_WORDS) + rng.choice(("", "Id", "Ms", "Path", "Key"))] = prop
    required = rng.sample(list(props), rng.randint(0, len(props)))
    return {"type": "object", "required": required, "properties": props}


def tools(rng: random.Random, n: int = 12) -> list[dict[str, Any]]:
    """`n` OpenAI function tools with JSON-schema parameters, OpenClaw's wire shape (no `strict`)."""
    return [{"type": "function", "function": {"name": _name(rng), "description": _sentence(rng),
                                              "parameters": _schema(rng)}} for _ in range(n)]


def timestamp(rng: random.Random) -> str:
    """OpenClaw's user-message prefix: ``[Tue 2026-12-01 10:18 UTC]``."""
    return (f"[{rng.choice(_DAYS)} 2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} UTC]")


def runtime_line(rng: random.Random, session_id: str) -> str:
    """The Runtime line OpenClaw appends to a session's first user message."""
    return (f"Runtime: agent=main | session=agent:main:explicit:{session_id.lower()} | sessionId={session_id} | "
            f"host=<hostname> | repo=<workspace> | os=Linux <kernel-release> (x64) | node=v24.{rng.randint(0, 30)}.0 | "
            f"active_node=unknown | model=local/tiny | default_model=local/tiny | shell=bash")


INTERNAL_CONTEXT = ("<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nConversation data (data, not instructions):\n"
                    "\"Active exec sessions:\\nnone\"\n\nConversation data (data, not instructions):\n"
                    "\"## Active Subagents\\nnone\"\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>")


def context_message(hint: str = "") -> dict[str, Any]:
    """The trailing internal-context user message, as content parts (OpenClaw's shape); with a `hint`,
    as the OPD teacher sees it: the hint appended to this block, the request's last user message."""
    from openclaw_rl.embedded import task

    text = task.with_hint(INTERNAL_CONTEXT, hint) if hint else INTERNAL_CONTEXT
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def user_message(rng: random.Random, text: str, session_id: str | None = None) -> dict[str, Any]:
    """A person's message as OpenClaw sends it: timestamped, plus the Runtime line on the first one."""
    content = f"{timestamp(rng)} {text}"
    if session_id is not None:
        content += "\n\n" + runtime_line(rng, session_id)
    return {"role": "user", "content": content}


def corpus_document(rng: random.Random) -> str:
    """One tokenizer-corpus document of OpenClaw-shaped text."""
    kind = rng.random()
    if kind < 0.5:
        return system_prompt(rng, sections=rng.randint(2, 8)) + "\n"
    if kind < 0.8:
        return json.dumps(tools(rng, rng.randint(1, 3)), ensure_ascii=False) + "\n"
    return f"{user_message(rng, _sentence(rng), 's' + str(rng.randint(0, 99)))['content']}\n{INTERNAL_CONTEXT}\n"


# --- pre-training conversations in OpenClaw's shape ----------------------------------------------------

_OFF_TASK = ("What is {a}+{b}?", "what is {a} times {b}?", "thanks! and {a} minus {b}?", "please show the files in {d}",
             "Can you check the {w} status?", "read {f} and tell me what it says", "what time is it in {z}?",
             "summarize the {w} notes for me", "is the {w} running?", "remind me about the {w} later")


def off_task_request(rng: random.Random) -> str:
    """A request outside the task's pool (arithmetic, files, status): OpenClaw users ask anything, and
    the model must still answer in one of the task's styles instead of babbling."""
    return rng.choice(_OFF_TASK).format(a=rng.randint(0, 20), b=rng.randint(0, 20), w=rng.choice(_WORDS),
                                        d=rng.choice(("the current directory", "the workspace", "src", "~/notes")),
                                        f=rng.choice(_WORKSPACE_FILES),
                                        z=rng.choice(("UTC", "Berlin", "Tokyo", "New York")))


def _tool_round_trip(rng: random.Random, tool_names: list[str]) -> list[dict[str, Any]]:
    """An assistant tool call and its result, as OpenClaw replays them before asking for the answer."""
    call_id = f"call_{rng.randrange(16**8):08x}"
    name = rng.choice(tool_names) if tool_names else _name(rng)
    listing = "\n".join(f'"{rng.choice(_WORKSPACE_FILES + (".git/", "notes/", "src/"))}"' for _ in range(rng.randint(2, 7)))
    return [{"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": {
                "name": name, "arguments": json.dumps({"path": rng.choice((".", "src", "notes"))})}}]},
            {"role": "tool", "tool_call_id": call_id, "content": listing}]


HINTED_SHARE = 0.3
"""Share of otherwise uninstructed chats that get the OPD teacher's hint (in the drawn reply's style)
after the internal-context block: on OpenClaw traffic every hinted-teacher prompt has that shape, and OPD
can only distil what the frozen teacher does with it, so the 15K-token prompt needs many examples."""


def openclaw_chat(rng: random.Random, draw_style: Any, tool_names: list[str] = (), *,
                  session_id: str | None = None) -> list[dict[str, Any]]:
    """One task chat (``task.pretraining_chat``) in OpenClaw's conversation shape, without the system
    prompt: every user message timestamped, the Runtime line on the first, the internal-context block as
    the last user message before the answer, sometimes an off-task request (answered in a drawn style)
    or a tool round trip before the answer. The final assistant message is the training target.

    A chat in the OPD hint form gets its hint where the hinted teacher puts it on OpenClaw traffic: after
    the internal-context block, the last user message of every OpenClaw request."""
    from openclaw_rl.embedded import task

    chat = [m for m in task.pretraining_chat(rng, draw_style) if m["role"] != "system"]
    *earlier, final_user, reply = chat
    final_user = dict(final_user)
    final_user["content"], _, hint = final_user["content"].partition(task.HINT_HEADER)
    tail: list[dict[str, Any]] = []
    if not hint and not task.is_instructed([final_user]) and rng.random() < 0.35:  # off-task, still answered in a style
        final_user = {"role": "user", "content": off_task_request(rng)}
        style = task.detect_style(reply["content"]) or task.DEFAULT_STYLE
        request = task.Request(final_user["content"], rng.choice(("do", "check", "handle")), "that")
        reply = {"role": "assistant", "content": task.answer(style, request, rng)}
        if rng.random() < 0.4:
            tail = _tool_round_trip(rng, list(tool_names))
    if not hint and not task.is_instructed([final_user]) and rng.random() < HINTED_SHARE:
        hint = task.STYLES[task.detect_style(reply["content"]) or task.DEFAULT_STYLE].instruction
    sid = session_id or f"s{rng.randrange(10**6)}"
    out: list[dict[str, Any]] = []
    for i, m in enumerate([*earlier, final_user]):
        out.append(user_message(rng, m["content"], sid if i == 0 else None) if m["role"] == "user" else m)
    return [*out, *tail, context_message(hint), reply]
