"""Turn the policy's sampled text into an OpenAI assistant message: reasoning, content, tool calls.

Stage: serving → **parsers** → response. Parsing only shapes what the *client* sees; the training
sample always keeps the sampled token ids untouched, so a parser can never corrupt training data.
Families are plug-ins looked up by name (``REASONING_PARSERS``, ``TOOL_PARSERS``):
qwen3-style ``<think>…</think>`` reasoning and qwen25/hermes-style ``<tool_call>{json}</tool_call>``.
``StreamingParser`` does the same incrementally over SGLang's cumulative streaming text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class ParsedOutput:
    reasoning: str | None
    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


class ReasoningParser(Protocol):
    def split(self, text: str) -> tuple[str | None, str]:
        """Return (reasoning or None, the rest)."""


class ToolParser(Protocol):
    start_tag: str

    def extract(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """Return (content without tool-call markup, OpenAI tool_calls)."""

    def parse_block(self, block: str) -> dict[str, Any] | None:
        """One tool call from the inside of a complete start…end block, or None if malformed."""


class NoReasoning:
    def split(self, text: str) -> tuple[str | None, str]:
        return None, text


class ThinkTagReasoning:
    """Qwen3: ``[<think>]reasoning</think>content``; thinking templates put ``<think>`` in the prompt."""

    start, end = "<think>", "</think>"

    def split(self, text: str) -> tuple[str | None, str]:
        stripped = text.lstrip()
        if self.end in text:
            reasoning, _, content = text.partition(self.end)
            reasoning = reasoning.lstrip()
            if reasoning.startswith(self.start):
                reasoning = reasoning[len(self.start):]
            return reasoning.strip("\n"), content.lstrip("\n")
        if stripped.startswith(self.start):  # truncated inside the thinking block
            return stripped[len(self.start):].strip("\n"), ""
        return None, text


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class NoTools:
    start_tag = "\x00never\x00"

    def extract(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        return text, []

    def parse_block(self, block: str) -> dict[str, Any] | None:
        return None


class HermesToolParser:
    """``<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>`` (Qwen2.5/Qwen3, Hermes)."""

    start_tag, end_tag = "<tool_call>", "</tool_call>"
    _block = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse_block(self, block: str) -> dict[str, Any] | None:
        try:
            obj = json.loads(block.strip())
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        return {"id": new_tool_call_id(), "type": "function",
                "function": {"name": obj["name"], "arguments": arguments}}

    def extract(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        calls: list[dict[str, Any]] = []
        kept: list[str] = []
        pos = 0
        for m in self._block.finditer(text):
            call = self.parse_block(m.group(1))
            kept.append(text[pos:m.start()])
            if call is None:  # malformed: leave it visible rather than lose it
                kept.append(m.group(0))
            else:
                calls.append(call)
            pos = m.end()
        kept.append(text[pos:])
        content = "".join(kept)
        return (content.strip() if calls else content), calls


REASONING_PARSERS: dict[str, type] = {"qwen3": ThinkTagReasoning, "deepseek-r1": ThinkTagReasoning,
                                      "none": NoReasoning}
TOOL_PARSERS: dict[str, type] = {"qwen25": HermesToolParser, "qwen": HermesToolParser,
                                 "hermes": HermesToolParser, "none": NoTools}


@dataclass(slots=True)
class OutputParser:
    reasoning: ReasoningParser
    tools: ToolParser

    @classmethod
    def named(cls, reasoning: str, tools: str) -> OutputParser:
        try:
            return cls(REASONING_PARSERS[reasoning](), TOOL_PARSERS[tools]())
        except KeyError as e:
            raise ValueError(f"unknown parser {e.args[0]!r}; reasoning parsers: {sorted(REASONING_PARSERS)}, "
                             f"tool parsers: {sorted(TOOL_PARSERS)}") from None

    def parse(self, text: str, tools_enabled: bool = True, starts_in_reasoning: bool = False) -> ParsedOutput:
        if starts_in_reasoning and isinstance(self.reasoning, ThinkTagReasoning) and "</think>" not in text:
            return ParsedOutput(text.strip("\n"), "")  # truncated while still thinking
        reasoning, rest = self.reasoning.split(text)
        if not tools_enabled:
            return ParsedOutput(reasoning, rest)
        content, calls = self.tools.extract(rest)
        return ParsedOutput(reasoning, content, calls)

    def streaming(self, tools_enabled: bool = True, starts_in_reasoning: bool = False) -> StreamingParser:
        return StreamingParser(self, tools_enabled, starts_in_reasoning)


def _held_back(text: str, tags: tuple[str, ...]) -> int:
    """How many trailing characters could be the beginning of one of ``tags`` (so must wait)."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(text)), 0, -1):
            if text.endswith(tag[:k]):
                best = max(best, k)
                break
    return best


