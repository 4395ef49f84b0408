"""``ids.UniqueIds``: completion ids and session epochs in ``uuid4().hex``'s shape, seeded per owner from
``os.urandom`` and again in a forked child, so two owners (or a parent and its child) never share a stream."""

from __future__ import annotations

import os
import re

from openclaw_rl.ids import UniqueIds


def test_ids_have_uuid4_hex_shape_and_do_not_repeat():
    ids = UniqueIds()
    made = [ids.hex() for _ in range(20_000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in made)
    assert len(set(made)) == len(made)
    assert re.fullmatch(r"[0-9a-f]{12}", ids.hex(12))


def test_two_owners_draw_different_streams():
    a, b = UniqueIds(), UniqueIds()
    assert {a.hex() for _ in range(100)}.isdisjoint(b.hex() for _ in range(100))


def test_a_forked_child_does_not_repeat_its_parents_ids():
    ids = UniqueIds()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, then out without running pytest's teardown
        os.close(read)
        os.write(write, " ".join(ids.hex() for _ in range(8)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split()
    os.waitpid(pid, 0)
    parent = [ids.hex() for _ in range(8)]
    assert len(child) == 8 and set(child).isdisjoint(parent)


def test_tool_call_ids_keep_openais_shape_and_differ_per_call_and_per_parser():
    from openclaw_rl.parsers import OutputParser

    text = "".join(f'<tool_call>\n{{"name": "f", "arguments": {{"i": {i}}}}}\n</tool_call>' for i in range(50))
    one, two = OutputParser.named("qwen3", "qwen25"), OutputParser.named("qwen3", "qwen25")
    calls = one.parse(text).tool_calls + one.parse(text).tool_calls
    other = two.parse(text).tool_calls
    assert len(calls) == 100 and all(re.fullmatch(r"call_[0-9a-f]{24}", c["id"]) for c in calls + other)
    assert len({c["id"] for c in calls + other}) == 150
