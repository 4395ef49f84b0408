"""Group commit: the writer commits everything queued at once in one transaction (one fsync), settles
each write only after that COMMIT, and, when the group fails, writes each alone so only the write that
fails is refused. The writer is held inside its ``on_written`` hook while the test queues the group."""

from __future__ import annotations

import json
import threading
from array import array
from concurrent.futures import Future

import pytest

from openclaw_rl.metrics import ProxyMetrics
from openclaw_rl.samples import TrainingSample
from openclaw_rl.scoring import Outcome
from openclaw_rl.spool import Spool
from openclaw_rl.turns import Turn
from openclaw_rl.writer import SampleWriter


def turn(index: int, session: str = "s") -> Turn:
    return Turn(session_key=session, session_id=session, index=index, prompt_ids=array("i", [1, 2, 3]),
                messages=None, tools=None, sampling_temperature=None, epoch="e")


def outcome(t: Turn) -> Outcome:
    return Outcome(samples=[TrainingSample(session_id=t.session_id, turn=t.index, kind="rl", prompt_ids=[1, 2],
                                           response_ids=[3, 4], rollout_log_probs=[-0.1, -0.2], loss_mask=[1, 1],
                                           reward=1.0)])


class Held:
    """A writer stopped inside its first write's ``on_written`` until ``release``: what is queued meanwhile
    forms one group."""

    def __init__(self, spool: Spool):
        self.held, self.go = threading.Event(), threading.Event()
        self.writer = SampleWriter(spool, ProxyMetrics(), on_written=self._hook)

    def _hook(self, samples: list[TrainingSample]) -> None:
        if samples[0].session_id == "boom":
            raise RuntimeError("a hook that fails (injected)")
        if not self.held.is_set():
            self.held.set()
            assert self.go.wait(60)  # a hang guard: the test releases it

    def hold(self) -> None:
        first = turn(0, "first")
        self.writer(first, outcome(first))
        assert self.held.wait(60)

    def release(self) -> None:
        self.go.set()
        self.writer.flush()


def commits_when_done(future: Future, spool: Spool, seen: dict[int, int], key: int) -> None:
    future.add_done_callback(lambda f: seen.__setitem__(key, spool.commits))


def test_writes_queued_together_share_one_commit_and_settle_after_it(tmp_path):
    spool = Spool(tmp_path, exclusive=True)
    held = Held(spool)
    held.hold()
    before = spool.commits
    seen: dict[int, int] = {}
    turns = [turn(i) for i in range(1, 9)]
    futures = [held.writer.save_turn(t) for t in turns]
    turns[0].next_state = {"role": "user", "content": "next"}
    futures.append(held.writer.save_next_state(turns[0]))  # the row saved earlier in the same transaction
    held.writer(turns[1], outcome(turns[1]))  # turn 2 is judged: its sample lands, its waiting row goes
    for i, f in enumerate(futures):
        assert not f.done()
        commits_when_done(f, spool, seen, i)
    held.release()

    assert all(f.result(10) is True for f in futures)
    assert spool.commits == before + 1, "ten queued writes took more than one transaction"
    assert set(seen.values()) == {before + 1}, "a future was resolved before the group's COMMIT"
    assert held.writer.metrics.spool_group_writes._value.get() == 10
    rows = [json.loads(p) for p in Spool(tmp_path).pending_turns()]
    assert [r["index"] for r in rows] == [1, 3, 4, 5, 6, 7, 8]
    assert rows[0]["next_state"] == {"role": "user", "content": "next"}
    assert sorted((s.session_id, s.turn) for s in Spool(tmp_path).iter_samples()) == [("first", 0), ("s", 2)]
    held.writer.close()
    spool.close()


def test_a_failing_write_fails_alone_and_the_rest_of_its_group_commits(tmp_path):
    spool = Spool(tmp_path, exclusive=True)
    real = spool.save_turn

    def save_turn(key, payload, *arrays):
        if key[2] == 3:
            raise OSError("disk I/O error (injected)")
        real(key, payload, *arrays)

    spool.save_turn = save_turn  # type: ignore[method-assign]
    held = Held(spool)
    held.hold()
    futures = {i: held.writer.save_turn(turn(i)) for i in range(1, 6)}
    held.release()

    with pytest.raises(OSError, match="injected"):
        futures[3].result(10)
    assert all(futures[i].result(10) is True for i in (1, 2, 4, 5))
    assert list(held.writer.unsaved) == [("s", "e", 3)]  # held and retried, as any failed write
    assert [json.loads(p)["index"] for p in Spool(tmp_path).pending_turns()] == [1, 2, 4, 5]
    assert held.writer.metrics.spool_group_commits._value.get() == 0
    held.writer.close()
    spool.close()


def test_a_failing_hook_after_the_commit_leaves_the_rest_of_the_group_settled(tmp_path):
    """Everything after the COMMIT (hooks, record lines) runs per write: one that raises is logged and
    counted, the writer thread lives on, and the group's other writes are settled."""
    spool = Spool(tmp_path, exclusive=True)
    held = Held(spool)
    held.hold()
    boom, after = turn(1, "boom"), turn(2)
    held.writer(boom, outcome(boom))
    future = held.writer.save_turn(after)
    held.release()
    assert future.result(10) is True
    assert held.writer.metrics.spool_group_commits._value.get() == 1
    assert held.writer.flush() is None and held.writer._thread.is_alive()
    held.writer.close()
    spool.close()


def test_the_stop_sentinel_met_while_gathering_a_group_still_stops_the_writer(tmp_path):
    """``close``'s stop (None) queued right behind a write is met while the writer gathers that write's group:
    it must still end the thread (it was kept as "no control item pending" and lost, so the thread ran on)."""
    held = Held(Spool(tmp_path, exclusive=True))
    held.hold()
    second = turn(1)
    held.writer(second, outcome(second))
    held.writer._queue.put(None)  # what close() puts after its flush, here right behind a write
    held.go.set()
    held.writer._thread.join(60)  # a hang detector, not a timing: a lost stop leaves the thread running
    assert not held.writer._thread.is_alive(), "the writer thread did not stop"
    assert held.writer.spool.depth() == 2