class StreamingParser:
    """Incremental version of ``OutputParser.parse`` over cumulative text.

    ``feed(full_text_so_far)`` returns the OpenAI ``delta`` dicts to send now. Text that might be the
    start of a tag is held back; a tool call is sent whole (name and arguments in one delta, with its
    ``index``) once its closing tag arrives. ``finish()`` flushes what is left.
    """

    def __init__(self, parser: OutputParser, tools_enabled: bool, starts_in_reasoning: bool = False):
        self.p = parser
        self.tools_enabled = tools_enabled
        self.pos = 0  # consumed characters of the cumulative text
        self._think = isinstance(parser.reasoning, ThinkTagReasoning)
        # None: not decided yet (start of output). A prompt that ends with "<think>" opens the block.
        self.in_reasoning: bool | None = True if (starts_in_reasoning and self._think) else None
        self._skip_newlines = True  # template newlines around think tags are not content
        self.tool_calls: list[dict[str, Any]] = []

    def _deltas(self, text: str, final: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while self.pos < len(text):
            if self._skip_newlines and self.in_reasoning is not None:
                while self.pos < len(text) and text[self.pos] == "\n":
                    self.pos += 1
                if self.pos >= len(text):
                    break
                self._skip_newlines = False
            rest = text[self.pos:]
            if self.in_reasoning is None:
                probe = rest.lstrip()
                if self._think and probe.startswith("<think>"):
                    self.in_reasoning = True
                    self.pos += len(rest) - len(probe) + len("<think>")
                    self._skip_newlines = True
                    continue
                if self._think and not final and "<think>".startswith(probe):
                    break  # blank so far, or a partial "<think" tag: wait for more text
                self.in_reasoning = False
                continue
            if self.in_reasoning:
                end = rest.find("</think>")
                if end >= 0:
                    if end:
                        out.append({"reasoning_content": rest[:end]})
                    self.pos += end + len("</think>")
                    self.in_reasoning = False
                    self._skip_newlines = True
                    continue
                hold = 0 if final else _held_back(rest, ("</think>",))
                piece = rest[: len(rest) - hold]
                if piece:
                    out.append({"reasoning_content": piece})
                self.pos += len(piece)
                break
            # content mode
            tag = self.p.tools.start_tag if self.tools_enabled else None
            start = rest.find(tag) if tag else -1
            if start >= 0:
                if start:
                    out.append({"content": rest[:start]})
                end_tag = getattr(self.p.tools, "end_tag", None)
                end = rest.find(end_tag, start) if end_tag else -1
                if end < 0:
                    if final:  # unterminated block: show it as text
                        out.append({"content": rest[start:]})
                        self.pos = len(text)
                    else:
                        self.pos += start
                    break
                call = self.p.tools.parse_block(rest[start + len(tag): end])
                if call is None:
                    out.append({"content": rest[start:end + len(end_tag)]})
                else:
                    index = len(self.tool_calls)
                    self.tool_calls.append(call)
                    out.append({"tool_calls": [{"index": index, **call}]})
                self.pos += end + len(end_tag)
                continue
            hold = 0 if final or not tag else _held_back(rest, (tag,))
            piece = rest[: len(rest) - hold]
            if piece:
                out.append({"content": piece})
            self.pos += len(piece)
            break
        return out

    def feed(self, text: str) -> list[dict[str, Any]]:
        return self._deltas(text, final=False)

    def finish(self, text: str) -> list[dict[str, Any]]:
        return self._deltas(text, final=True)
