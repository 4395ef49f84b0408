"""A streamed ``/generate`` answer's bytes assembled into snapshots (``StreamAssembler``, ``SSEReader``).

Stage: backend → **answer parsing** (byte handling, no I/O of its own; one answer's meaning, resumption and
checks: ``sglang_answers.py``).

Streaming works in both of SGLang's modes, at a cost linear in the reply length:

- default (``incremental_streaming_output=false``): every chunk repeats all ids and log-prob triples so
  far, so a client that decodes each chunk in full does quadratic work (1.8 s of CPU for a 2,048-token
  reply). ``StreamAssembler`` cuts the text and the two big arrays out of the chunk's bytes (C-speed
  ``find``, started where the previous chunk's parts ended), decodes the small rest, and decodes only
  the text and array tails it has not seen yet; of several chunks that one read (or one gathering
  interval) completed, only the last is decoded, and the ones before it are dropped unread when the
  buffer needs room. What stays proportional to the bytes is the kernel's copy into the body buffer:
  the chunk framing is overwritten in place and an event alone in its HTTP chunk is not scanned for
  its end (``rawstream``, ``SSEReader``).
- ``--incremental-streaming-output``: each chunk carries only the new text, ids and triples; they are
  appended. The events of one read (or gathering interval) are decoded by one JSON call and checked
  one by one (``feed_many``). (Treating those chunks as cumulative is how a 1-token "response" got
  trained before.)

The mode is read per chunk from the counts: ``completion_tokens`` is cumulative in both modes, so a
chunk holding ``completion_tokens`` ids repeats everything, one holding ``completion_tokens - seen``
ids holds the new ones, and anything else means tokens were lost: the stream fails with a 502 and the
turn is dropped with that reason. The server's declared mode (``/get_server_info``) is read once, to
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import codec
from .errors import BackendUnavailable
from .rawstream import StreamConnection
from .sglang_answers import (
    GenerateResult,
    _aligned_logprobs,
    _check_error,
    _completion_tokens,
    _finish_and_version,
)

_IDS_KEY = b'"output_ids":['
_LOGPROBS_KEY = b'"output_token_logprobs":['
_SPLICE_MIN_BYTES = 2048  # below this a chunk is decoded whole: cutting it up costs more than it saves


_TEXT_HEAD = b'{"text":"'  # SGLang puts text first: {"text":…,"output_ids":[…],"meta_info":{…}}
_TEXT_END = b'","output_ids":['
_LP_END = b']],"output_token_logprobs_length":'  # SGLang sets the two keys one after the other
_IDS_END = b'],"meta_info":'


@dataclass(slots=True)
class _Spans:
    """Where one event's big parts lie in its buffer; ``light`` is the event with all three emptied."""

    light: bytes
    ids: tuple[int, int]  # interior of output_ids
    triples: tuple[int, int]  # interior of output_token_logprobs
    text: tuple[int, int] | None  # interior of the text string (raw JSON), when the event starts with it


def _find_hinted(buf: bytearray | bytes, pattern: bytes, start: int, hint: int, end: int) -> int:
    """``pattern`` (unique in the event) searched from ``start + hint``, then, if not there, from ``start``."""
    i = buf.find(pattern, start + hint, end)
    return buf.find(pattern, start, end) if i < 0 and hint else i


