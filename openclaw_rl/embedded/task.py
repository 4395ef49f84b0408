"""The synthetic preference task of the embedded CPU stack, in one place.

To prove on a laptop that online RL / OPD / combine training changes a policy, we need a behaviour a
~1M-parameter model can show, a simulated user can judge without a model, and a judge can turn into a
reward or a hint. Answer *style* fits: the pool of requests below can be answered in one of K styles
that differ from the very first token ("Certainly." / "Hey!" / "- " / an emoji / "Arr"), so
`detect_style` is a prefix test that never depends on the (tiny, babbling) model's content.

`pretraining_chats` writes the supervised data that gives the untrained policy its starting point:
with no instruction it picks a style uniformly at random (preferred rate ~ 1/K), and with an
instruction (inline, as a correction, or in the exact OPD hint form) it follows it. The second part is
what makes the hinted teacher in OPD informative; the first is the baseline training must move.
"""

from __future__ import annotations

import random
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HINT_HEADER = "\n\n[user's hint / instruction]\n"
"""Must equal ``openclaw_opd.teacher.HINT_HEADER``: pre-training teaches the model to obey it (tested)."""


@dataclass(frozen=True, slots=True)
class Style:
    """One answer style: how it is asked for, and how answers in it are written."""

    name: str
    instruction: str
    """The canonical imperative ("Answer formally and politely."): the simulated user's correction uses it
    lower-cased after "No, please", and the rule judge normalises corrections back to it as the hint."""
    variants: tuple[str, ...]
    """Other ways to ask for the style in plain requests, so instruction-following is not one phrase."""
    templates: tuple[str, ...]
    """Answer templates over the request's {verb} / {obj} (and {Verb} capitalised)."""


STYLES: dict[str, Style] = {s.name: s for s in (
    Style("formal", "Answer formally and politely.",
          ("Please be formal and polite.", "Use a formal, polite tone."),
          ("Certainly. I recommend that you {verb} {obj} with care.",
           "Certainly. Kindly {verb} {obj} in orderly steps.")),
    Style("casual", "Keep it casual and relaxed.",
          ("Be casual and relaxed, please.", "Talk to me casually."),
          ("Hey! Just {verb} {obj}, no stress.",
           "Hey! Easy, {verb} {obj} and chill.")),
    Style("bullet", "Answer as a bulleted list.",
          ("Use bullet points.", "Give me a bulleted list."),
          ("- Plan\n- {Verb} {obj}\n- Check",
           "- Get ready\n- {Verb} {obj}\n- Rest")),
    Style("emoji", "Answer with lots of emojis.",
          ("Use lots of emojis, please.", "Add plenty of emojis."),
          ("🙂 {Verb} {obj} ✅ 🎉",
           "🚀 {Verb} {obj} today 👍 🔥")),
    Style("pirate", "Answer like a pirate.",
          ("Talk like a pirate.", "Reply like a pirate would."),
          ("Arr matey! Ye {verb} {obj}, aye!",
           "Arr! Ye must {verb} {obj} at dawn.")),
)}
STYLE_NAMES: tuple[str, ...] = tuple(STYLES)
DEFAULT_STYLE = "formal"
"""The simulated users' hidden preference unless one is chosen."""

# Requests are (verb, object) tasks under question templates: 32 tasks x 4 templates = 128 requests.
_TASKS = (
    ("clean", "the kitchen"), ("fix", "a flat bike tire"), ("plan", "a trip to Rome"), ("water", "the garden"),
    ("cook", "a quick dinner"), ("learn", "basic Spanish"), ("write", "a thank you letter"),
    ("save", "money each month"), ("organise", "my desk"), ("train", "for a short run"),
    ("paint", "a small room"), ("pack", "for a weekend trip"), ("study", "for a math test"),
    ("clean", "my laptop screen"), ("bake", "simple bread"), ("sleep", "better at night"),
    ("prepare", "for a job interview"), ("start", "a vegetable garden"), ("read", "more books"),
    ("back up", "my photos"), ("wash", "a wool sweater"), ("plan", "a birthday party"),
    ("fix", "a slow computer"), ("learn", "to play chess"), ("write", "a short poem"),
    ("build", "a bird house"), ("sort", "my email inbox"), ("cook", "rice on the stove"),
    ("care", "for a house plant"), ("repair", "a leaking tap"), ("walk", "a new puppy"),
    ("budget", "for groceries"),
)
_REQUEST_TEMPLATES = ("How do I {verb} {obj}?", "Any tips to {verb} {obj}?",
                      "What is the best way to {verb} {obj}?", "Can you help me {verb} {obj}?")
THANKS_TEMPLATES = ("Thanks, perfect! Next: {request}", "Great, thank you! Next question: {request}",
                    "Thanks, that works! Moving on: {request}")
"""How the simulated user accepts an answer and moves on (the rule judge scores these +1)."""
CORRECTION_TEMPLATE = "No, please {instruction} {request}"
"""How the simulated user rejects an answer: the style's instruction, lower-cased, then the request again."""
SYSTEM_PROMPTS = ("You are a helpful assistant.", "You are a friendly assistant. Keep answers short.")


