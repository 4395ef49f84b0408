"""Turn the policy's sampled text into an OpenAI assistant message: reasoning, content, tool calls.

Stage: serving → **parsers** → response. Parsing only shapes what the *client* sees; the training
sample always keeps the sampled token ids untouched, so a parser can never corrupt training data.
The markup comes from the model family's ``ChatFormat`` (``chat_format.py``); parser names (SGLang's:
``qwen3``/``qwen25``, ``mistral``, or ``auto`` = the family the renderer detected) pick the family. Two
shapes of tool call: start/end-tagged JSON (``<tool_call>{json}</tool_call>``) and a start tag, a name and
self-delimiting JSON arguments (``[TOOL_CALLS]name[ARGS]{json}``). Both are parsed by one ``match`` that
the non-streaming ``extract`` and the ``StreamingParser`` (over SGLang's cumulative text) share.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import chat_format
from .chat_format import ChatFormat
from .ids import UniqueIds
from .unicode_text import has_lone_surrogate  # not from protocol: no pydantic schemas for config's users


@dataclass(slots=True)
class ParsedOutput:
    reasoning: str | None
    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


class ReasoningParser(Protocol):
    start: str | None  # the block's tags (None: no reasoning block)
    end: str | None

    def split(self, text: str) -> tuple[str | None, str]:
        """Return (reasoning or None, the rest)."""


class ToolParser(Protocol):
    start_tag: str
    ids: UniqueIds  # its calls' ids: unique, not secrets (ids.py)

    def match(self, block: str, final: bool) -> tuple[int, list[dict[str, Any]] | None] | None:
        """``block`` starts with ``start_tag``: (length of the call markup, its OpenAI tool calls, or None
        when it is malformed and stays visible as text). None: the markup may still grow (only if not final)."""

    def extract(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """Return (content without tool-call markup, OpenAI tool_calls)."""


class NoReasoning:
    start = end = None

    def split(self, text: str) -> tuple[str | None, str]:
        return None, text


class TagReasoning:
    """``[start]reasoning end content`` (Qwen3 ``<think>``, Magistral ``[THINK]``); thinking templates put
    the start tag in the prompt, so the output may begin inside the block."""

    def __init__(self, start: str, end: str):
        self.start, self.end = start, end

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


def openai_call(name: Any, args: Any, ids: UniqueIds) -> dict[str, Any] | None:
    """An OpenAI tool call from a parsed name and arguments (JSON-encoded unless a string), or None.
    None too when the model's JSON escapes decode to a lone surrogate (``"\\ud800"``): not Unicode, no
    client could read it; the markup then stays visible as the text the model wrote."""
    if not isinstance(name, str):
        return None
    arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    if has_lone_surrogate(name) or has_lone_surrogate(arguments):
        return None
    return {"id": f"call_{ids.hex(24)}", "type": "function", "function": {"name": name, "arguments": arguments}}


_NAME = re.compile(r"[\w.\-]+")
_JSON = json.JSONDecoder()


class _ToolMarkup:
    """``extract`` for every family, from its ``match``: non-streaming and streaming parse alike."""

    start_tag: str

    def match(self, block: str, final: bool) -> tuple[int, list[dict[str, Any]] | None] | None:
        raise NotImplementedError

    def extract(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        calls: list[dict[str, Any]] = []
        kept: list[str] = []
        pos = 0
        while (start := text.find(self.start_tag, pos)) >= 0:
            kept.append(text[pos:start])
            n, found = self.match(text[start:], final=True) or (len(text) - start, None)
            if found is None:  # malformed: leave it visible rather than lose it
                kept.append(text[start:start + n])
            else:
                calls += found
            pos = start + n
        kept.append(text[pos:])
        content = "".join(kept)
        return (content.strip() if calls else content), calls


class NoTools(_ToolMarkup):
    start_tag = "\x00never\x00"

    def match(self, block: str, final: bool) -> tuple[int, list[dict[str, Any]] | None] | None:
        return len(block), None


class TaggedJsonToolParser(_ToolMarkup):
    """``<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>`` (Qwen2.5/Qwen3, Hermes): start and end tags."""

    def __init__(self, start_tag: str, end_tag: str):
        self.start_tag, self.end_tag = start_tag, end_tag
        self.ids = UniqueIds()

    def match(self, block: str, final: bool) -> tuple[int, list[dict[str, Any]] | None] | None:
        end = block.find(self.end_tag, len(self.start_tag))
        if end < 0:
            return (len(block), None) if final else None  # unterminated at the end: shown as text
        try:
            obj = json.loads(block[len(self.start_tag):end].strip())
        except json.JSONDecodeError:
            obj = None
        call = openai_call(obj.get("name"), obj.get("arguments", obj.get("parameters", {})), self.ids) \
            if isinstance(obj, dict) else None
        return end + len(self.end_tag), None if call is None else [call]


class NamedArgsToolParser(_ToolMarkup):
    """``[TOOL_CALLS]name[ARGS]{…}`` (Mistral tokenizer v11+), or ``[TOOL_CALLS][{"name": …, "arguments": …}, …]``
    (earlier): no end tag, a call ends where its JSON ends. Until then the markup may still be growing."""

    def __init__(self, start_tag: str, args_tag: str):
        self.start_tag, self.args_tag = start_tag, args_tag
        self.ids = UniqueIds()

    def match(self, block: str, final: bool) -> tuple[int, list[dict[str, Any]] | None] | None:
        i = len(self.start_tag)
        if block[i:].lstrip().startswith("["):  # the JSON-list form
            pos = i + len(block[i:]) - len(block[i:].lstrip())
            parsed = self._json(block, pos, final)
            if parsed is None or parsed[1] is None:
                return parsed
            end, items = parsed
            calls = [openai_call(o.get("name"), o.get("arguments", {}), self.ids) if isinstance(o, dict) else None
                     for o in (items if isinstance(items, list) else [None])]
            return end, None if not calls or None in calls else calls  # type: ignore[return-value]
        a = block.find(self.args_tag, i)
        if a < 0:
            return (len(block), None) if final else None
        pos = a + len(self.args_tag)
        pos += len(block[pos:]) - len(block[pos:].lstrip())
        parsed = self._json(block, pos, final)
        if parsed is None or parsed[1] is None:
            return parsed
        end, args = parsed
        name = block[i:a].strip()  # raw text here, not a JSON string: only a function name is a call
        call = openai_call(name, args, self.ids) if isinstance(args, dict) and _NAME.fullmatch(name) else None
        return end, None if call is None else [call]

    @staticmethod
    def _json(block: str, pos: int, final: bool) -> tuple[int, Any] | None:
        """(end, the JSON value at ``pos``); (len, None) if it never completes; None while it may."""
        if block[pos:pos + 1] not in ("{", "["):  # only objects and lists end unambiguously
            return (len(block), None) if final or block[pos:] else None
        try:
            value, end = _JSON.raw_decode(block, pos)
        except json.JSONDecodeError:
            return (len(block), None) if final else None
        return end, value


class XmlParamsToolParser(TaggedJsonToolParser):
    """``<tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>…</function>\n</tool_call>``
    (Qwen3.5, Qwen3-Coder; SGLang's ``qwen3_coder``). A value that is a JSON object or list (the template's
    ``tojson`` of a mapping or sequence) is decoded; every other value stays a string: without the tool's
    schema "42" may be a string as well as a number (SGLang converts by the request's schema)."""

    _FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.DOTALL)
    _PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)

    def match(self, block: str, final: bool) -> tuple[int, list[dict[str, Any]] | None] | None:
        end = block.find(self.end_tag, len(self.start_tag))
        if end < 0:
            return (len(block), None) if final else None  # unterminated at the end: shown as text
        body = block[len(self.start_tag):end]
        fn = self._FUNCTION.fullmatch(body)
        call = None
        if fn and _NAME.fullmatch(fn.group(1).strip()):
            params = fn.group(2)
            args = {m.group(1).strip(): self._value(m.group(2)) for m in self._PARAMETER.finditer(params)}
            if not self._PARAMETER.sub("", params).strip():  # nothing but parameters inside the function
                call = openai_call(fn.group(1).strip(), args, self.ids)
        return end + len(self.end_tag), None if call is None else [call]

    @staticmethod
    def _value(text: str) -> Any:
        if text[:1] in ("{", "["):
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                pass
        return text


