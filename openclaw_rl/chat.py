"""Render an OpenAI conversation into the exact prompt token ids the policy will consume.

Stage: protocol → **chat template** → backend. The proxy renders the policy's own HF chat template
(with tools) and sends token ids to SGLang's ``/generate``, so the sample's prompt ids are exactly
what the policy saw. Content-part lists are flattened to text (images dropped: text-only policies),
``developer`` becomes ``system``. Sampled text is never tokenised here or anywhere else.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from . import chat_format
from .chat_format import ChatFormat
from .errors import BadRequest
from .protocol import ChatMessage, Tool


def normalize_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                                 for c in m.tool_calls]
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        if m.name:
            msg["name"] = m.name
        if m.reasoning_content:
            msg["reasoning_content"] = m.reasoning_content
        out.append(msg)
    return out


def _arguments(arguments: str | dict[str, Any]) -> dict[str, Any] | str:
    """Templates render dict arguments as JSON; a JSON string is decoded so both render alike."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return value if isinstance(value, dict) else arguments


def side_cache_key(session_key: str) -> str:
    """The prefix-cache key of a session's side turns: apart from its main line's, freed with it."""
    return f"{session_key}\x1fside"


@dataclass(slots=True)
class _Prefix:
    chars: int  # length of the cached text prefix (it ends right before a turn-start special token)
    digest: bytes  # sha1 of that prefix: proves a new prompt still starts with it, without keeping the text
    ids: array  # its token ids, 4 bytes each (a Python list costs ~28 bytes per id)


class ChatRenderer:
    """Owns the policy tokenizer: messages (+ tools) → prompt text and ids.

    Tokenising a 40 KB agent prompt on every turn is the proxy's main CPU cost, and each turn of a
    session repeats the previous prompt's prefix. Per session we keep the ids of that prefix cut right
    before a turn-start special token: added special tokens split the text before BPE runs, so
    ``encode(prefix) + encode(rest) == encode(prefix + rest)`` exactly, and only the new messages are
    tokenised. (Checked by tests against full encodes of real OpenClaw traffic.)

    The renderer owns the model family's markup (``self.format``, a ``ChatFormat``: turn markers, think
    and tool-call tags), detected from the tokenizer's special tokens unless given.
    """

    def __init__(self, tokenizer: Any, enable_thinking: bool | None = None, cache_size: int = 4096,
                 fmt: ChatFormat | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the policy tokenizer has no chat template; the proxy renders prompts itself")
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.template_kwargs: dict[str, Any] = {}
        if enable_thinking is not None:
            self.template_kwargs["enable_thinking"] = enable_thinking
        detected = chat_format.detect(tokenizer)
        self.format = fmt or detected or chat_format.DEFAULT
        self.turn_start = self.format.turn_start
        self.turn_start_id = tokenizer.convert_tokens_to_ids(self.turn_start) if detected is self.format else None
        if self.turn_start_id == getattr(tokenizer, "unk_token_id", None):
            self.turn_start_id = None  # the turn marker is not a special token of this tokenizer: no prefix cache
        self._cache: OrderedDict[str, _Prefix] = OrderedDict()
        self.cache_size = cache_size
        self.cache_hits = self.cache_misses = 0
        # Shared by all sessions: the ids of a prompt's first block (system prompt and tools, cut before
        # the second turn start), keyed by its digest. OpenClaw's is ~25K tokens and the same in every
        # session, so a session's first request tokenises only its own messages.
        self._shared: OrderedDict[bytes, array] = OrderedDict()
        self.shared_size = 16

    def render(self, messages: list[dict[str, Any]], tools: list[Tool] | None = None,
               add_generation_prompt: bool = True, cache_key: str | None = None) -> tuple[str, list[int]]:
        tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools else None
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=tool_dicts, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt,
                                                      **self.template_kwargs)
        except Exception as e:  # jinja raise_exception(), bad role order, …: the client's conversation
            raise BadRequest(f"the conversation cannot be rendered with the policy's chat template: {e}",
                             param="messages") from e
        if cache_key is None or self.turn_start_id is None:
            return text, self.tokenizer.encode(text, add_special_tokens=False)
        return text, self._encode_cached(text, cache_key)

    def _encode_cached(self, text: str, key: str) -> list[int]:
        entry = self._cache.get(key)
        if entry is not None and len(text) > entry.chars and \
                hashlib.sha1(text[: entry.chars].encode("utf-8", "surrogatepass")).digest() == entry.digest:
            ids = entry.ids.tolist() + self.tokenizer.encode(text[entry.chars:], add_special_tokens=False)
            self.cache_hits += 1
        else:
            ids = self._encode_first(text)
            self.cache_misses += 1
        # Cut before the second-to-last turn start: OpenClaw drops its trailing context message on the
        # next request, so the prefix up to the last real message is what the next prompt will share.
        # Only the tail is searched (the last two turn starts): the cost follows the new messages, not
        # the history; the two counts (C loops) check that text and ids agree on the turn starts.
        start = self.turn_start
        last = text.rfind(start)
        chars = text.rfind(start, 0, last) if last > 0 else -1
        if chars >= 0 and text.count(start) == ids.count(self.turn_start_id):
            cut = _second_last_index(ids, self.turn_start_id)
            self._cache[key] = _Prefix(chars, hashlib.sha1(text[:chars].encode("utf-8", "surrogatepass")).digest(),
                                       array("i", ids[:cut]))
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return ids

    def _encode_first(self, text: str) -> list[int]:
        """A session's first encode: the shared first block's ids when another session had the same one."""
        cut = text.find(self.turn_start, 1)
        if cut <= 0:
            return self.tokenizer.encode(text, add_special_tokens=False)
        digest = hashlib.sha1(text[:cut].encode("utf-8", "surrogatepass")).digest()
        head = self._shared.get(digest)
        if head is not None:
            self._shared.move_to_end(digest)
            return head.tolist() + self.tokenizer.encode(text[cut:], add_special_tokens=False)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        try:
            id_cut = ids.index(self.turn_start_id, 1)
        except ValueError:
            return ids
        if text.count(self.turn_start, 0, cut) == ids[:id_cut].count(self.turn_start_id):  # both: one block
            self._shared[digest] = array("i", ids[:id_cut])
            while len(self._shared) > self.shared_size:
                self._shared.popitem(last=False)
        return ids

    def forget(self, key: str) -> None:
        """Drop a session's cached prefixes, main line and side turns (its session ended or was evicted)."""
        self._cache.pop(key, None)
        self._cache.pop(side_cache_key(key), None)

    def encode(self, text: str) -> list[int]:
        """Tokenise text the *proxy* wrote (templates, hints), never sampled text."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def opens_thinking(self, prompt_text: str) -> bool:
        """Thinking templates end the generation prompt inside an open reasoning block."""
        return self.format.opens_reasoning(prompt_text)


def _second_last_index(ids: list[int], token: int) -> int:
    """Index of the second-to-last ``token`` in ``ids`` (the caller knows there are at least two)."""
    seen = 0
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == token:
            seen += 1
            if seen == 2:
                return i
    raise ValueError("fewer than two turn starts")
