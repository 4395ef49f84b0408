"""The raw client reads an SGLang event stream in place: the chunked framing is overwritten, never cut
out by moving the payload, and whatever the byte boundaries of reads and HTTP chunks, the assembled
ids, log-probs and text equal a full parse of the final chunk (golden SGLang chunks and synthetic ones,
cumulative and incremental)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from openclaw_rl.backend import PolicyBackend, SSEReader, StreamAssembler
from openclaw_rl.rawstream import StreamConnection

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "sglang-golden" / "exchanges.jsonl"
# every split point in the full suite; by default every 7th, and all of the head and the first framing
FULL = os.environ.get("OPENCLAW_TEST_FULL") == "1"
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def compact(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def golden_streams() -> list[list[dict[str, Any]]]:
    out = []
    for line in GOLDEN.read_text().splitlines():
        e = json.loads(line)
        if e.get("sse_lines") and e["path"] == "/generate" and (e["request_json"] or {}).get("return_logprob"):
            chunks = [json.loads(s[6:]) for s in e["sse_lines"] if s.startswith("data: {")]
            if chunks and "error" not in chunks[0]:
                out.append(chunks)
    return out


def incremental(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What --incremental-streaming-output sends for the same tokens (SGLang slices the same way)."""
    out, prev_ids, prev_text = [], 0, ""
    for c in chunks:
        d = json.loads(json.dumps(c))
        d["output_ids"] = c["output_ids"][prev_ids:]
        d["meta_info"]["output_token_logprobs"] = c["meta_info"]["output_token_logprobs"][prev_ids:]
        if "text" in c:
            d["text"], prev_text = c["text"][len(prev_text):], c["text"]
        prev_ids = len(c["output_ids"])
        out.append(d)
    return out


def synthetic(n: int, rng: random.Random) -> list[dict[str, Any]]:
    """A cumulative SGLang-shaped stream of ``n`` tokens: escapes, non-ASCII text, large chunks."""
    words = ["caf\u00e9 ", "\U0001f642", " \"q\"", "\\n", "\n", "ok ", "\u2028", "x" * 40]
    ids, triples, text, chunks = [], [], "", []
    for k in range(1, n + 1):
        tok = rng.randrange(100, 150000)
        ids.append(tok)
        triples.append([-rng.random() * 5, tok, None])
        text += rng.choice(words)
        chunks.append({"text": text, "output_ids": list(ids), "meta_info": {
            "id": "r1", "finish_reason": {"type": "length", "length": n} if k == n else None, "prompt_tokens": 7,
            "weight_version": "default", "num_retractions": 0, "output_token_logprobs": [list(t) for t in triples],
            "output_token_logprobs_length": k, "reasoning_tokens": 0, "completion_tokens": k,
            "cached_tokens": 0, "cached_tokens_details": None, "dp_rank": None}})
    return chunks


def wire(events: list[bytes], rng: random.Random | None = None) -> bytes:
    """The HTTP response: one chunk per event (as uvicorn writes SGLang's), or, with ``rng``, the SSE
    bytes cut into chunks at random places (a size line with an extension now and then)."""
    sse = [b"data: " + e + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]
    if rng is None:
        parts = sse
    else:
        flat, parts, i = b"".join(sse), [], 0
        while i < len(flat):
            k = rng.randrange(1, 400)
            parts.append(flat[i:i + k])
            i += k
    framed = b"".join((b"%x;ext=1\r\n" if rng and rng.random() < 0.2 else b"%x\r\n") % len(p) + p + b"\r\n"
                      for p in parts)
    return HEAD + framed + b"0\r\n\r\n"


def read_through(raw: bytes, cuts: list[int]) -> tuple[StreamConnection, Any]:
    """Deliver ``raw`` to a connection in reads ending at ``cuts``; feed the proxy's reader after each."""
    conn, asm, last = StreamConnection(), StreamAssembler(), None
    conn.sse = True
    reader = SSEReader(conn)
    prev = 0
    for cut in [*cuts, len(raw)]:
        while prev < cut:
            view = conn.get_buffer(-1)
            k = min(len(view), cut - prev)
            view[:k] = raw[prev:prev + k]
            view.release()
            conn.buffer_updated(k)
            prev += k
        result = PolicyBackend._feed(reader, asm)
        conn.superseded = asm.mode == "cumulative"  # as PolicyBackend._stream_raw does
        reader.consume()
        last = result or last
    assert conn.error is None and conn.complete and reader.done and reader.pending >= 0
    return conn, last


def expect(chunks: list[dict[str, Any]], result: Any) -> None:
    final = chunks[-1]
    assert result.output_ids == final["output_ids"]
    assert result.logprobs == [t[0] for t in final["meta_info"]["output_token_logprobs"]]
    assert result.text == final.get("text", "")


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
def test_golden_streams_split_at_every_byte(mode: str) -> None:
    streams = golden_streams()
    assert streams
    for chunks in streams:
        events = [compact(c) for c in (chunks if mode == "cumulative" else incremental(chunks))]
        raw = wire(events)
        cuts = range(1, len(raw)) if FULL else sorted({*range(1, len(HEAD) + 16), *range(1, len(raw), 7)})
        for cut in cuts:  # two reads, split at every byte
            conn, result = read_through(raw, [cut])
            expect(chunks, result)
            assert conn.moved == 0  # chunks hold whole events: the framing is overwritten in place
        for seed in range(5):  # events cut across chunks at random: framing mid-line is cut out
            rng = random.Random(seed)
            raw = wire(events, rng)
            cuts = sorted(rng.sample(range(1, len(raw)), 20))
            _, result = read_through(raw, cuts)
            expect(chunks, result)


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
@pytest.mark.parametrize("seed", range(4))
def test_long_synthetic_streams_equal_a_full_parse(mode: str, seed: int) -> None:
    rng = random.Random(seed)
    chunks = synthetic(300, rng)
    events = [compact(c) for c in (chunks if mode == "cumulative" else incremental(chunks))]
    for chunked in (None, rng):
        raw = wire(events, chunked)
        cuts = sorted(rng.sample(range(1, len(raw)), min(len(raw) - 1, 400)))
        conn, result = read_through(raw, cuts)
        expect(chunks, result)
        assert (conn.moved == 0) == (chunked is None)
        if mode == "cumulative":  # ~2.6 MB through a 256 KB buffer: compacted, and the offsets survived it
            assert conn.base > len(conn.buf)