def _tool_parser(fmt: ChatFormat | None) -> ToolParser:
    if fmt is None:
        return NoTools()
    if fmt.tool_style == "xml_params":
        assert fmt.tool_end is not None
        return XmlParamsToolParser(fmt.tool_start, fmt.tool_end)
    if fmt.tool_style == "named_args":
        assert fmt.tool_args is not None
        return NamedArgsToolParser(fmt.tool_start, fmt.tool_args)
    assert fmt.tool_end is not None
    return TaggedJsonToolParser(fmt.tool_start, fmt.tool_end)


def _reasoning_parser(fmt: ChatFormat | None) -> ReasoningParser:
    if fmt is None or not fmt.reasons:
        return NoReasoning()
    return TagReasoning(fmt.think_start, fmt.think_end)  # type: ignore[arg-type]


# parser names (SGLang's, and the proxy settings' reasoning_parser / tool_parser) → the family they parse;
# "auto" is the family the chat renderer detected in the policy tokenizer, "none" turns parsing off.
REASONING_PARSERS: dict[str, str | None] = {"qwen3": "qwen", "deepseek-r1": "qwen", "mistral": "mistral",
                                            "none": None, "auto": "auto"}
TOOL_PARSERS: dict[str, str | None] = {"qwen25": "qwen", "qwen": "qwen", "hermes": "qwen", "mistral": "mistral",
                                       "qwen3_coder": "qwen35", "none": None, "auto": "auto"}