def _splice(buf: bytearray | bytes, start: int, end: int, text_hint: int = 0, ids_hint: int = 0) -> _Spans | None:
    """Locate the interiors of ``text``, ``output_ids`` and ``output_token_logprobs`` in the event
    ``buf[start:end]`` without reading them; None when the event does not have SGLang's layout (then it
    is decoded whole).

    Searches start where the previous cumulative event's parts ended (``text_hint``, ``ids_hint``: the
    byte lengths of its text and ids interiors), so a chunk costs what is new in it, not what it repeats.
    A hint that overshoots (the event is not cumulative) finds nothing, and the search is redone from
    the part's start. The key patterns cannot occur inside a JSON string (their quotes would be escaped
    there), and the arrays hold only numbers and nulls (the proxy never asks for
    ``return_text_in_logprobs``), so ``]`` / ``]]`` end them.
    """
    text = None
    if buf.startswith(_TEXT_HEAD, start):
        t0 = start + len(_TEXT_HEAD)
        i = _find_hinted(buf, _TEXT_END, t0, text_hint, end)
        if i < 0:
            return None
        text, ids_start = (t0, i), i + len(_TEXT_END)
    else:  # e.g. --skip-tokenizer-init (no text)
        i = buf.find(_IDS_KEY, start, end)
        if i < 0:
            return None
        ids_start = i + len(_IDS_KEY)
    ids_end = _find_hinted(buf, _IDS_END, ids_start, ids_hint, end)
    if ids_end < 0:
        return None
    j = buf.find(_LOGPROBS_KEY, ids_end, end)  # past the short head of meta_info
    if j < 0:
        return None
    lp_start = j + len(_LOGPROBS_KEY)
    if buf[lp_start] == 0x5D:  # "]": no triples
        lp_end = lp_start
    else:
        lp_end = buf.rfind(_LP_END, lp_start, end)
        if lp_end < 0:  # another layout: the first "]]" still ends an array of number/null triples
            lp_end = buf.find(b"]]", lp_start, end)
        if lp_end < 0 or not buf.endswith(b"null", lp_start, lp_end):
            return None
        lp_end += 1
    head = (buf[start:text[0]], buf[text[1]:ids_start]) if text else (buf[start:ids_start],)
    light = b"".join((*head, buf[ids_end:lp_start], buf[lp_end:end]))
    return _Spans(light, (ids_start, ids_end), (lp_start, lp_end), text)


def _tail(buf: bytearray | bytes, start: int, end: int, count: int, sep: bytes) -> bytes:
    """The last ``count`` elements of the array interior ``buf[start:end]`` (elements joined by ``sep``)."""
    pos = end
    for _ in range(count):
        pos = buf.rfind(sep, start, pos)
        if pos < 0:
            return bytes(buf[start:end])
    return bytes(buf[pos + len(sep) - (1 if sep == b"],[" else 0):end])


def _json_string(raw: bytes | bytearray | memoryview) -> str:
    """A JSON string interior (raw bytes between the quotes) as text."""
    value = codec.loads(b'"' + bytes(raw) + b'"')
    if not isinstance(value, str):  # pragma: no cover - quotes around an interior always make a string
        raise ValueError("not a JSON string")
    return value


_MALFORMED = (*codec.DecodeError, KeyError, TypeError, ValueError, IndexError)
"""What a stream event that does not decode, or decodes to the wrong shape, raises while it is taken in."""


def _malformed(e: BaseException) -> BackendUnavailable:
    """The backend's fault (502) for one of ``_MALFORMED``: a plain ``try``/``except`` at each place an event is
    decoded, not a ``contextlib.contextmanager`` (one generator and four Python calls per read on the event
    loop: ~12 µs per streamed event in place, perf with Python 3.12's trampolines; docs/performance.md)."""
    if isinstance(e, codec.DecodeError):
        return BackendUnavailable(f"policy backend streamed non-JSON: {e}")
    return BackendUnavailable(f"policy backend streamed malformed /generate output: {e!r}")


_LF = 0x0A
"""``b"\\n"`` as the byte's value: ``bytes in bytes`` first tries its operand as an integer and builds (and
clears) a ``TypeError`` with a formatted message before it searches; an ``int`` operand is one ``memchr``."""


def _refuse_line_breaks(*parts: bytes | bytearray) -> None:
    """A JSON event line holds no line break. ``SSEReader`` may hand over a large event without scanning
    it (see its doc), so every part that gets decoded is checked here instead."""
    for part in parts:  # a loop, not any() over a generator: once per read on the event loop
        if _LF in part:
            raise BackendUnavailable("policy backend streamed a line break inside an event")


