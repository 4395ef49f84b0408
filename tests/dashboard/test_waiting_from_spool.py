"""dashboard.data.waiting_from_spool: a stopped run's waiting turns read from the spool (read-only), the next
state saved apart from its turn's record (``Spool.save_next_state``) included."""

from __future__ import annotations

import json
from array import array

from openclaw_rl import codec
from openclaw_rl.dashboard.data import waiting_from_spool
from openclaw_rl.spool import Spool
from openclaw_rl.turns import Generation, Turn


def test_a_next_state_saved_apart_is_shown_with_its_turn(tmp_path):
    turn = Turn(session_key="u\x1fs", session_id="s", index=1, prompt_ids=array("i", [1, 2]), messages=None,
                tools=None, sampling_temperature=1.0, epoch="e")
    turn.generation = Generation(array("i", [3]), array("d", [-0.5]), "hello", "stop")
    other = Turn(session_key="u\x1fs", session_id="s", index=2, prompt_ids=array("i", [1]), messages=None,
                 tools=None, sampling_temperature=1.0, epoch="e")
    spool = Spool(tmp_path)
    for t in (turn, other):
        spool.save_turn(("u\x1fs", "e", t.index), codec.dumps_str(t.to_record(arrays=False)), t.array_bytes())
    assert spool.save_next_state(("u\x1fs", "e", 1), json.dumps({"role": "user", "content": "thanks"}))
    spool.close()
    rows = {r["index"]: r for r in waiting_from_spool(tmp_path)}
    assert rows[1]["response_text"] == "hello"
    assert rows[1]["next_state"] == {"role": "user", "content": "thanks"}
    assert rows[2]["next_state"] is None and rows[2]["response_text"] is None


def test_a_spool_that_is_not_there_lists_nothing(tmp_path):
    """No file (never made, deleted, or moved between a check and the open): no rows, never an error."""
    assert waiting_from_spool(tmp_path / "gone") == []
    assert waiting_from_spool(tmp_path) == []


def test_the_live_waiting_turns_are_cut_to_what_a_key_may_see():
    """``waiting_from_tracker(tracker, ns)``: the rows a ``serve --workers`` owner sends a worker's dashboard are
    only those of the asking key's namespace (and its users'), not every namespace's replies."""
    from types import SimpleNamespace

    from openclaw_rl.dashboard.data import waiting_from_tracker

    def turn(key: str, index: int) -> SimpleNamespace:
        return SimpleNamespace(session_key=key, session_id=key.rpartition("\x1f")[2], index=index, epoch="e",
                               created=1.0, generation=None, next_state=None)

    turns = [turn("a\x1fs1", 1), turn("a/u1\x1fs2", 1), turn("b\x1fs3", 1), turn("s4", 1)]
    tracker = SimpleNamespace(sessions={t.session_key: SimpleNamespace(turns={1: t}) for t in turns})
    keys = lambda ns: sorted(r["session_key"] for r in waiting_from_tracker(tracker, ns))  # noqa: E731
    assert keys(None) == sorted(t.session_key for t in turns)
    assert keys("a") == sorted(["a\x1fs1", "a/u1\x1fs2"])
    assert keys("b") == ["b\x1fs3"]
    assert keys("c") == []
