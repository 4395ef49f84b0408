"""``StreamAssembler``'s refusals of a malformed event, pinned, and its per-read path free of ``contextlib``.

The mapping of a bad event to a 502 (``BackendUnavailable``) was a ``contextlib.contextmanager`` entered once
per read on the event loop: a generator and four Python calls, ~12 µs per streamed event in place (perf
with Python 3.12's trampolines, docs/performance.md, sixth pass). It is a ``try``/``except`` now; these
tests pin the messages, the cause and the types it gives, and that a read's events are taken without
entering ``contextlib`` or a generator expression.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import pytest
from support import sse_events_buffer
from test_sse_in_place import compact, incremental, synthetic

from openclaw_rl.errors import BackendUnavailable
from openclaw_rl.sglang_stream import StreamAssembler, _refuse_line_breaks


def _chunks(n: int = 12) -> list[dict[str, Any]]:
    return incremental(synthetic(n, random.Random(8)))


def _refusal(events: list[bytes], batched: bool) -> BackendUnavailable:
    buf, spans = sse_events_buffer(events)
    asm = StreamAssembler()
    with pytest.raises(BackendUnavailable) as info:
        asm.feed_many(buf, spans[:2])  # the mode is learnt from the first two
        if batched:
            asm.feed_many(buf, spans[2:])
        else:
            for s, e in spans[2:]:
                asm.feed(buf, s, e)
    return info.value


@pytest.mark.parametrize("batched", [True, False])
def test_non_json_is_a_502_naming_the_decode_error(batched: bool) -> None:
    events = [compact(c) for c in _chunks()[:4]] + [b'{"text": "x", oops}']
    error = _refusal(events, batched)
    assert str(error).startswith("policy backend streamed non-JSON: ")
    assert isinstance(error.__cause__, ValueError) and type(error.__cause__).__name__ == "JSONDecodeError"


@pytest.mark.parametrize("batched", [True, False])
def test_a_missing_field_is_a_502_naming_the_key(batched: bool) -> None:
    chunks = _chunks()[:5]
    del chunks[3]["meta_info"]
    error = _refusal([compact(c) for c in chunks], batched)
    assert str(error) == "policy backend streamed malformed /generate output: KeyError('meta_info')"
    assert isinstance(error.__cause__, KeyError)


@pytest.mark.parametrize("batched", [True, False])
def test_a_value_error_reads_as_non_json_as_before(batched: bool) -> None:
    """``codec.DecodeError`` includes ``ValueError``: an id that is not a number is reported as non-JSON."""
    chunks = _chunks()[:5]
    chunks[3]["output_ids"][0] = "seven"
    error = _refusal([compact(c) for c in chunks], batched)
    assert str(error).startswith("policy backend streamed non-JSON: invalid literal for int()")
    assert type(error.__cause__) is ValueError


def test_two_objects_in_one_event_and_a_line_break_keep_their_own_messages() -> None:
    good = [compact(c) for c in _chunks()[:4]]
    two = _refusal(good + [good[3] + b"," + good[3]], batched=True)
    assert str(two) == "policy backend streamed non-JSON: an event is not one object"
    assert two.__cause__ is None
    buf, spans = sse_events_buffer(good)
    s, e = spans[3]
    buf[s + 2:s + 3] = b"\n"
    asm = StreamAssembler()
    asm.feed_many(buf, spans[:2])
    with pytest.raises(BackendUnavailable, match="a line break inside an event"):
        asm.feed_many(buf, spans[2:])


def test_a_read_of_events_enters_no_contextlib_and_no_generator_expression() -> None:
    """The per-read path on the event loop: no ``contextmanager`` and no ``any(<genexpr>)`` per read."""
    chunks = _chunks(40)
    buf, spans = sse_events_buffer([compact(c) for c in chunks])
    asm = StreamAssembler()
    asm.feed_many(buf, spans[:2])
    called: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            called.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        for i in range(2, 35, 3):
            asm.feed_many(buf, spans[i:i + 3])  # several events a read, as the gathering reader hands them
        asm.feed_many(buf, spans[35:36])  # one event a read (feed)
        asm.feed_many(buf, spans[36:])
    finally:
        sys.setprofile(None)
    assert called, "the profile saw no calls"
    assert any(c.endswith("sglang_stream.py:_apply") for c in called)
    assert not [c for c in called if "contextlib.py" in c]
    assert not [c for c in called if "sglang_stream.py" in c and "<genexpr>" in c]


def test_the_line_break_check_refuses_exactly_the_parts_with_a_newline() -> None:
    rng = random.Random(11)
    for _ in range(2000):
        parts = [bytes(rng.choice(b'{}[],:"ab\\n\r\n 0') for _ in range(rng.randrange(0, 12)))
                 for _ in range(rng.randrange(1, 4))]
        parts = [bytearray(p) if rng.random() < 0.5 else p for p in parts]
        try:
            _refuse_line_breaks(*parts)
            refused = False
        except BackendUnavailable as e:
            assert str(e) == "policy backend streamed a line break inside an event"
            refused = True
        assert refused == any(b"\n" in p for p in parts), parts


def test_the_line_break_check_asks_for_the_byte_by_its_value() -> None:
    """``bytes in bytes`` first tries the operand as an integer, building and clearing a ``TypeError`` with a
    formatted message (~0.2-0.5 µs warm, several in place): the check asks with the byte's value."""
    operands: list[type] = []

    class Probe(bytes):
        def __contains__(self, item: object) -> bool:
            operands.append(type(item))
            return super().__contains__(item)  # type: ignore[operator]

    _refuse_line_breaks(Probe(b'{"a":1}'), Probe(b"[1,2]"))
    assert operands == [int, int]