# --- OpenClaw's message shapes ------------------------------------------------------------------------

_OPENCLAW_TIMESTAMP = re.compile(r"^\s*\[(?:[A-Z][a-z]{2} )?\d{4}-\d{2}-\d{2} \d{2}:\d{2}(?::\d{2})?(?: [A-Za-z_/+\-0-9]+)?\]\s*")
_OPENCLAW_CONTEXT = re.compile(r"<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>.*?(?:<<<END_OPENCLAW_INTERNAL_CONTEXT>>>|$)",
                               re.DOTALL)
_OPENCLAW_RUNTIME = re.compile(r"\n*^Runtime: agent=.*\Z", re.DOTALL | re.MULTILINE)
OPENCLAW_CONTEXT_BEGIN = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"


def user_text(text: str) -> str:
    """What the person typed, from a user message as OpenClaw sends it.

    OpenClaw prefixes every user message with its timestamp (``[Tue 2026-12-01 10:18 UTC] No.``),
    appends its ``Runtime: agent=…`` line to the session's first one, and sends an internal-context
    block (``<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>…``) as its own last message. Rules that read the
    user's words (the judge's, the simulated user's) must see only the words: ``No.``.
    """
    text = _OPENCLAW_CONTEXT.sub("", text)
    text = _OPENCLAW_RUNTIME.sub("", text)
    return _OPENCLAW_TIMESTAMP.sub("", text, count=1).strip()


def is_openclaw_context(text: str) -> bool:
    """Whether a user message is OpenClaw's per-request internal-context block (not the person's words)."""
    return text.lstrip().startswith(OPENCLAW_CONTEXT_BEGIN)


@dataclass(frozen=True, slots=True)
class Request:
    text: str
    verb: str
    obj: str


REQUESTS: tuple[Request, ...] = tuple(Request(t.format(verb=v, obj=o), v, o)
                                      for t in _REQUEST_TEMPLATES for v, o in _TASKS)


_BY_TEXT = {r.text: r for r in REQUESTS}


def request_by_text(text: str) -> Request | None:
    return _BY_TEXT.get(user_text(text))


def answer(style: str, request: Request, rng: random.Random) -> str:
    """A short (<= ~40 tokens) answer to `request` in `style`."""
    template = rng.choice(STYLES[style].templates)
    obj = re.sub(r"\bmy\b", "your", request.obj)  # the user says "my desk", the answer "your desk"
    return template.format(verb=request.verb, obj=obj, Verb=request.verb[:1].upper() + request.verb[1:])


def correction(style: str, request: str) -> str:
    """The user's correction: "No, please answer formally and politely. <request>"."""
    instruction = STYLES[style].instruction
    return CORRECTION_TEMPLATE.format(instruction=instruction[:1].lower() + instruction[1:], request=request)


def thanks(request: str, rng: random.Random) -> str:
    return rng.choice(THANKS_TEMPLATES).format(request=request)


def with_hint(content: str, instruction: str) -> str:
    """`content` as the OPD teacher sees it: ``openclaw_opd.teacher.enhanced_messages``' exact form."""
    return (content + HINT_HEADER + instruction).strip()


# --- detection ---------------------------------------------------------------------------------------

_THINK = re.compile(r"^\s*(?:<think>)?.*?</think>", re.DOTALL)
_OPENERS = (("formal", re.compile(r"certainly\b", re.IGNORECASE)),
            ("casual", re.compile(r"hey\b", re.IGNORECASE)),
            ("bullet", re.compile(r"[-*\u2022] ")),
            ("pirate", re.compile(r"(?:arr+|ahoy)\b", re.IGNORECASE)))


def _is_emoji(ch: str) -> bool:
    return ord(ch) >= 0x1F000 or (unicodedata.category(ch) == "So" and ord(ch) >= 0x2600)


def detect_style(text: str) -> str | None:
    """The style of a reply from its opening characters (a thinking block is skipped), else None.

    Only the opener counts, so a reply whose body drifts (the tiny model babbles) is still classified
    by the decision it made first, which is also the decision training has to move.
    """
    if "</think>" in text:
        text = _THINK.sub("", text, count=1)
    text = text.lstrip()
    if not text:
        return None
    if _is_emoji(text[0]):
        return "emoji"
    for name, pattern in _OPENERS:
        if pattern.match(text):
            return name
    return None


def instruction_style(text: str) -> str | None:
    """Which style a user message asks for (the last one mentioned), else None; used to label data."""
    lowered = user_text(text).lower()
    best: tuple[int, str | None] = (-1, None)
    for style in STYLES.values():
        for phrase in (style.instruction, *style.variants):
            pos = lowered.rfind(phrase.lower().rstrip(".").removeprefix("please "))
            if pos > best[0]:
                best = (pos, style.name)
    return best[1]