@dataclass(slots=True)
class OutputParser:
    reasoning: ReasoningParser
    tools: ToolParser

    @classmethod
    def for_format(cls, fmt: ChatFormat) -> OutputParser:
        return cls(_reasoning_parser(fmt), _tool_parser(fmt))

    @classmethod
    def named(cls, reasoning: str, tools: str, detected: ChatFormat | None = None) -> OutputParser:
        """Parsers by name; ``auto`` means the family of ``detected`` (the renderer's), else the default."""
        def family(table: dict[str, str | None], name: str) -> ChatFormat | None:
            if name not in table:
                raise ValueError(f"unknown parser {name!r}; reasoning parsers: {sorted(REASONING_PARSERS)}, "
                                 f"tool parsers: {sorted(TOOL_PARSERS)}")
            fam = table[name]
            if fam == "auto":
                return detected or chat_format.DEFAULT
            return None if fam is None else chat_format.get(fam)

        return cls(_reasoning_parser(family(REASONING_PARSERS, reasoning)), _tool_parser(family(TOOL_PARSERS, tools)))

    def parse(self, text: str, tools_enabled: bool = True, starts_in_reasoning: bool = False) -> ParsedOutput:
        end = self.reasoning.end
        if starts_in_reasoning and end and end not in text:
            return ParsedOutput(text.strip("\n"), "")  # truncated while still thinking
        reasoning, rest = self.reasoning.split(text)
        if not tools_enabled:
            return ParsedOutput(reasoning, rest)
        content, calls = self.tools.extract(rest)
        return ParsedOutput(reasoning, content, calls)

    def streaming(self, tools_enabled: bool = True, starts_in_reasoning: bool = False) -> StreamingParser:
        return StreamingParser(self, tools_enabled, starts_in_reasoning)


def _held_back(text: str, tags: tuple[str, ...]) -> int:
    """How many trailing characters could be the beginning of one of ``tags`` (so must wait): the longest
    proper prefix of a tag that ends ``text``. Found from where the tag's first character occurs in the
    last ``len(tag) - 1`` characters (usually nowhere: one ``find`` per streamed snapshot, not one
    ``endswith`` per prefix length)."""
    best, n = 0, len(text)
    for tag in tags:
        if len(tag) < 2:
            continue
        j = text.find(tag[0], max(0, n - (len(tag) - 1)))
        while j >= 0:
            if tag.startswith(text[j:]):  # text[j:] is shorter than tag: a proper prefix of it
                best = max(best, n - j)
                break
            j = text.find(tag[0], j + 1)
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
        self.think_start, self.think_end = parser.reasoning.start, parser.reasoning.end
        self._think = bool(self.think_start and self.think_end)
        # None: not decided yet (start of output). A prompt that ends with the start tag opens the block.
        self.in_reasoning: bool | None = True if (starts_in_reasoning and self._think) else None
        self._skip_newlines = True  # template newlines around think tags are not content
        self.tool_calls: list[dict[str, Any]] = []

    def _deltas(self, text: str, final: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        start_tag, end_tag = self.think_start or "", self.think_end or ""
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
                if self._think and probe.startswith(start_tag):
                    self.in_reasoning = True
                    self.pos += len(rest) - len(probe) + len(start_tag)
                    self._skip_newlines = True
                    continue
                if self._think and not final and start_tag.startswith(probe):
                    break  # blank so far, or a partial start tag: wait for more text
                self.in_reasoning = False
                continue
            if self.in_reasoning:
                end = rest.find(end_tag)
                if end >= 0:
                    if end:
                        out.append({"reasoning_content": rest[:end]})
                    self.pos += end + len(end_tag)
                    self.in_reasoning = False
                    self._skip_newlines = True
                    continue
                hold = 0 if final else _held_back(rest, (end_tag,))
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
                found = self.p.tools.match(rest[start:], final)
                if found is None:  # the call is not complete yet
                    self.pos += start
                    break
                n, calls = found
                if calls is None:  # malformed (or unterminated at the end): show it as text
                    out.append({"content": rest[start:start + n]})
                for call in calls or ():
                    out.append({"tool_calls": [{"index": len(self.tool_calls), **call}]})
                    self.tool_calls.append(call)
                self.pos += start + n
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