def test_a_gathering_reader_of_a_cumulative_stream_gets_the_last_event() -> None:
    """Reads pile up while the reader gathers (no push for a while): the connection drops the events
    before the last complete one unread when it needs room, and the result is still the full parse."""
    chunks = synthetic(400, random.Random(3))
    raw = wire([compact(c) for c in chunks])
    conn, result = read_through(raw, list(range(100_000, len(raw), 700_000)))
    expect(chunks, result)
    assert conn.dropped > len(raw) // 2 and conn.moved == 0


@pytest.mark.parametrize("where", ["light", "new ids", "new text"])
def test_a_line_break_inside_a_large_event_fails_the_stream(where: str) -> None:
    """A large event alone in its chunk is taken without scanning it for line breaks; one inside the
    parts the assembler decodes must still fail the stream, as a line-by-line reader's broken JSON would."""
    from openclaw_rl.errors import BackendUnavailable

    chunks = synthetic(120, random.Random(7))
    events = [compact(c) for c in chunks]
    bad = events[-1]  # the final event: decoded whatever the reads (earlier ones may be superseded unread)
    if where == "light":
        bad = bad.replace(b',"prompt_tokens"', b',\n"prompt_tokens"')
    elif where == "new ids":
        last = b",%d]" % chunks[-1]["output_ids"][-1]
        bad = bad.replace(last, b",\n" + last[1:])
    else:
        bad = bad.replace(b'","output_ids"', b'\n","output_ids"')
    assert bad != events[-1] and len(bad) > 2048
    with pytest.raises(BackendUnavailable):
        read_through(wire([*events[:-1], bad]), [])


def test_room_made_after_the_last_event_keeps_it() -> None:
    """The buffer may need room after the final event and ``[DONE]`` have arrived and before the reader
    looks: the final event (with the finish reason) must survive, not the ``[DONE]`` after it."""
    chunks = synthetic(60, random.Random(5))
    raw = wire([compact(c) for c in chunks])
    conn, asm = StreamConnection(), StreamAssembler()
    conn.sse = True
    reader = SSEReader(conn)
    for piece in (raw[:len(raw) // 3], raw[len(raw) // 3:-5]):  # all but the chunked terminator
        while piece:
            view = conn.get_buffer(-1)
            k = min(len(view), len(piece))
            view[:k] = piece[:k]
            view.release()
            conn.buffer_updated(k)
            piece = piece[k:]
        if asm.mode is None:
            PolicyBackend._feed(reader, asm)
            PolicyBackend._feed(reader, asm)
            reader.consume()
            conn.superseded = asm.mode == "cumulative"
    assert conn.superseded
    conn._make_room()  # what get_buffer does when the buffer is full
    assert conn.dropped
    result = PolicyBackend._feed(reader, asm)
    assert reader.done and result is not None and result.finish_reason == "length"
    expect(chunks, result)


def test_a_batch_of_incremental_events_is_checked_event_by_event() -> None:
    """``feed_many`` decodes a read's incremental events in one call: the result equals feeding them one
    by one, and a data line holding two objects, or one event losing a token, still fails."""
    from openclaw_rl.errors import BackendUnavailable

    chunks = incremental(synthetic(40, random.Random(11)))
    events = [compact(c) for c in chunks]
    buf = bytearray()
    spans = []
    for e in events:
        buf += b"data: "
        spans.append((len(buf), len(buf) + len(e)))
        buf += e + b"\n\n"
    one = StreamAssembler()
    for s, e in spans:
        single = one.feed(buf, s, e)
    many = StreamAssembler()
    many.feed_many(buf, spans[:2])  # the mode is learnt from the first two
    batched = many.feed_many(buf, spans[2:])
    assert (batched.output_ids, batched.logprobs, batched.text) == (single.output_ids, single.logprobs, single.text)
    assert batched.finish_reason == "length" and many.chunks == one.chunks == len(events)
    asm = StreamAssembler()
    asm.feed_many(buf, spans[:2])
    merged = bytes(buf[spans[2][0]:spans[2][1]]) + b"," + bytes(buf[spans[3][0]:spans[3][1]])
    line = b"data: " + merged + b"\n\n"
    shifted = [(a + len(line), b + len(line)) for a, b in spans[4:6]]
    with pytest.raises(BackendUnavailable, match="not one object"):  # '{…},{…}' in one event
        asm.feed_many(bytearray(line) + buf, [(6, 6 + len(merged)), *shifted])
    lossy = StreamAssembler()
    lossy.feed_many(buf, spans[:2])
    with pytest.raises(BackendUnavailable, match="lost tokens"):
        lossy.feed_many(buf, spans[2:5] + spans[6:9])
