"""Client of the policy's SGLang native ``/generate`` (token ids in, token ids + log-probs out).

Stage: serving → **backend** → SGLang. One pooled ``httpx.AsyncClient`` for the life of the proxy
(upstream built a new client, and loaded the TLS CA bundle, on every call). Every failure becomes a
typed error: unreachable or garbage → 502, slow → 504, SGLang's own 400 (e.g. context too long) → 400
with SGLang's message. Responses are validated: ids and log-prob triples must align, and their count
must be SGLang's ``completion_tokens``, or it is a 502 (never a silently truncated sample).

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
log it and to recommend the incremental mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import operator
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import httpx

from . import codec
from .capped import StreamBudget, read_capped, too_large
from .errors import (
    BackendResponseTooLarge,
    BackendTimeout,
    BackendUnavailable,
    BadRequest,
    ContextLengthExceeded,
    GenerationAborted,
)
from .rawstream import ResponseError, ResponseTooLarge, StreamClient, StreamConnection

log = logging.getLogger(__name__)

_IDS_KEY = b'"output_ids":['
_LOGPROBS_KEY = b'"output_token_logprobs":['
_SPLICE_MIN_BYTES = 2048  # below this a chunk is decoded whole: cutting it up costs more than it saves


@dataclass(slots=True)
class GenerateResult:
    """One /generate answer (final, or a cumulative streaming snapshot)."""

    text: str
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None  # None while streaming; "stop" | "length" | "abort" at the end
    prompt_tokens: int
    weight_version: str | None
    resumable: bool = False  # an "abort" without a status code: a pause (Slime's weight update), not an error
    top_logprobs: list[list[tuple[float, int]]] | None = None  # per output token, when top_logprobs_num was asked


def _check_error(data: Any) -> dict[str, Any]:
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict):
        raise BackendUnavailable("policy backend answered an unexpected JSON shape")
    if "error" in data:
        err = data["error"]
        message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        raise BadRequest(f"policy backend rejected the request: {message}")
    return data


def _finish_and_version(meta: dict[str, Any]) -> tuple[str | None, str | None, bool]:
    """(finish type, weight version, whether an abort is a pause's rather than an error)."""
    fr = meta.get("finish_reason")
    finish = fr.get("type") if isinstance(fr, dict) else fr
    version = meta.get("weight_version")
    segments = meta.get("weight_versions") or []
    if len(segments) > 1:  # the weights changed mid-generation: no single version produced it
        version = "mixed:" + ",".join(str(seg.get("version")) for seg in segments if isinstance(seg, dict))
    return finish, version, finish == "abort" and isinstance(fr, dict) and fr.get("status_code") is None


MAX_RESUMES = 3
"""Aborted-by-a-pause generations resumed per request; a fourth abort ends it as an error."""


def settle_abort(payload: dict[str, Any], done: GenerateResult, end_ids: frozenset[int]) -> GenerateResult:
    """What an abort really ended. SGLang runs an aborted request one more decode step before it ends it,
    so the output may already be complete: ending with an end-of-reply token (a "stop"), or filling the
    token budget (a "length"). Only an abort that cut the reply short is one to resume."""
    if done.finish_reason != "abort":
        return done
    if done.output_ids and done.output_ids[-1] in end_ids:
        return replace(done, finish_reason="stop", resumable=False)
    budget = (payload.get("sampling_params") or {}).get("max_new_tokens")
    if budget is not None and len(done.output_ids) >= budget:
        return replace(done, finish_reason="length", resumable=False)
    return done


def resumable(payload: dict[str, Any], done: GenerateResult) -> bool:
    """A pause's abort (no status code), in a request without stop strings: SGLang matches those in a
    request's own output only, so one that straddled the resume point would be missed."""
    return done.finish_reason == "abort" and done.resumable and not (payload.get("sampling_params") or {}).get("stop")


def continuation(payload: dict[str, Any], done: GenerateResult) -> dict[str, Any] | None:
    """The request that goes on from ``done``'s tokens: its ids appended to the prompt (ids, never text),
    the token budget reduced by as many; None when no budget is left."""
    params = payload.get("sampling_params") or {}
    budget = params.get("max_new_tokens")
    if budget is not None and budget - len(done.output_ids) <= 0:
        return None
    rest = {**params} if budget is None else {**params, "max_new_tokens": budget - len(done.output_ids)}
    return {**payload, "input_ids": [*payload["input_ids"], *done.output_ids], "sampling_params": rest}


def joined(done: GenerateResult, more: GenerateResult,
           decode: Callable[[list[int]], str] | None = None) -> GenerateResult:
    """One reply from a generation and its continuation; their versions ``mixed:`` when they differ.

    Each part's text is SGLang's decode of that part's ids alone, so a character whose bytes span the
    two parts shows as replacement characters in both; then the text is ``decode`` of all the ids
    (without a trailing replacement character while the reply still streams, as SGLang holds an
    incomplete character back)."""
    versions = [v for r in (done, more) if r.weight_version is not None
                for v in (r.weight_version.removeprefix("mixed:").split(",") if r.weight_version.startswith("mixed:")
                          else [r.weight_version])]
    distinct = list(dict.fromkeys(versions))
    version = distinct[0] if len(distinct) == 1 else ("mixed:" + ",".join(distinct) if distinct else None)
    ids = done.output_ids + more.output_ids
    text = done.text + more.text
    if decode is not None and (done.text.endswith("\ufffd") or more.text.startswith("\ufffd")):
        text = decode(ids)
        if more.finish_reason is None:
            text = text.rstrip("\ufffd")
    parts = [r.top_logprobs if r.top_logprobs is not None or r.output_ids else [] for r in (done, more)]
    tops = None if None in parts else parts[0] + parts[1]  # a part without tokens (aborted in the queue) has none
    return GenerateResult(text, ids, done.logprobs + more.logprobs, more.finish_reason, done.prompt_tokens, version,
                          more.resumable, tops)


def _unresumed(result: GenerateResult, resumes: int) -> GenerationAborted:
    why = (f", resumed {resumes} times" if resumes >= MAX_RESUMES else
           "; not resumed: the abort carries an error status" if not result.resumable else
           "; not resumed: a request with stop strings")
    return GenerationAborted(f"policy backend aborted the generation after {len(result.output_ids)} tokens{why}")


def _completion_tokens(meta: dict[str, Any]) -> int | None:
    n = meta.get("completion_tokens")
    return None if n is None else int(n)


_LOGPROB, _TOKEN = operator.itemgetter(0), operator.itemgetter(1)


def _aligned_logprobs(ids: list[int], triples: list[Any]) -> list[float]:
    """The log-probs of ``triples`` (``[logprob, id, text]``), which must score exactly ``ids``. Per token
    this runs in C (``map``): it is the one loop over every token of a streamed reply."""
    if len(triples) != len(ids) or list(map(int, map(_TOKEN, triples))) != ids:
        raise BackendUnavailable("policy backend log-probs do not match its output ids (return_logprob off?)")
    return list(map(float, map(_LOGPROB, triples)))


def _top_logprobs(ids: list[int], rows: Any) -> list[list[tuple[float, int]]] | None:
    """``output_top_logprobs`` (per output token, ``[[logprob, id, text], …]``) as (logprob, id) pairs."""
    if not rows:
        return None
    if len(rows) != len(ids):
        raise BackendUnavailable(f"policy backend sent top log-probs for {len(rows)} of {len(ids)} tokens")
    return [[(float(lp), int(t)) for lp, t, *_ in row] for row in rows]


def parse_generate(data: Any, *, final: bool) -> GenerateResult:
    """A whole (non-streamed) ``/generate`` object."""
    data = _check_error(data)
    try:
        meta = data["meta_info"]
        ids = [int(t) for t in data["output_ids"]]
        logprobs = _aligned_logprobs(ids, meta.get("output_token_logprobs") or [])
        finish, version, pause_abort = _finish_and_version(meta)
        if final and finish is None:
            raise BackendUnavailable("policy backend ended without a finish_reason")
        n = _completion_tokens(meta)
        if n is not None and n != len(ids):
            raise BackendUnavailable(f"policy backend reports {n} completion tokens but sent {len(ids)} ids")
        return GenerateResult(str(data.get("text") or ""), ids, logprobs, finish, int(meta.get("prompt_tokens", 0)),
                              version, pause_abort, _top_logprobs(ids, meta.get("output_top_logprobs")))
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise BackendUnavailable(f"policy backend answered malformed /generate output: {e!r}") from e


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


@contextlib.contextmanager
def _malformed_events() -> Iterator[None]:
    """A stream event that does not decode, or decodes to the wrong shape, is the backend's fault (502)."""
    try:
        yield
    except codec.DecodeError as e:
        raise BackendUnavailable(f"policy backend streamed non-JSON: {e}") from e
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise BackendUnavailable(f"policy backend streamed malformed /generate output: {e!r}") from e


def _refuse_line_breaks(*parts: bytes | bytearray) -> None:
    """A JSON event line holds no line break. ``SSEReader`` may hand over a large event without scanning
    it (see its doc), so every part that gets decoded is checked here instead."""
    if any(b"\n" in part for part in parts):
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
        with _malformed_events():
            spliced = None
            if end - start >= _SPLICE_MIN_BYTES:
                hinted = self.mode == "cumulative"
                spliced = _splice(buf, start, end, len(self._text_raw) if hinted else 0,
                                  self._ids_bytes if hinted else 0)
            raw = spliced.light if spliced else bytes(buf[start:end])
            _refuse_line_breaks(raw)
            return self._result(self._apply(codec.loads(raw), buf, spliced))

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
        if len(spans) == 1 or any(e - s >= _SPLICE_MIN_BYTES for s, e in spans):
            for start, end in spans:
                last = self.feed(buf, start, end)
            return last
        raw = b"[" + b",".join([buf[s:e] for s, e in spans]) + b"]"
        with _malformed_events():
            _refuse_line_breaks(raw)
            events = codec.loads(raw)
            if len(events) != len(spans):  # an event of two objects ('{…},{…}') is not JSON
                raise BackendUnavailable("policy backend streamed non-JSON: an event is not one object")
            for data in events:
                meta = self._apply(data, buf, None)
            return self._result(meta)

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


class PolicyBackend:
    def __init__(self, http: httpx.AsyncClient, url: str, *, timeout_s: float = 600.0, api_key: str = "",
                 connect_timeout_s: float = 10.0, stream_interval: int = 0, end_ids: frozenset[int] = frozenset(),
                 decode: Callable[[list[int], bool], str] | None = None, max_response_bytes: int = 0):
        self.http, self.url, self.timeout_s = http, url.rstrip("/"), timeout_s
        self.max_response_bytes = max_response_bytes
        """A whole answer, one stream event, or a stream's content beyond this is a 502 (0: no cap; capped.py)."""
        self.stream_interval = stream_interval
        """Tokens per event asked of SGLang on streamed calls (``sampling_params.stream_interval``); 0 sends
        nothing (the server's ``--stream-interval`` applies), and becomes 0 once the server refused the field."""
        self._unexplained_failures = 0  # in a row, each fixed by a retry without the field
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # calls to a plain-http SGLang go through rawstream (streams: 10x less CPU per byte than httpx)
        self.streams = StreamClient(self.url, connect_timeout_s=connect_timeout_s) \
            if self.url.startswith("http://") else None
        self.declared_mode: str | None = None
        """The server's ``incremental_streaming_output`` ("incremental" / "cumulative"), once read."""
        self.resumed = 0
        """Generations resumed after a pause's abort."""
        self.end_ids = end_ids
        """Ids that end a reply (EOS, end of turn): an aborted output ending with one is complete."""
        self.decode = decode
        """``(ids, skip_special_tokens) -> text`` as the server decodes: joins text across a resume."""
        self._probe: asyncio.Task | None = None

    def _raise_for(self, status: int, body: bytes) -> None:
        text = body.decode("utf-8", "replace")[:500]
        if status == 400:
            try:
                err = codec.loads(text)
                message = err.get("error", {}).get("message") or err.get("message") or text
            except (ValueError, AttributeError):
                message = text
            cls = ContextLengthExceeded if "context length" in str(message) else BadRequest
            raise cls(f"policy backend rejected the request: {message}",
                      param="messages" if cls is ContextLengthExceeded else None)
        raise BackendUnavailable(f"policy backend answered HTTP {status}: {text[:200]}")

    def _headers(self, routing_key: str | None) -> dict[str, str]:
        # A stable per-session key lets sglang-router (policy: consistent_hashing) keep a session on one
        # worker, so multi-turn prompts hit that worker's prefix cache. Slime's agent adapters do the same.
        base = {**self.headers, "Content-Type": "application/json"}
        return {**base, "X-SMG-Routing-Key": routing_key} if routing_key else base

    async def read_stream_mode(self) -> str | None:
        """The server's declared streaming mode from ``/get_server_info`` (None if it does not say)."""
        try:
            resp = await self.http.get(f"{self.url}/get_server_info", headers=self.headers, timeout=10.0)
            info = codec.loads(resp.content) if resp.status_code == 200 else {}
        except (httpx.HTTPError, *codec.DecodeError):
            return None
        flag = info.get("incremental_streaming_output") if isinstance(info, dict) else None
        if flag is None:
            return None
        self.declared_mode = "incremental" if flag else "cumulative"
        if not flag:
            log.warning("the policy SGLang streams cumulatively (every chunk repeats all ids and log-probs so far): "
                        "the proxy handles it, but start SGLang with --incremental-streaming-output (Slime: "
                        "--sglang-incremental-streaming-output) to cut the stream's bytes from O(n^2) to O(n)")
        return self.declared_mode

    async def generate(self, payload: dict[str, Any], routing_key: str | None = None) -> GenerateResult:
        """The whole reply. A generation aborted by a pause (Slime pauses SGLang in ``abort`` mode for each
        weight update) is resumed from its tokens: the reply the client gets is whole, and its sample's
        version ``mixed:`` when the weights changed in between."""
        decode = self._decoder(payload)
        result = settle_abort(payload, await self._generate_once(payload, routing_key), self.end_ids)
        resumes = 0
        while resumes < MAX_RESUMES and resumable(payload, result):
            nxt = continuation(payload, result)
            assert nxt is not None  # settle_abort made a full budget a "length"
            resumes += 1
            self._log_resume(result)
            result = settle_abort(payload, joined(result, await self._generate_once(nxt, routing_key), decode),
                                  self.end_ids)
        if result.finish_reason == "abort":
            raise _unresumed(result, resumes)
        return result

    def _decoder(self, payload: dict[str, Any]) -> Callable[[list[int]], str] | None:
        """Ids → text as SGLang decodes this request's output (its ``skip_special_tokens``)."""
        if self.decode is None:
            return None
        skip = bool((payload.get("sampling_params") or {}).get("skip_special_tokens", True))
        return lambda ids: self.decode(ids, skip)  # type: ignore[misc]

    def _log_resume(self, result: GenerateResult) -> None:
        self.resumed += 1
        log.info("the policy server aborted a generation after %d tokens (a pause for a weight update?): resuming "
                 "it from those tokens", len(result.output_ids))

    async def _generate_once(self, payload: dict[str, Any], routing_key: str | None = None) -> GenerateResult:
        # plain http: the raw client (a fraction of httpx's CPU per call)
        status, content = await post_whole(
            self.streams, self.http, self.url, "/generate", codec.dumps(payload), self._headers(routing_key),
            self.timeout_s, timeout_message=f"policy backend did not answer within {self.timeout_s}s",
            unreachable=f"policy backend at {self.url} is unreachable", max_bytes=self.max_response_bytes,
            what="policy backend /generate", setting=_CAP_SETTING)
        if status != 200:
            self._raise_for(status, content)
        try:
            data = codec.loads(content)
        except codec.DecodeError as e:
            raise BackendUnavailable("policy backend answered non-JSON") from e
        return parse_generate(data, final=True)

    async def generate_stream(self, payload: dict[str, Any], routing_key: str | None = None,
                              gather_s: float = 0.0) -> AsyncIterator[GenerateResult]:
        """``_stream_once``'s snapshots; a generation aborted by a pause goes on from its tokens (see
        ``generate``), its continuation's snapshots joined onto what came before."""
        decode = self._decoder(payload)
        done: GenerateResult | None = None
        request: dict[str, Any] | None = payload
        resumes = 0
        while True:
            last = None
            stream = self._stream_once(request, routing_key, gather_s)
            try:
                async for snap in stream:
                    last = snap
                    if snap.finish_reason == "abort":
                        break  # held back: it may be complete after all (settle_abort), or go on resumed
                    yield snap if done is None else joined(done, snap, decode)
            finally:
                await stream.aclose()
            assert last is not None  # _stream_once raises when it ends without a finish
            done = settle_abort(payload, last if done is None else joined(done, last, decode), self.end_ids)
            if done.finish_reason != "abort":
                if last.finish_reason == "abort":  # an abort that completed the reply: its last snapshot
                    yield done
                return
            if resumes >= MAX_RESUMES or not resumable(payload, done):
                raise _unresumed(done, resumes)
            request = continuation(payload, done)
            assert request is not None  # settle_abort made a full budget a "length"
            resumes += 1
            self._log_resume(done)

    async def _stream_once(self, payload: dict[str, Any], routing_key: str | None = None,
                           gather_s: float = 0.0) -> AsyncIterator[GenerateResult]:
        """Yield the growing result after each network read that completed events; the last has a finish_reason.

        The events of one read become one snapshot. With ``gather_s``, after a snapshot with text the
        next one waits until ``gather_s`` has passed or the response is complete, and takes everything
        that arrived meanwhile: one client write per interval instead of one per token, and from a
        cumulative stream only the last of those events is decoded. The end of a reply is never held."""
        if self._probe is None:  # once, in the background: never delays a request
            self._probe = asyncio.get_running_loop().create_task(self.read_stream_mode())
        last, suspicion = None, ""
        for interval in (self.stream_interval, 0) if self.stream_interval else (0,):
            results = self._stream_events(with_stream_interval(payload, interval), routing_key, gather_s)
            try:
                async for last in results:
                    if suspicion:  # the retry without the field works
                        self._retry_worked_without_interval(suspicion)
                        suspicion = ""
                    elif interval:
                        self._unexplained_failures = 0  # the field works here: a failure was something else
                    yield last
                break
            except (BadRequest, BackendUnavailable) as e:
                suspicion = _may_refuse_interval(e) if last is None and interval else ""
                if not suspicion:
                    raise
                log.info("streamed /generate with stream_interval %d failed before its first event (%s); retrying "
                         "once without the field", interval, e)
            finally:  # a client that hangs up closes the backend connection now (SGLang then aborts the request)
                await results.aclose()
        if last is None or last.finish_reason is None:
            raise BackendUnavailable("policy backend stream ended without a finish_reason")

    def _stream_events(self, payload: dict[str, Any], routing_key: str | None, gather_s: float
                       ) -> AsyncIterator[GenerateResult]:
        body = codec.dumps({**payload, "stream": True})
        return self._stream_raw(body, routing_key, gather_s) if self.streams else self._stream_httpx(body, routing_key)

    def _retry_worked_without_interval(self, suspicion: str) -> None:
        """A streamed call failed with the field and worked without it. An error naming the field settles
        it at once. A bare server error or broken stream (how an SGLang whose SamplingParams lacks the field
        fails) may also be a passing overload: only ``UNEXPLAINED_FAILURES_TO_DROP`` of those in a row, with
        no call that worked with the field between them, stop the proxy sending it."""
        if suspicion == "generic":
            self._unexplained_failures += 1
            if self._unexplained_failures < UNEXPLAINED_FAILURES_TO_DROP:
                return
        if self.stream_interval:
            log.warning("the policy SGLang refused sampling_params.stream_interval=%d (an SGLang older than "
                        "the per-request field): streamed turns from %s now get one event per token. Start SGLang "
                        "with --stream-interval N to have the server batch them", self.stream_interval, self.url)
            self.stream_interval = 0

    @staticmethod
    def _feed(reader: SSEReader, assembler: StreamAssembler, piece: bytes = b"",
              budget: StreamBudget | None = None) -> GenerateResult | None:
        """The events completed by one read, as one snapshot. Once the stream is known to be cumulative,
        only the read's last event is decoded: it repeats everything the earlier ones hold. Events over
        the size cap fail the stream before they are decoded."""
        spans = reader.push(piece)
        if budget is not None:
            budget.events(spans, assembler.mode == "cumulative")
        return assembler.feed_many(reader.buf, spans)

    async def _stream_raw(self, body: bytes, routing_key: str | None, gather_s: float = 0.0
                          ) -> AsyncIterator[GenerateResult]:
        assert self.streams is not None
        headers = {**self._headers(routing_key), "Accept": "text/event-stream"}
        try:
            conn = await self.streams.post("/generate", body, headers, self.timeout_s, sse=True,
                                           max_body=self.max_response_bytes)  # for an error's body
        except (TimeoutError, asyncio.TimeoutError) as e:
            raise BackendTimeout(f"policy backend did not answer within {self.timeout_s}s") from e
        except (OSError, ResponseError) as e:
            raise BackendUnavailable(f"policy backend at {self.url} is unreachable: {e!r}") from e
        try:
            if conn.status != 200:
                while not conn.finished:
                    await conn.wait(self.timeout_s)
                    conn.fresh = False
                if isinstance(conn.error, ResponseTooLarge):
                    raise too_large(f"policy backend (HTTP {conn.status})", f"an answer of more than "
                                    f"{self.max_response_bytes} bytes", self.max_response_bytes, _CAP_SETTING)
                self._raise_for(conn.status, conn.body)
            reader, assembler, budget = SSEReader(conn), StreamAssembler(), StreamBudget(self.max_response_bytes)
            while not reader.done:
                if not conn.fresh and not conn.finished:
                    await conn.wait(self.timeout_s)
                conn.fresh = False
                last = self._feed(reader, assembler, budget=budget)
                conn.superseded = assembler.mode == "cumulative"
                reader.consume()  # reading resumes here once a paused backlog is small again
                budget.unfinished(reader.pending)
                if last is not None:
                    yield last
                    if gather_s and last.text and not reader.done:
                        await conn.wait_finished(gather_s)
                if not reader.done and conn.finished and not conn.fresh:
                    if conn.error is not None or not conn.complete:
                        why = repr(conn.error) if conn.error is not None else "the connection closed mid-stream"
                        raise BackendUnavailable(f"policy backend stream failed: {why}")
                    break
            while reader.done and not conn.finished:  # the chunked terminator follows [DONE] at once;
                try:  # without it the connection is just not reused
                    await conn.wait(1.0)
                except (TimeoutError, asyncio.TimeoutError):
                    break
                conn.fresh = False
        except (TimeoutError, asyncio.TimeoutError) as e:
            raise BackendTimeout(f"policy backend stream stalled for {self.timeout_s}s") from e
        finally:
            self.streams.release(conn)

    async def _stream_httpx(self, body: bytes, routing_key: str | None) -> AsyncIterator[GenerateResult]:
        try:
            async with self.http.stream("POST", f"{self.url}/generate", content=body,
                                        headers=self._headers(routing_key), timeout=self.timeout_s) as resp:
                if resp.status_code != 200:
                    self._raise_for(resp.status_code, await read_capped(
                        resp, self.max_response_bytes, f"policy backend (HTTP {resp.status_code})", _CAP_SETTING))
                reader, assembler, budget = SSEReader(), StreamAssembler(), StreamBudget(self.max_response_bytes)
                async for piece in resp.aiter_bytes():
                    last = self._feed(reader, assembler, piece, budget)
                    reader.consume()
                    budget.unfinished(reader.pending)
                    if last is not None:
                        yield last
                    if reader.done:
                        break
        except httpx.TimeoutException as e:
            raise BackendTimeout(f"policy backend stream stalled for {self.timeout_s}s") from e
        except httpx.HTTPError as e:
            raise BackendUnavailable(f"policy backend stream failed: {e!r}") from e

    async def aclose(self) -> None:
        if self.streams is not None:
            self.streams.close()

_CAP_SETTING = "openclaw_proxy_max_response_bytes"


async def post_whole(raw: StreamClient | None, http: httpx.AsyncClient, base_url: str, path: str, body: bytes,
                     headers: dict[str, str], timeout_s: float, *, timeout_message: str,
                     unreachable: str, max_bytes: int = 0, what: str = "backend",
                     setting: str = "") -> tuple[int, bytes]:
    """One whole POST, (status, body): through the raw client when there is one (plain http), else httpx.
    A timeout raises ``BackendTimeout(timeout_message)``, a body over ``max_bytes`` (0: no cap; read no
    further than that) ``BackendResponseTooLarge`` naming ``what`` and its ``setting``, any other transport
    failure ``BackendUnavailable`` starting with ``unreachable``. Shared by the policy and the judge."""
    try:
        if raw is not None:
            return await raw.request(path, body, headers, timeout_s, max_body=max_bytes)
        async with http.stream("POST", base_url + path, content=body, headers=headers, timeout=timeout_s) as resp:
            return resp.status_code, await read_capped(resp, max_bytes, what, setting)
    except ResponseTooLarge as e:
        raise too_large(what, f"an answer of more than {max_bytes} bytes", max_bytes, setting) from e
    except BackendResponseTooLarge:  # read_capped's (a ConnectionError, so an OSError: not "unreachable")
        raise
    except (TimeoutError, asyncio.TimeoutError, httpx.TimeoutException) as e:
        raise BackendTimeout(timeout_message) from e
    except (OSError, ResponseError, httpx.HTTPError) as e:
        raise BackendUnavailable(f"{unreachable}: {e!r}") from e


# --- value range checks (kept apart from parsing) ------------------------------------------------------

def with_stream_interval(payload: dict[str, Any], interval: int) -> dict[str, Any]:
    """``payload`` asking SGLang for one stream event per ``interval`` tokens (0: unchanged). SGLang sends
    the first token at once, then an event whenever at least ``interval`` tokens are unsent, and the
    finish always; the events hold the same ids, log-probs and text, just fewer of them."""
    if not interval:
        return payload
    return {**payload, "sampling_params": {**(payload.get("sampling_params") or {}), "stream_interval": interval}}


UNEXPLAINED_FAILURES_TO_DROP = 3  # see PolicyBackend._retry_worked_without_interval


def _may_refuse_interval(error: Exception) -> str:
    """Whether a streamed call that failed before its first event may have failed on the
    ``stream_interval`` field: ``"named"`` for an error naming it (an SGLang whose SamplingParams lacks it
    raises ``unexpected keyword argument 'stream_interval'``), ``"generic"`` for a server error or broken
    stream, which is how such an SGLang's uncaught TypeError reaches the client, and ``""`` (not retried)
    for a 400 about anything else, an unreachable server or a timeout."""
    text = str(error)
    if isinstance(error, BackendResponseTooLarge):
        return ""
    if "stream_interval" in text or "unexpected keyword" in text:
        return "named"
    return "generic" if isinstance(error, BackendUnavailable) and "unreachable" not in text else ""


def check_output_values(result: GenerateResult, vocab_size: int) -> str | None:
    """Why a final /generate answer cannot be trained on (None if it can): every id inside the
    vocabulary (which also makes it fit a 32-bit token array), every log-prob a finite number ≤ 0."""
    ids, logprobs = result.output_ids, result.logprobs
    if ids and not (min(ids) >= 0 and max(ids) < vocab_size):  # in C; the loop below only names the culprit
        for i, t in enumerate(ids):
            if not 0 <= t < vocab_size:
                return f"output id {t} at position {i} is outside the vocabulary of {vocab_size}"
    if logprobs and not (all(map(math.isfinite, logprobs)) and max(logprobs) <= 0.0):
        for i, lp in enumerate(logprobs):
            if not (math.isfinite(lp) and lp <= 0.0):
                return f"log-prob {lp!r} at position {i} is not a finite number <= 0"
    return None


# --- reachability and context length (GET, cached by the caller) --------------------------------------

@dataclass(slots=True)
class BackendInfo:
    reachable: bool
    context_length: int | None  # tokens, when the server reports it
    error: str = ""


async def probe_backend(http: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None,
                        timeout_s: float = 3.0) -> BackendInfo:
    """One cheap probe: ``GET /v1/models`` (SGLang and the embedded engine report ``max_model_len``);
    else SGLang's ``/get_server_info`` (``context_length`` when it was set at launch). ``/health`` is not
    used: SGLang runs a real generation for it (about 1 s)."""
    url = url.rstrip("/")
    try:
        resp = await http.get(f"{url}/v1/models", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as e:
        return BackendInfo(False, None, f"{type(e).__name__}: {e}")
    context = None
    if resp.status_code == 200:
        context = _positive_int(_first(resp, "data", "max_model_len"))
    if context is None:
        try:
            info = await http.get(f"{url}/get_server_info", headers=headers, timeout=timeout_s)
            if info.status_code == 200:
                data = info.json()
                context = _positive_int(data.get("context_length")) if isinstance(data, dict) else None
        except (httpx.HTTPError, ValueError):
            pass
    if resp.status_code >= 500:
        return BackendInfo(False, context, f"HTTP {resp.status_code}")
    return BackendInfo(True, context)


def _first(resp: httpx.Response, key: str, field: str) -> Any:
    try:
        items = resp.json().get(key)
        return items[0].get(field) if isinstance(items, list) and items and isinstance(items[0], dict) else None
    except (ValueError, AttributeError):
        return None


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
