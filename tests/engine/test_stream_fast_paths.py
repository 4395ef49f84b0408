"""The streamed event path's shortcuts give what the long way gives: ``SSEReader.push`` skipping the lines
that are not data lines in one search, and ``StreamAssembler.feed_many`` taking a read's incremental events
as one batch (``_take_incremental``), with every error the event-by-event path raises."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from support import sse_events_buffer
from test_sse_in_place import compact, incremental, synthetic

from openclaw_rl.backend import SSEReader, StreamAssembler
from openclaw_rl.errors import BackendUnavailable, BadRequest
from openclaw_rl.rawstream import StreamConnection

_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _reference(stream: bytes) -> tuple[list[bytes], bool]:
    """The data payloads of an SSE byte stream and whether ``[DONE]`` came, line by line (complete lines only)."""
    out: list[bytes] = []
    for line in stream.split(b"\n")[:-1]:
        line = line[:-1] if line.endswith(b"\r") else line
        if line.startswith(b"data:"):
            payload = line[6:] if line.startswith(b"data: ") else line[5:]
            if payload == b"[DONE]":
                return out, True
            out.append(payload)
    return out, False


def _random_sse(rng: random.Random) -> bytes:
    """Events between comments, blank lines, other fields, CRLF endings, data lines without a space."""
    lines = []
    for _ in range(rng.randrange(1, 30)):
        kind = rng.random()
        if kind < 0.35:
            body = b'{"a":"%s"}' % rng.choice([b"x", b"da", b"data:", b"\\ndata: y", b""]) * rng.randrange(1, 4)
            lines.append(rng.choice([b"data: ", b"data:"]) + body)
        elif kind < 0.55:
            lines.append(b":" + b" " * rng.randrange(0, 6) + rng.choice([b"", b"data: no", b"ping"]))
        elif kind < 0.75:
            lines.append(b"")
        else:
            lines.append(rng.choice([b"event: x", b"id: 7", b"dat", b"data", b"retry: 5", b" data: z"]))
    if rng.random() < 0.7:
        lines += [b"data: [DONE]", b"", b"data: after"]
    return b"".join(line + rng.choice([b"\n", b"\n", b"\r\n"]) for line in lines)


def _pushed(stream: bytes, rng: random.Random) -> tuple[list[bytes], bool]:
    reader, got, i = SSEReader(), [], 0
    while i < len(stream):
        k = rng.randrange(1, 12)
        got += [bytes(reader.buf[s:e]) for s, e in reader.push(stream[i:i + k])]
        reader.consume()
        i += k
    return got, reader.done


def test_sse_reader_skips_non_data_lines_as_the_line_by_line_reading_does() -> None:
    rng = random.Random(5)
    for _ in range(1500):
        stream = _random_sse(rng)
        assert _pushed(stream, rng) == _reference(stream), stream


def test_sse_reader_over_a_connection_skips_the_blanked_framing() -> None:
    """Through ``StreamConnection`` (framing blanked in place into comment lines), at random read sizes."""
    rng = random.Random(9)
    for _ in range(400):
        stream = _random_sse(rng)
        cut, parts = 0, []
        while cut < len(stream):
            k = rng.randrange(1, 40)
            parts.append(stream[cut:cut + k])
            cut += k
        raw = _HEAD + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
        conn = StreamConnection()
        conn.sse = True
        reader, got, i = SSEReader(conn), [], 0
        while i < len(raw):
            k = rng.randrange(1, 60)
            view = conn.get_buffer(-1)
            n = min(k, len(raw) - i, len(view))
            view[:n] = raw[i:i + n]
            conn.buffer_updated(n)
            got += [bytes(conn.buf[s:e]) for s, e in reader.push()]
            reader.consume()
            i += n
        assert (got, reader.done) == _reference(stream), stream


def _state(asm: StreamAssembler, result: Any) -> tuple[Any, ...]:
    return (result.output_ids, result.logprobs, result.text, result.finish_reason, result.prompt_tokens,
            result.weight_version, asm.chunks, asm.mode)


def test_incremental_batches_equal_event_by_event() -> None:
    """Any cut of an incremental stream into reads gives the ids, log-probs (floats, bit for bit), text and
    finish of feeding it one event at a time, text with escapes, surrogate pairs and non-ASCII included."""
    rng = random.Random(3)
    for n in (3, 17, 40):
        chunks = incremental(synthetic(n, rng))
        buf, spans = sse_events_buffer([compact(c) for c in chunks])
        one = StreamAssembler()
        for s, e in spans:
            single = one.feed(buf, s, e)
        for _ in range(20):
            many, i, last = StreamAssembler(), 0, None
            while i < len(spans):
                k = rng.randrange(1, 6)
                last = many.feed_many(buf, spans[i:i + k]) or last
                i += k
            assert _state(many, last) == _state(one, single)


def _broken(chunks: list[dict[str, Any]], k: int, how: str) -> list[dict[str, Any]]:
    chunks = json.loads(json.dumps(chunks))
    meta = chunks[k]["meta_info"]
    if how == "error":
        chunks[k] = {"error": {"message": "boom"}}
    elif how == "lost":
        meta["completion_tokens"] += 1
    elif how == "declared":
        meta["output_token_logprobs_length"] += 2
    elif how == "triples":
        meta["output_token_logprobs"] = meta["output_token_logprobs"][1:]
    elif how == "token":
        meta["output_token_logprobs"][0][1] += 1
    elif how == "float_count":  # not the plain case: taken event by event, where int() accepts it
        meta["completion_tokens"] = float(meta["completion_tokens"])
    elif how == "no_text":
        del chunks[k]["text"]
    elif how == "wrapped":  # a one-element list around the event: _check_error unwraps it
        chunks[k] = [chunks[k]]
    return chunks


@pytest.mark.parametrize("how", ["error", "lost", "declared", "triples", "token", "float_count", "no_text",
                                 "wrapped"])
def test_an_odd_event_in_a_batch_gets_what_event_by_event_gives(how: str) -> None:
    """An event the batch does not take plainly (an error, a count that does not add up, a triple for
    another id, a float count, no text, a wrapped event) gives the event-by-event path's result or error."""
    chunks = _broken(incremental(synthetic(12, random.Random(4))), 5, how)
    buf, spans = sse_events_buffer([compact(c) for c in chunks])

    def run(batched: bool) -> Any:
        asm = StreamAssembler()
        try:
            asm.feed_many(buf, spans[:2])  # the mode is learnt from the first two
            if batched:
                result = asm.feed_many(buf, spans[2:8])
            else:
                for s, e in spans[2:8]:
                    result = asm.feed(buf, s, e)
            return _state(asm, result)
        except (BackendUnavailable, BadRequest) as e:
            return type(e), str(e)

    assert run(True) == run(False)
    if how in ("float_count", "no_text", "wrapped"):
        assert isinstance(run(True)[0], list)  # taken, not refused
    else:
        assert isinstance(run(True)[0], type)  # refused