class StreamAssembler:
    """One streamed generation, assembled from SGLang's chunks in either streaming mode (see module doc).

    ``feed(buf, start, end)`` takes one event's JSON (a span of a buffer, so a large cumulative event is
    never copied) and returns the growing result; its lists are extended in place, never rebuilt. In the
    cumulative mode the text is decoded only past the previous chunk's (whose raw bytes it must repeat,
    checked with one ``memcmp``), and the arrays only past their previous lengths."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.text = ""
        self.mode: str | None = None  # "cumulative" | "incremental", once a chunk has told them apart
        self.chunks = 0
        self._ids_bytes = 0  # length of the previous spliced chunk's ids interior
        self._text_raw = bytearray()  # raw JSON interior that decodes to self.text (cumulative text), when known
        self._pieces: list[str] = []  # incremental text not yet joined onto self.text

    def _count_ids(self, buf: bytearray | bytes, start: int, end: int) -> int:
        """Ids in an ``output_ids`` interior. A cumulative chunk repeats the previous one's ids, so once
        that mode is established only the part past the previous chunk's ids is counted (a count over
        all of them is a byte loop over O(n) bytes per chunk)."""
        prev, self._ids_bytes = self._ids_bytes, end - start
        if self.mode == "cumulative" and 0 < prev < end - start and buf[start + prev] == 0x2C:  # ","
            return len(self.ids) + buf.count(b",", start + prev, end)
        return buf.count(b",", start, end) + 1 if end > start else 0

    def _spliced_text(self, buf: bytearray | bytes, span: tuple[int, int], cumulative: bool) -> str:
        """The text after a spliced chunk. Cumulative: the previous text plus the decoded new bytes when
        the chunk's raw text starts with the previous chunk's (it always does from SGLang), else all of it."""
        t0, t1 = span
        known = self._text_raw
        if cumulative and known and t1 - t0 >= len(known) and buf.startswith(known, t0):
            piece = _json_string(buf[t0 + len(known):t1])
            # a surrogate pair split by the boundary (\\ud83d|\\ude42) decodes differently in two parts
            if not (piece and 0xDC00 <= ord(piece[0]) <= 0xDFFF):
                known += buf[t0 + len(known):t1]  # extended in place: no copy of what it repeats
                return self.text + piece
        raw = bytearray(buf[t0:t1])
        text = _json_string(raw)
        self._text_raw = raw if cumulative else bytearray()
        return text if cumulative else self.text + text

    def feed(self, buf: bytearray | bytes, start: int = 0, end: int | None = None) -> GenerateResult:
        end = len(buf) if end is None else end
        try:
            spliced = None
            if end - start >= _SPLICE_MIN_BYTES:
                hinted = self.mode == "cumulative"
                spliced = _splice(buf, start, end, len(self._text_raw) if hinted else 0,
                                  self._ids_bytes if hinted else 0)
            raw = spliced.light if spliced else bytes(buf[start:end])
            _refuse_line_breaks(raw)
            return self._result(self._apply(codec.loads(raw), buf, spliced))
        except _MALFORMED as e:
            raise _malformed(e) from e

    def feed_many(self, buf: bytearray | bytes, spans: list[tuple[int, int]]) -> GenerateResult | None:
        """The events of one read (or gathering interval) as one snapshot. Cumulative: only the last is
        decoded (it repeats the others). Small incremental events: one JSON decode for all of them (an
        array of the events' bytes, which must hold exactly one object per event) and one snapshot;
        each event is checked as ``feed`` checks it."""
        if not spans:
            return None
        if self.mode == "cumulative":
            return self.feed(buf, *spans[-1])
        while self.mode is None and spans:  # one by one until the mode is known (the second event)
            last, spans = self.feed(buf, *spans[0]), spans[1:]
            if self.mode == "cumulative" and spans:
                return self.feed(buf, *spans[-1])
        if not spans:
            return last
        large = len(spans) == 1
        for s, e in spans:  # a loop, not any() over a generator: once per read on the event loop
            if e - s >= _SPLICE_MIN_BYTES:
                large = True
                break
        if large:
            for start, end in spans:
                last = self.feed(buf, start, end)
            return last
        raw = b"[" + b",".join([buf[s:e] for s, e in spans]) + b"]"
        try:
            _refuse_line_breaks(raw)
            events = codec.loads(raw)
            if len(events) != len(spans):  # an event of two objects ('{…},{…}') is not JSON
                raise BackendUnavailable("policy backend streamed non-JSON: an event is not one object")
            for data in events:
                meta = self._apply(data, buf, None)
            return self._result(meta)
        except _MALFORMED as e:
            raise _malformed(e) from e

    def _result(self, meta: dict[str, Any]) -> GenerateResult:
        if self._pieces:  # incremental text: joined once per snapshot, not once per event
            self.text += "".join(self._pieces)
            self._pieces.clear()
        finish, version, pause_abort = _finish_and_version(meta)
        return GenerateResult(self.text, self.ids, self.logprobs, finish, int(meta.get("prompt_tokens", 0)), version,
                              pause_abort)

    def _apply(self, data: Any, buf: bytearray | bytes, spliced: _Spans | None) -> dict[str, Any]:
        """Check one decoded event against what was seen and take its new tokens; its ``meta_info``."""
        self.chunks += 1
        data = _check_error(data)
        meta = data["meta_info"]
        if spliced:
            ids_start, ids_end = spliced.ids
            lp_start, lp_end = spliced.triples
            count = self._count_ids(buf, ids_start, ids_end)
        else:
            ids_list, triples = data["output_ids"], meta.get("output_token_logprobs") or []
            count, self._ids_bytes = len(ids_list), 0
            if len(triples) != count:
                raise BackendUnavailable(f"policy backend streamed {count} ids but {len(triples)} log-probs "
                                         "(return_logprob off?)")
        seen, n = len(self.ids), _completion_tokens(meta)
        if n is None:  # an SGLang without completion_tokens: trust the mode seen so far, default cumulative
            n = count if self.mode != "incremental" else seen + count
        if count == n - seen:
            mode, new = "incremental", count
        elif count == n and n >= seen:
            mode, new = "cumulative", n - seen
        else:
            raise BackendUnavailable(f"policy backend stream lost tokens: chunk {self.chunks} reports {n} "
                                     f"completion tokens, holds {count} ids, {seen} were seen before")
        if seen and self.mode is None:
            self.mode = mode
        elif seen and mode != self.mode:
            raise BackendUnavailable(f"policy backend stream switched from {self.mode} to {mode} chunks")
        if not new:
            new_ids, new_triples = [], []
        elif spliced:
            ids_tail, triples_tail = _tail(buf, ids_start, ids_end, new, b","), _tail(buf, lp_start, lp_end, new, b"],[")
            _refuse_line_breaks(ids_tail, triples_tail)
            new_ids = list(map(int, codec.loads(b"[" + ids_tail + b"]")))
            new_triples = codec.loads(b"[" + triples_tail + b"]")
        else:
            new_ids = list(map(int, ids_list[count - new:]))
            new_triples = triples[len(triples) - new:]
        declared = meta.get("output_token_logprobs_length")
        if declared is not None and int(declared) != n:
            raise BackendUnavailable(f"policy backend reports {n} completion tokens but {declared} log-probs")
        self.logprobs += _aligned_logprobs(new_ids, new_triples)
        self.ids += new_ids
        cumulative = mode == "cumulative" or not seen  # a first chunk is both
        if spliced and spliced.text is not None:
            self.text = self._spliced_text(buf, spliced.text, cumulative)
        else:
            text = data.get("text")  # absent with --skip-tokenizer-init
            self._text_raw = bytearray()
            if text is not None and cumulative:
                self.text = text
                self._pieces.clear()
            elif text is not None:
                self._pieces.append(text)
        return meta


class _PushedBytes:
    """An ``SSEReader``'s own buffer, for bytes pushed to it (the httpx path); the raw client's
    ``StreamConnection`` offers the same four members over the buffer the kernel writes into."""

    _COMPACT_AT = 1 << 20

    lo = 0  # nothing is dropped unread here

    def __init__(self) -> None:
        self.buf = bytearray()
        self.base = 0  # bytes dropped from the front so far

    @property
    def end(self) -> int:
        return len(self.buf)

    def consumed(self, upto: int) -> None:
        done = upto - self.base  # the buffer is compacted now and then, not per event
        if done >= self._COMPACT_AT or done == len(self.buf):
            del self.buf[:done]
            self.base += done


class SSEReader:
    """Finds the ``data:`` payloads of an SSE byte stream in place: no decoding to text and no copies
    (a cumulative SGLang stream is hundreds of MB for a long reply). ``push(bytes)`` returns the spans
    of the payloads completed by those bytes (or, reading a ``StreamConnection``, by what it received),
    in ``self.buf``; ``consume()`` releases them once handled (spans are invalid afterwards). Offsets are
    kept from the stream's start, so they survive the source compacting its buffer. ``done`` is set by
    ``[DONE]``.

    A large event alone in its HTTP chunk (``StreamConnection.aligned``: how SGLang's server writes
    every event) is taken whole, up to the chunk's end, without scanning it for a line break: a long
    cumulative stream is mostly such bytes, and the scan was a tenth of the proxy's CPU at 8,192 tokens.
    Exactness does not rest on it: ``StreamAssembler`` refuses a line break in every part of an event it
    decodes (the rest of a cumulative event repeats bytes it decoded from earlier events)."""

    def __init__(self, source: StreamConnection | _PushedBytes | None = None) -> None:
        self.source = _PushedBytes() if source is None else source
        self.done = False
        self._scan = self._consumed = self.source.base

    @property
    def buf(self) -> bytearray:
        return self.source.buf

    def push(self, piece: bytes = b"") -> list[tuple[int, int]]:
        src = self.source
        if piece:
            src.buf += piece  # type: ignore[operator]  (only a _PushedBytes is pushed to)
        buf, base, end, spans = src.buf, src.base, src.end, []
        pos = max(self._consumed - base, src.lo)  # the source may drop superseded events unread
        scan = max(self._scan - base, pos)
        aligned = getattr(src, "aligned", None)
        while not self.done:
            if aligned:  # a large event alone in its HTTP chunk: its line ends at the chunk's end
                while aligned and aligned[0][0] < pos + base:
                    aligned.popleft()
                if aligned and aligned[0][0] == pos + base:
                    b = aligned[0][1] - base
                    if b > end:
                        break  # not all here yet: wait for the rest without scanning it
                    if buf.startswith(b"data: {", pos) and buf.endswith(b"}\n\n", pos, b):
                        aligned.popleft()
                        spans.append((pos + 6, b - 2))
                        pos = scan = b
                        continue
            nl = buf.find(b"\n", scan, end)
            if nl < 0:
                scan = end
                break
            stop = nl - 1 if nl > pos and buf[nl - 1] == 0x0D else nl
            if buf.startswith(b"data:", pos, stop):
                s = pos + 6 if buf.startswith(b"data: ", pos, stop) else pos + 5
                if stop - s == 6 and buf[s:stop] == b"[DONE]":
                    self.done = True
                else:
                    spans.append((s, stop))
            pos = scan = nl + 1
        self._consumed, self._scan = pos + base, scan + base
        return spans

    def consume(self) -> None:
        """Release the handled bytes (spans from earlier pushes are invalid afterwards)."""
        self.source.consumed(self._consumed)

    @property
    def pending(self) -> int:
        """Unhandled bytes in the buffer."""
        return self.source.end + self.source.base - self._consumed
