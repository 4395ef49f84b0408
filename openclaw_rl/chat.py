"""Render an OpenAI conversation into the exact prompt token ids the policy will consume.

Stage: protocol → **chat template** → backend. The proxy renders the policy's own HF chat template
(with tools) and sends token ids to SGLang's ``/generate``, so the sample's prompt ids are exactly
what the policy saw. Content-part lists are flattened to text (images dropped: text-only policies),
``developer`` becomes ``system``. Sampled text is never tokenised here or anywhere else.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import chat_format
from .chat_format import ChatFormat
from .chat_template import ChatTemplateText
from .errors import BadRequest
from .fast_decode import Decode, fast_decoder
from .protocol import ChatMessage, Tool
from .tiktoken_bpe import byte_of_char, is_panic, tiktoken_encoder

log = logging.getLogger(__name__)


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
    """Arguments as the chat template gets them. OpenAI clients (OpenClaw included) send them as a JSON
    string; the policy emitted an object. A string holding a JSON object is decoded, as SGLang's and
    vLLM's chat servers (and upstream's proxy since 28a8d39) do before templating, so a template renders
    it exactly as the object form (Qwen3: ``arguments | tojson``; Qwen3.5's XML form: ``arguments|items``).
    An empty string means no arguments: ``{}``. Any other string (not JSON, or JSON that is not an
    object) is kept: a template that prints strings prints what the client sent, one that needs an
    object refuses it with a 400; never replaced by ``{}`` (upstream does that), which would train the
    policy on a call it did not make."""
    if isinstance(arguments, dict):
        return arguments
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return value if isinstance(value, dict) else arguments


_PROBE = "<|im_start|>user\nCaf\u00e9 \u0065\u0301 🙂 x  \n\n\t1234 don't [INST]<think></think>\r\n<tool_call>{\"a\": 1}"
_PROBES = (
    _PROBE, "", " " + _PROBE * 3,
    "DON'T We'LL it's\u00a0\u3000\u2028 \u200b 日本語のテキスト 中文 한국어 العربية Ελληνικά हिन्दी "
    "👩\u200d💻 🇩🇪 x²³ ½ 12345678901 3.14e-10 \t\t \n \r\n\r\n   end   ",
    "def f(x):\n    return {'a': [1, 2]}  # café\n\n\n<|im_end|>\n<|im_start|>assistant\n",
)


def fast_encoder(tokenizer: Any) -> Any:
    """``_build_fast_encoder(tokenizer)``, kept on the tokenizer for the next renderer of it (building
    costs ~40 ms for a 4K vocabulary, ~1 s for a 150K one; a process can hold a policy renderer, a judge
    and many test proxies of one tokenizer). Rebuilt when the tokenizer's size, its backend or its
    ``split_special_tokens`` changed."""
    key = (len(tokenizer), id(getattr(tokenizer, "_tokenizer", None)), getattr(tokenizer, "split_special_tokens", None))
    kept = getattr(tokenizer, _KEPT_ENCODER, None)
    if kept is not None and kept[0] == key:
        return kept[1]
    encode = _build_fast_encoder(tokenizer)
    try:
        setattr(tokenizer, _KEPT_ENCODER, (key, encode))
    except AttributeError:  # a tokenizer that takes no attributes: built each time
        pass
    return encode


_KEPT_ENCODER = "_openclaw_rl_fast_encoder"


def _build_fast_encoder(tokenizer: Any) -> Any:
    """``text -> ids`` as ``tokenizer.encode(text, add_special_tokens=False)`` gives them, at less cost where
    possible, cheapest first:

    - the tokenizer's BPE run by tiktoken (``tiktoken_bpe``: about a quarter of the CPU, measured on an
      8K-token prompt), for a byte-level BPE tokenizer of the shape it supports;
    - a fast (Rust) tokenizer's ``encode_batch_fast``, which skips the character offsets that ``encode``
      computes and the proxy never reads (a fifth of the time of an 8K-token encode);
    - ``encode`` itself.

    A faster one is used only if it gives ``encode``'s ids on a probe of special tokens, combining marks,
    emoji, scripts and whitespace runs."""
    def plain(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    def agrees(encode: Any) -> bool:
        try:
            return all(encode(t) == plain(t) for t in _PROBES)
        except BaseException as exc:  # any difference in behaviour (a Rust panic too) means: do not use it
            if not isinstance(exc, Exception) and not is_panic(exc):
                raise
            return False

    tiktoken_encode, why_not = tiktoken_encoder(tokenizer)
    if tiktoken_encode is not None:
        if agrees(tiktoken_encode):
            log.info("prompts are tokenised by tiktoken (the policy tokenizer's own BPE, same ids)")
            return tiktoken_encode
        why_not = "it differs from encode on a probe"
    log.info("prompts are tokenised by tokenizers, not tiktoken: %s", why_not)
    backend = getattr(tokenizer, "_tokenizer", None)
    fast = getattr(backend, "encode_batch_fast", None)
    if fast is None or getattr(backend, "truncation", None) or getattr(backend, "padding", None):
        return plain

    def quick(text: str) -> list[int]:
        return fast([text], add_special_tokens=False)[0].ids

    return quick if agrees(quick) else plain


def _positions(ids: array, token_id: int | None, start: int = 0) -> Any:
    """The indices (from ``start``, relative to it) where ``token_id`` stands in ``ids``: numpy's scan of the
    array's own buffer, which makes no int object per id (``list.count`` over 8K ids ~75 µs, this ~3 µs)."""
    return np.flatnonzero(np.frombuffer(ids, dtype=np.intc)[start:] == token_id)


