"""Which session a request belongs to, whether it is a main-line turn, and what its next state is.

Stage: serving → **identity** → sessions. Upstream OpenClaw-RL trusts ``X-Session-Id`` /
``X-Turn-Type`` headers that stock OpenClaw never sends, so stock traffic was silently never trained.
Here the session key comes from the strongest signal present (a pluggable, ordered list of resolvers):

1. ``explicit``: upstream's ``X-Session-Id`` header or body ``session_id``;
2. ``affinity``: OpenClaw's ``x-session-affinity`` / ``session_id`` headers (``compat.sendSessionAffinityHeaders``);
3. ``prompt_cache_key``: the body field (``compat.supportsPromptCacheKey``);
4. ``openclaw_runtime``: ``sessionId=<id>`` in the Runtime line OpenClaw appends to the first user message;
5. ``prefix``: a hash of the system prompt and the first user message (any client).

OpenClaw's affinity value is ``<sessionId>:<n>``; the ``:<n>`` generation suffix is dropped so all
signals name the same session. A next state is the whole user/tool run after the last assistant
message, without OpenClaw's per-request internal-context message (``next_state_of``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .config_values import is_truthy
from .errors import BadRequest
from .protocol import MAX_SESSION_ID_CHARS, ChatCompletionRequest, ChatMessage, TextPart

OPENCLAW_CONTEXT_MARKER = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"
OPENCLAW_SYSTEM_MARKER = "<!-- openclaw:attempt:"
_RUNTIME_SESSION = re.compile(r"Runtime:[^\n]*?\bsessionId=([^\s|]+)")
_GENERATION_SUFFIX = re.compile(r":\d+$")


@dataclass(frozen=True, slots=True)
class Identity:
    session_id: str  # the session's name within its namespace
    source: str  # which resolver produced it ("explicit", "affinity", …, or "none")


Resolver = Callable[[Mapping[str, str], ChatCompletionRequest], str | None]


def _explicit(headers: Mapping[str, str], req: ChatCompletionRequest) -> str | None:
    return headers.get("x-session-id") or req.session_id or None


def _affinity(headers: Mapping[str, str], req: ChatCompletionRequest) -> str | None:
    value = headers.get("x-session-affinity") or headers.get("session_id")
    return _GENERATION_SUFFIX.sub("", value) if value else None


def _prompt_cache_key(headers: Mapping[str, str], req: ChatCompletionRequest) -> str | None:
    return _GENERATION_SUFFIX.sub("", req.prompt_cache_key) if req.prompt_cache_key else None


def _openclaw_runtime(headers: Mapping[str, str], req: ChatCompletionRequest) -> str | None:
    for msg in req.messages:
        if msg.role == "user":
            m = _RUNTIME_SESSION.search(msg.text())
            return m.group(1) if m else None
    return None


def _prefix(headers: Mapping[str, str], req: ChatCompletionRequest) -> str | None:
    system = next((m.text() for m in req.messages if m.role in ("system", "developer")), "")
    first_user = next((m.text() for m in req.messages if m.role == "user" and not is_internal_context(m)), None)
    if first_user is None:
        return None
    digest = hashlib.sha256(f"{system}\x00{first_user}".encode()).hexdigest()[:20]
    return f"prefix-{digest}"


RESOLVERS: dict[str, Resolver] = {
    "explicit": _explicit, "affinity": _affinity, "prompt_cache_key": _prompt_cache_key,
    "openclaw_runtime": _openclaw_runtime, "prefix": _prefix,
}


def resolve_identity(order: Sequence[str], headers: Mapping[str, str], req: ChatCompletionRequest) -> Identity:
    """Apply the resolvers in ``order`` (names from ``RESOLVERS``); headers must be lower-cased."""
    for name in order:
        value = (RESOLVERS[name](headers, req) or "").strip()
        if not value:  # absent, empty or blank: the next signal decides (never one shared "" session)
            continue
        if len(value) > MAX_SESSION_ID_CHARS:
            raise BadRequest(f"session id from {name} is {len(value)} characters long; at most "
                             f"{MAX_SESSION_ID_CHARS} are accepted", param="session_id")
        return Identity(value, name)
    return Identity("unknown", "none")


def check_resolver_names(order: Sequence[str]) -> None:
    bad = [n for n in order if n not in RESOLVERS]
    if bad:
        raise ValueError(f"unknown identity resolver(s) {bad}; choose from {sorted(RESOLVERS)}")


# --- turn type ------------------------------------------------------------------------------------


def is_internal_context(msg: ChatMessage) -> bool:
    return msg.role == "user" and msg.text().lstrip().startswith(OPENCLAW_CONTEXT_MARKER)


def is_openclaw_agent_request(req: ChatCompletionRequest) -> bool:
    first = req.messages[0]
    return (first.role == "system" and first.text().startswith(OPENCLAW_SYSTEM_MARKER)) or \
        is_internal_context(req.messages[-1])


def classify_turn(classifier: str, headers: Mapping[str, str], req: ChatCompletionRequest) -> str:
    """"main" (trained) or "side" (only forwarded). An explicit header/body value always wins.

    ``auto``: requests with tools are main; OpenClaw-shaped requests without tools (memory flushes,
    summaries, heartbeats) are side; any other client's requests are main, so a generic OpenAI client
    is trained by default. ``tools_only``: only requests with tools are main. ``all_main``: everything.
    """
    explicit = headers.get("x-turn-type") or req.turn_type
    if explicit:
        return "main" if explicit.strip().lower() == "main" else "side"
    if classifier == "all_main" or req.tools:
        return "main"
    if classifier == "tools_only":
        return "side"
    return "side" if is_openclaw_agent_request(req) else "main"


def session_done(headers: Mapping[str, str], req: ChatCompletionRequest) -> bool:
    return is_truthy(headers.get("x-session-done", "")) or is_truthy(str(req.session_done))


# --- next state -----------------------------------------------------------------------------------


def next_state_of(messages: Sequence[ChatMessage]) -> dict[str, str] | None:
    r"""The user/tool evidence a request brings about the previous turn (its "next state"), or None.

    The rule, for every shape that can follow an assistant reply: the next state is the **whole trailing
    run** of user and tool messages after the last assistant message, in order, with OpenClaw's
    internal-context block (``<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>``, a user message OpenClaw adds to
    every request) left out wherever it stands. A judge needs all of it: a user's correction may come
    before a follow-up question, a tool error before the user's reply, and OpenClaw turns an image a
    tool returned into a user message after the tool result.

    Shapes (``ctx`` = the internal-context block; it changes nothing, first, between or last):

    * user → role "user", its text;
    * tool, tool, … → role "tool", the results' texts joined by blank lines;
    * user, user, … → role "user", the texts joined by blank lines;
    * tool then user, user then tool, any mix → role "user", each message as ``[tool result]\n<text>``
      or ``[user]\n<text>``, in order, joined by blank lines (the judge tells the tool's output from
      what the person wrote);
    * nothing, or only ctx → None.

    A string content is taken as is; a part list is its text parts joined by spaces, a non-text part
    (``image_url`` …) as ``[image_url]``. The role is "tool" only when no user spoke. Upstream takes the
    request's last message (``messages[-1]``): on stock OpenClaw that is the internal-context block,
    and with several tool results or user messages it keeps only the last.
    """
    run: list[ChatMessage] = []
    for msg in reversed(messages):
        if msg.role == "assistant":
            break
        if msg.role in ("user", "tool") and not is_internal_context(msg):
            run.append(msg)
    if not run:
        return None
    run.reverse()
    roles = {m.role for m in run}
    if len(roles) == 1:
        return {"role": run[0].role, "content": "\n\n".join(_state_text(m) for m in run)}
    labels = {"tool": "[tool result]", "user": "[user]"}
    return {"role": "user", "content": "\n\n".join(f"{labels[m.role]}\n{_state_text(m)}" for m in run)}


def _state_text(msg: ChatMessage) -> str:
    """A message's text for the judge: a string as is; parts: text parts, a non-text part as ``[type]``."""
    if isinstance(msg.content, str) or not msg.content:
        return msg.text()
    return " ".join(p.text if isinstance(p, TextPart) else f"[{p.type}]" for p in msg.content)
