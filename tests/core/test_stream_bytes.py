"""The streamed reply's bytes: pre-built chunk templates equal the generic serialisation exactly."""

from __future__ import annotations

import pytest

from openclaw_rl import codec
from openclaw_rl.protocol import completion_chunk
from openclaw_rl.serving import ChunkBytes, sse

DELTAS = [{"role": "assistant", "content": ""}, {"content": "caf\u00e9 \U0001f642 \"quoted\"\n\\"},
          {"reasoning_content": "think\u2028"}, {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                             "function": {"name": "f", "arguments": "{\"a\":1}"}}]}]


@pytest.mark.parametrize("json_only", [False, True], ids=["orjson", "json"])
def test_chunk_templates_equal_the_generic_chunks(monkeypatch: pytest.MonkeyPatch, json_only: bool) -> None:
    if json_only:
        monkeypatch.setattr(codec, "orjson", None)
    out = ChunkBytes("chatcmpl-1", "m\u00f6del \"x\"", 123)
    mk = dict(completion_id="chatcmpl-1", model="m\u00f6del \"x\"", created=123)
    assert out.deltas(DELTAS) == b"".join(sse(completion_chunk(**mk, delta=d)) for d in DELTAS)
    assert out.role() == sse(completion_chunk(**mk, delta=DELTAS[0]))
    assert out.deltas([]) == b""


def test_stored_json_text_round_trips_what_orjson_refuses() -> None:
    """``codec.dumps_str`` (turn records in the spool): orjson's compact text, or ASCII-escaped ``json``
    where orjson refuses (a lone surrogate), so the text always binds to SQLite and reads back the same."""
    import json
    import sqlite3

    from openclaw_rl import codec

    for value in ({"text": "caf\u00e9 🙂", "ids": "AAEC", "t": 0.7}, {"text": "lone \ud800 surrogate", "n": None}):
        text = codec.dumps_str(value)
        db = sqlite3.connect(":memory:")
        db.execute("CREATE TABLE t (payload TEXT)")
        db.execute("INSERT INTO t VALUES (?)", (text,))
        assert json.loads(db.execute("SELECT payload FROM t").fetchone()[0]) == value