def side_cache_key(session_key: str) -> str:
    """The prefix-cache key of a session's side turns: apart from its main line's, freed with it."""
    return f"{session_key}\x1fside"


@dataclass(slots=True)
class _Prefix:
    """A session's cached prompt prefix, with two places to cut it, longest first. Each cut ends right
    before a turn-start special token; its sha1 proves that a new prompt still starts with that much
    text, without keeping the text."""

    cuts: tuple[tuple[int, bytes, int], ...]  # (chars, sha1 of text[:chars], ids up to there)
    ids: array  # the longest cut's token ids, 4 bytes each (a Python list costs ~28 bytes per id)


def _token_byte_reader(tokenizer: Any) -> Any:
    """token id -> bytes, by the kind of decoder the tokenizer has; anything else decodes the id alone."""
    try:
        decoder = json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder") or {}
    except (AttributeError, ValueError, TypeError):
        decoder = {}
    kinds = {d.get("type") for d in decoder.get("decoders", [decoder])} if isinstance(decoder, dict) else set()
    added = {int(i): t.content for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    byte_of = byte_of_char() if "ByteLevel" in kinds else None
    byte_pieces = "ByteFallback" in kinds

    def read(token_id: int) -> bytes:
        if token_id in added:
            return added[token_id].encode()
        piece = tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str):
            if byte_of is not None and all(ch in byte_of for ch in piece):
                return bytes(byte_of[ch] for ch in piece)
            if byte_pieces and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                return bytes([int(piece[3:5], 16)])
            if byte_pieces:
                return piece.replace("\u2581", " ").encode()
        return tokenizer.decode([token_id]).encode("utf-8", "surrogatepass")

    return read


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
        self.encode_text = fast_encoder(tokenizer)
        # the same ids as an array("i"): tiktoken's buffer where the fast encoder is tiktoken (no int objects)
        self.encode_array: Callable[[str], array] = getattr(self.encode_text, "to_array", None) or self._array_of
        self.template_kwargs: dict[str, Any] = {}
        if enable_thinking is not None:
            self.template_kwargs["enable_thinking"] = enable_thinking
        self.template = ChatTemplateText(tokenizer, **self.template_kwargs)
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
        # Renders run on worker threads while forget() runs on the event loop: every change to the two
        # caches (store, move to end, evict, forget) holds this lock, so none sees a half-done other.
        self._lock = threading.Lock()
        self._token_bytes: Any = None  # built on the first logprobs request
        self._decoders: dict[bool, Decode] = {}  # by skip_special_tokens (fast_decode.py)

    @property
    def end_of_reply_ids(self) -> frozenset[int]:
        """The ids a reply can end with: the tokenizer's EOS, and the family's end-of-turn token where the
        tokenizer has it (a server stops on them; see ``backend.settle_abort``)."""
        eos = getattr(self.tokenizer, "eos_token_id", None)
        ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        added = self.tokenizer.get_added_vocab() if hasattr(self.tokenizer, "get_added_vocab") else {}
        if self.format.turn_end in added:
            ids.add(added[self.format.turn_end])
        return frozenset(int(i) for i in ids)

    def decoder(self, skip_special_tokens: bool = True) -> Decode:
        """``ids -> tokenizer.decode(ids, skip_special_tokens=…)``, the same text for less CPU (``fast_decode``)."""
        decode = self._decoders.get(skip_special_tokens)
        if decode is None:
            decode = self._decoders[skip_special_tokens] = fast_decoder(self.tokenizer, skip_special_tokens)
        return decode

    def token_bytes(self, token_id: int) -> list[int]:
        """A sampled token's own UTF-8 bytes (OpenAI's ``logprobs.content[].bytes``). A token may hold part
        of a character, whose decode alone is U+FFFD; its bytes are read from the vocabulary instead:
        byte-level BPE's printable stand-ins, or SentencePiece's ``<0xNN>`` byte pieces and ``▁`` spaces."""
        if self._token_bytes is None:
            self._token_bytes = _token_byte_reader(self.tokenizer)
        return list(self._token_bytes(token_id))

    def render(self, messages: list[dict[str, Any]], tools: list[Tool] | None = None,
               add_generation_prompt: bool = True, cache_key: str | None = None,
               plain: bool = False, with_array: bool = False) -> Any:
        """(text, ids), or with ``with_array`` (text, ids, ids as an ``array("i")``).
        ``plain``: ``messages`` come from ``normalize_messages`` of a request parsed from JSON (and so
        do ``tools``), i.e. plain data; see ``ChatTemplateText.__call__``. A caller that can use the
        array alone (the proxy's own turns) calls ``render_ids``: the list costs a Python int per id."""
        if cache_key is None and not with_array:
            text = self._text(messages, tools, add_generation_prompt, plain)
            return text, self.encode_text(text)
        text, ids_array = self.render_ids(messages, tools, add_generation_prompt, cache_key, plain)
        return (text, ids_array.tolist(), ids_array) if with_array else (text, ids_array.tolist())

    def render_ids(self, messages: list[dict[str, Any]], tools: list[Tool] | None = None,
                   add_generation_prompt: bool = True, cache_key: str | None = None,
                   plain: bool = False) -> tuple[str, array]:
        """(text, ids as an ``array("i")``): what a ``Turn`` keeps and ``/generate`` is sent (``codec.dumps``
        writes an array as a JSON list). With a cache key the ids are the cached prefix's array and the new
        ids, and no list of the ids is built anywhere on the way."""
        text = self._text(messages, tools, add_generation_prompt, plain)
        if cache_key is None or self.turn_start_id is None:
            return text, self.encode_array(text)
        return text, self._encode_cached(text, cache_key)

    def _text(self, messages: list[dict[str, Any]], tools: list[Tool] | None, add_generation_prompt: bool,
              plain: bool) -> str:
        tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools else None
        try:
            return self.template(messages, tool_dicts, add_generation_prompt, plain=plain)
        except Exception as e:  # jinja raise_exception(), bad role order, …: the client's conversation
            raise BadRequest(f"the conversation cannot be rendered with the policy's chat template: {e}",
                             param="messages") from e

    def _array_of(self, text: str) -> array:
        return array("i", self.encode_text(text))

    def _encode_cached(self, text: str, key: str) -> array:
        hit = self._cached_ids(text, self._cache.get(key))
        if hit is not None:
            self.cache_hits += 1
        else:
            hit = self._encode_first(text)
            self.cache_misses += 1
        ids, chars, known, digest = hit
        # Two cuts: before the last turn start (the generation prompt: a next request that adds messages
        # after this one shares all of it) and before the second-to-last (OpenClaw drops its trailing
        # context message on the next request, so that much is what such a prompt shares). Only the tail
        # is searched: the cost follows the new messages, not the history; the two counts (C scans: of the
        # text, and of the array's buffer, ``_positions``) check that text and ids agree on the turn starts.
        start, tid = self.turn_start, self.turn_start_id
        last = text.rfind(start)
        second = text.rfind(start, 0, last) if last > 0 else -1
        if second < 0:
            return ids
        if digest is not None and second >= chars:
            # Both cuts lie after the cut the ids came from (the session's or the shared first block's):
            # text[:chars] and ids[:known] hold the same number of turn starts (checked when they were
            # stored), so the counts are compared on the new part only, the ids' turn starts are looked
            # for there, and the digest goes on from the cut's.
            where = _positions(ids, tid, known)
            if text.count(start, chars) != len(where) or len(where) < 2:
                return ids
            id_second, id_last = known + int(where[-2]), known + int(where[-1])
            digest.update(text[chars:second].encode("utf-8", "surrogatepass"))
        else:
            where = _positions(ids, tid)
            if text.count(start) != len(where) or len(where) < 2:
                return ids
            id_second, id_last = int(where[-2]), int(where[-1])
            digest = hashlib.sha1(text[:second].encode("utf-8", "surrogatepass"))
        d_second = digest.digest()
        digest.update(text[second:last].encode("utf-8", "surrogatepass"))
        entry = _Prefix(((last, digest.digest(), id_last), (second, d_second, id_second)), ids[:id_last])
        with self._lock:
            self._cache[key] = entry
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return ids

    def _cached_ids(self, text: str, entry: _Prefix | None) -> tuple[array, int, int, Any] | None:
        """``text``'s ids from the longest cached cut it starts with, with that cut
        (chars, ids) and the sha1 of ``text[:chars]`` (None: it starts with none). Encoding the rest alone
        is exact because the cut lies before an added special token, which splits the text before BPE runs."""
        if entry is None:
            return None
        (c1, d1, n1), (c2, d2, n2) = entry.cuts
        if len(text) <= c2:
            return None
        h = hashlib.sha1(text[:c2].encode("utf-8", "surrogatepass"))
        if h.digest() != d2:
            return None
        if len(text) > c1:
            longer = h.copy()
            longer.update(text[c2:c1].encode("utf-8", "surrogatepass"))
            if longer.digest() == d1:
                return entry.ids + self.encode_array(text[c1:]), c1, n1, longer
        return entry.ids[:n2] + self.encode_array(text[c2:]), c2, n2, h

    def _encode_first(self, text: str) -> tuple[array, int, int, Any]:
        """A session's first encode: the shared first block's ids when another session had the same one.
        Returns what ``_cached_ids`` does: the ids, and the cut used (chars, ids and the sha1 of
        ``text[:chars]``; (0, 0, None) when none)."""
        cut = text.find(self.turn_start, 1)
        if cut <= 0:
            return self.encode_array(text), 0, 0, None
        h = hashlib.sha1(text[:cut].encode("utf-8", "surrogatepass"))
        digest = h.digest()
        with self._lock:
            head = self._shared.get(digest)
            if head is not None:
                self._shared.move_to_end(digest)
        if head is not None:
            return head + self.encode_array(text[cut:]), cut, len(head), h
        ids = self.encode_array(text)
        where = _positions(ids, self.turn_start_id, 1)
        if not len(where):
            return ids, 0, 0, None
        id_cut = 1 + int(where[0])
        if text.count(self.turn_start, 0, cut) == len(_positions(ids[:id_cut], self.turn_start_id)):  # one block
            with self._lock:
                self._shared[digest] = ids[:id_cut]
                while len(self._shared) > self.shared_size:
                    self._shared.popitem(last=False)
        return ids, 0, 0, None

    def forget(self, key: str) -> None:
        """Drop a session's cached prefixes, main line and side turns (its session ended or was evicted)."""
        with self._lock:
            self._cache.pop(key, None)
            self._cache.pop(side_cache_key(key), None)

    def encode(self, text: str) -> list[int]:
        """Tokenise text the *proxy* wrote (templates, hints), never sampled text."""
        return self.encode_text(text)

    def opens_thinking(self, prompt_text: str) -> bool:
        """Thinking templates end the generation prompt inside an open reasoning block."""
        return self.format.opens_reasoning(prompt_text)
