"""The text of the sampled ids, against which the backend's ``text`` is checked before a client sees it.

Stage: backend → **ids text** → serving. The sample trains on ``output_ids``; the client reads ``text``.
SGLang sends both, and nothing tied them: a backend that answered 10 MB of text with 48 ids had the
10 MB relayed while the 48 ids became the sample. Here the ids are decoded the way SGLang's detokenizer
does it (incrementally: each step decodes a window from the previous step's last stable token, and
holds back an incomplete character, U+FFFD, until it is whole), and the backend's text must be that
text: while streaming, a prefix of it (SGLang holds back incomplete characters and possible stop-string
starts); at the end, all of it, or, for a stop, all but a suffix no longer than the longest stop string
plus one token (SGLang trims the matched stop string or token from the text, never from the ids). Any
other text is refused as ``backend_invalid_output``. Cost: each id is decoded about twice, in windows
of a few tokens.
"""

from __future__ import annotations

from collections.abc import Callable

Decode = Callable[[list[int]], str]


CONTEXT_TOKENS = 5
"""Prompt tokens decoded ahead of the first output tokens (SGLang's ``INIT_INCREMENTAL_DETOKENIZATION_OFFSET``):
a SentencePiece tokenizer drops a leading space at the start of a decode, not after context."""


class IdsText:
    """The decoded text of a growing list of output ids (``update(ids)`` with the whole list so far), as
    SGLang's detokenizer builds it: ``decode(window)[len(decode(context)):]`` per step, where the context is
    the last stable step's ids (at first, the prompt's last ``CONTEXT_TOKENS``)."""

    __slots__ = ("decode", "stable", "_ctx", "_surr", "_read", "_tail")

    def __init__(self, decode: Decode, prompt_ids: list[int] | None = None):
        self.decode = decode
        self._ctx = list(prompt_ids[-CONTEXT_TOKENS:]) if prompt_ids else []
        self.stable = ""  # text of the ids before _read, whole characters only
        # positions in ctx + ids: the window's start (its context) and the end of the stable ids
        self._surr, self._read = 0, len(self._ctx)
        self._tail = ""  # text of the ids from _read on, not yet stable (ends with an incomplete character)

    @property
    def text(self) -> str:
        """All the ids' text, an incomplete last character as U+FFFD (SGLang's final text has it so)."""
        return self.stable + self._tail

    def _ids(self, ids: list[int], start: int, end: int) -> list[int]:
        """``(ctx + ids)[start:end]`` without building ``ctx + ids``."""
        n = len(self._ctx)
        if start >= n:
            return ids[start - n:end - n]
        return self._ctx[start:end] + ids[:max(0, end - n)]

    def update(self, ids: list[int]) -> str:
        end = len(self._ctx) + len(ids)
        if end > self._read:
            context = self.decode(self._ids(ids, self._surr, self._read)) if self._read > self._surr else ""
            new = self.decode(self._ids(ids, self._surr, end))[len(context):]
            if new and not new.endswith("\ufffd"):
                self.stable += new
                self._surr, self._read, self._tail = self._read, end, ""
            else:
                self._tail = new
        return self.text


def text_problem(text: str, ids_text: str, *, final: bool, stopped: bool, trim_bytes: int) -> str | None:
    """Why ``text`` is not the text of the ids (``ids_text``), or None. Streaming (not ``final``): it must be
    a prefix. Final: equal, or for a stop (``stopped``) a prefix short of at most ``trim_bytes`` bytes."""
    if text == ids_text:
        return None
    if not ids_text.startswith(text):
        return (f"its text ({len(text)} characters) is not the text of its {'' if final else 'streamed '}output "
                f"ids ({len(ids_text)} characters)")
    if not final:
        return None
    missing = len(ids_text[len(text):].encode("utf-8", "surrogatepass"))
    if stopped and missing <= trim_bytes:
        return None
    return f"its text lacks the last {missing} bytes of its output ids' text"