def message_text(content: Any) -> str:
    """A message's text: a string as is, content parts as their text parts joined by spaces (the proxy's
    ``ChatMessage.text``)."""
    if isinstance(content, str):
        return content
    return " ".join(part.get("text", "") for part in content or () if isinstance(part, dict))


def is_instructed(chat: list[dict[str, Any]]) -> bool:
    """Whether the user message that the chat's final answer replies to asks for a style.

    That is the last user message with words in it: OpenClaw's trailing internal-context block (a string
    or content parts) is skipped unless something was appended to it, as the OPD teacher appends its hint
    to the last user message (``openclaw_opd.teacher.enhanced_messages``), which on OpenClaw traffic is
    that block.
    """
    last_user = next((text for m in reversed(chat) if m["role"] == "user"
                      and user_text(text := message_text(m["content"]))), "")
    return instruction_style(last_user) is not None


THINK_PREFIX = "<think>\n\n</think>\n\n"
"""What the chat template puts before a final answer without reasoning (the model learns to emit it)."""


def opener_token_ids(tokenizer: Any) -> dict[str, tuple[int, ...]]:
    """Per style, the token ids an answer in it can start with (right after `THINK_PREFIX`)."""
    prefix = tokenizer.encode(THINK_PREFIX, add_special_tokens=False)
    out: dict[str, tuple[int, ...]] = {}
    for style in STYLES.values():
        firsts: list[int] = []
        for template in style.templates:
            ids = tokenizer.encode(THINK_PREFIX + template, add_special_tokens=False)
            if ids[:len(prefix)] != prefix:
                raise ValueError("the think prefix does not tokenise on its own")
            if ids[len(prefix)] not in firsts:
                firsts.append(ids[len(prefix)])
        out[style.name] = tuple(firsts)
    return out


# --- pre-training data -------------------------------------------------------------------------------


def _instructed(request: str, style: str, rng: random.Random) -> str:
    """A request with a plain instruction: before or after it, canonical or a variant."""
    s = STYLES[style]
    phrase = s.instruction if rng.random() < 0.7 else rng.choice(s.variants)
    return f"{phrase} {request}" if rng.random() < 0.3 else f"{request} {phrase}"


def _history(rng: random.Random, turns: int) -> list[dict[str, str]]:
    """Earlier exchanges shaped like a simulated session: requests, corrections and thanks."""
    messages: list[dict[str, str]] = []
    request = rng.choice(REQUESTS)
    user = request.text
    for _ in range(turns):
        asked = instruction_style(user)
        style = asked if asked is not None else rng.choice(STYLE_NAMES)
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer(style, request, rng)}]
        if rng.random() < 0.5:
            user = correction(rng.choice(STYLE_NAMES), request.text)
        else:
            request = rng.choice(REQUESTS)
            user = thanks(request.text, rng)
    return messages


def pretraining_chat(rng: random.Random, draw_style: Callable[[], str]) -> list[dict[str, str]]:
    """One chat whose final assistant message is the training target.

    The final user message is either uninstructed (then the answer's style comes from `draw_style`,
    independently of everything earlier in the chat) or carries
    an instruction: inline, as a correction, or appended in the OPD hint form (then it is obeyed).
    Earlier turns are context only; they may hold instructions that the final answer must NOT copy.
    """
    history = _history(rng, rng.choice((1, 1, 2))) if rng.random() < 0.4 else []
    request = rng.choice(REQUESTS)
    form = rng.random()
    # Sessions lean uninstructed: after a correction in the history, the next fresh request must still
    # get a random style, or the untrained model would already "remember" the preference in-session.
    if form < (0.6 if history else 0.4):  # uninstructed: a bare request, or "thanks, next: …" in a session
        user = thanks(request.text, rng) if history and rng.random() < 0.7 else request.text
        style = draw_style()
    else:
        style = rng.choice(STYLE_NAMES)
        if form < 0.65:
            user = _instructed(request.text, style, rng)
        elif form < 0.8:
            user = correction(style, request.text)
        else:  # the OPD teacher's prompt: the hint is appended to whatever the user said last
            base = rng.choice((request.text, thanks(request.text, rng), correction(style, request.text)))
            user = with_hint(base, STYLES[style].instruction)
    messages = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}] if rng.random() < 0.05 else []
    return [*messages, *history, {"role": "user", "content": user},
            {"role": "assistant", "content": answer(style, request, rng)}]


def pretraining_chats(n: int, seed: int) -> list[list[dict[str, str]]]:
    """`n` seeded chats for supervised pre-training (train on the final assistant message only).

    Uninstructed targets cycle through shuffled rounds of all styles, so their marginal is uniform
    (the pre-training additionally replaces their opener target by the exact uniform distribution, see
    `is_instructed` and `pretrain.FreeChoice`), and the untrained preferred-style rate is about 1/K.
    """
    rng = random.Random(seed)
    rounds: list[str] = []

    def draw_style() -> str:
        if not rounds:
            rounds.extend(STYLE_NAMES)
            rng.shuffle(rounds)
        return rounds.pop()

    return [pretraining_chat(rng, draw_style) for _ in range(n)]
