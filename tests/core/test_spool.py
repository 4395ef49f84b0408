"""The durable spool: ordered delivery, leases, acknowledgement, crash re-delivery, disk cap."""

from __future__ import annotations

import threading

import pytest
import spool_schemas

from openclaw_rl.samples import TrainingSample
from openclaw_rl.spool import Spool, SpoolCorrupt, SpoolFull


def sample(turn: int, session="s") -> TrainingSample:
    return TrainingSample(session_id=session, turn=turn, kind="rl", prompt_ids=[1, 2], response_ids=[3, 4],
                          rollout_log_probs=[-0.1, -0.2], loss_mask=[1, 1], reward=1.0)


def test_lease_ack_and_leftovers_stay(tmp_path):
    spool = Spool(tmp_path)
    spool.put([sample(i) for i in range(5)])
    batch, got = spool.lease(3)
    assert [s.turn for s in got] == [0, 1, 2] and [s.index for s in got] == sorted(s.index for s in got)
    assert spool.ready_count() == 2 and spool.depth() == 5
    assert spool.ack(batch) == 3
    assert spool.depth() == 2  # leftovers are kept for the next batch, never discarded (upstream bug 4)


def test_unacknowledged_batch_is_redelivered_first_after_restart(tmp_path):
    spool = Spool(tmp_path)
    spool.put([sample(i) for i in range(4)])
    _, first = spool.lease(2)
    spool.close()
    reopened = Spool(tmp_path)  # the process died before the trainer got the batch
    assert reopened.release_leases() == 2
    _, again = reopened.lease(2)
    assert [s.sample_id for s in again] == [s.sample_id for s in first]


class _InterruptAfter:
    """A connection whose `execute` of one statement runs it and then raises KeyboardInterrupt, as a
    Ctrl-C landing just as that call returns does."""

    def __init__(self, db, statement: str):
        self._db, self._statement = db, statement

    def execute(self, sql, *args):
        if sql.startswith(self._statement):
            self._db.execute(sql, *args)
            raise KeyboardInterrupt
        return self._db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)


@pytest.mark.parametrize(("statement", "left"), [
    ("BEGIN", 3),  # an interrupt just after BEGIN must not leave the transaction open
    ("UPDATE spool_stats", 3),  # inside the ack: rolled back, the batch still leased
    # CI caught this one: Ctrl-C right after SQLite's COMMIT made the ROLLBACK fail ('no transaction is
    # active'), so `openclaw-rl local` died with an OperationalError instead of stopping cleanly
    ("COMMIT", 1),  # the ack was committed
])
def test_ctrl_c_anywhere_in_an_ack_raises_the_interrupt_and_leaves_no_transaction_open(tmp_path, statement, left):
    spool = Spool(tmp_path)
    spool.put([sample(i) for i in range(3)])
    batch, _ = spool.lease(2)
    db, spool._db = spool._db, _InterruptAfter(spool._db, statement)
    with pytest.raises(KeyboardInterrupt):
        spool.ack(batch)
    spool._db = db
    assert not db.in_transaction and spool.depth() == left
    assert spool.ready_count() == 1 and spool.ack(batch) == (2 if left == 3 else 0)


def test_a_transaction_an_interrupt_left_open_is_rolled_back_by_the_next_write(tmp_path):
    """An interrupt in contextlib's own code, between BEGIN and the with body, skips the rollback."""
    spool = Spool(tmp_path)
    spool.put([sample(i) for i in range(3)])
    batch, _ = spool.lease(2)
    spool._db.execute("BEGIN IMMEDIATE")
    spool._db.execute("DELETE FROM samples")  # half-done work of the interrupted call: never committed
    assert spool.ack(batch) == 2 and spool.depth() == 1


def test_a_closed_writer_flushes_and_closes_again_at_once(tmp_path):
    """A runtime stopped by its owner is stopped again at exit (atexit): its writer must not wait for
    a flush its finished thread will never answer (that cost pytest 30 s per runtime at exit)."""
    from openclaw_rl.metrics import ProxyMetrics
    from openclaw_rl.writer import SampleWriter

    writer = SampleWriter(Spool(tmp_path), ProxyMetrics())
    writer.close()
    again = threading.Thread(target=lambda: (writer.flush(timeout=3600), writer.close()), daemon=True)
    again.start()
    again.join(60)  # a hang detector, not a timing: an unanswered flush waits its full hour
    assert not again.is_alive(), "flush/close of a closed writer waited for its finished thread"


def test_put_is_idempotent_per_sample_id(tmp_path):
    spool = Spool(tmp_path)
    s = sample(1)
    spool.put([s])
    spool.put([s])
    assert spool.depth() == 1


def sized(turn: int) -> TrainingSample:
    """A sample whose id is set, so its stored size is known in advance."""
    s = sample(turn)
    s.sample_id = f"{turn:032d}"
    return s


def stored_bytes(s: TrainingSample) -> int:
    """What the cap counts for a sample: its JSON's UTF-8 bytes and its arrays' blobs."""
    payload, blobs = s.to_row()
    return len(payload.encode()) + sum(len(b) for b in blobs if b is not None)


def test_cap_counts_live_samples_and_reopens_when_the_trainer_acks(tmp_path):
    one = stored_bytes(sized(0))
    spool = Spool(tmp_path, max_bytes=3 * one)
    spool.put([sized(i) for i in range(3)])
    assert spool.live_bytes() == 3 * one
    with pytest.raises(SpoolFull):
        spool.put([sized(3)])
    for i in range(20):  # pending-turn writes (WAL growth) do not count: only unacknowledged samples do
        spool.save_turn(("k", "e", i), "x" * 10_000)
    batch, _ = spool.lease(2)
    assert spool.live_bytes() == 3 * one  # leased is still live until acknowledged
    spool.ack(batch)
    assert spool.live_bytes() == one
    spool.put([sized(3)])  # room again, although the file never shrank
    spool.close()
    reopened = Spool(tmp_path, max_bytes=3 * one)  # the count survives a restart
    assert reopened.live_bytes() == 2 * one
    reopened.put([sized(4)])
    with pytest.raises(SpoolFull):
        reopened.put([sized(5)])


def test_live_bytes_of_an_old_spool_are_counted_at_open(tmp_path):
    spool = Spool(tmp_path)
    spool.put([sized(i) for i in range(4)])
    spool._db.execute("DROP TABLE spool_stats")  # a spool written before the count existed
    spool.close()
    assert Spool(tmp_path).live_bytes() == 4 * stored_bytes(sized(0))


@pytest.mark.parametrize("damage", ["garbage_file", "garbage_mid_file"])
def test_corrupt_spool_is_detected_at_start_with_advice(tmp_path, damage):
    spool = Spool(tmp_path)
    spool.put([sample(i) for i in range(200)])
    spool._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    spool.close()
    path = tmp_path / "samples.sqlite3"
    data = bytearray(path.read_bytes())
    if damage == "garbage_file":
        data[:100] = b"\xde\xad" * 50
    else:
        mid = len(data) // 2
        data[mid:mid + 4096] = b"\x5a" * 4096
    path.write_bytes(bytes(data))
    with pytest.raises(SpoolCorrupt, match="corrupt.*move .* aside"):
        Spool(tmp_path)


def test_sample_invariants_are_enforced():
    with pytest.raises(ValueError, match="loss_mask has 1 entries for 2 response tokens"):
        TrainingSample(session_id="s", turn=1, kind="rl", prompt_ids=[1], response_ids=[2, 3],
                       rollout_log_probs=[0.0, 0.0], loss_mask=[1], reward=0.0)
    with pytest.raises(ValueError, match="finite"):
        TrainingSample(session_id="s", turn=1, kind="opd", prompt_ids=[1], response_ids=[2],
                       rollout_log_probs=[0.0], loss_mask=[1], reward=0.0, teacher_log_probs=[float("nan")])


def test_sync_normal_is_opt_in_and_survives_a_crash_of_the_process(tmp_path):
    """``openclaw_spool_sync: normal`` skips the fsync per commit: what was committed survives the
    process dying without closing anything (the power-loss case it gives up cannot be tested here)."""
    import subprocess
    import sys

    from openclaw_rl.config import load_settings

    assert Spool(tmp_path / "a")._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL by default
    assert load_settings(env={}).spool.sync == "full"
    assert load_settings({"spool_sync": "normal"}, env={}).spool.sync == "normal"
    with pytest.raises(ValueError, match="openclaw_spool_sync"):
        load_settings({"spool_sync": "off"}, env={})
    code = ("import os, sys; sys.path.insert(0, sys.argv[2]); from test_spool import sample; "
            "from openclaw_rl.spool import Spool; s = Spool(sys.argv[1], sync='normal'); "
            "assert s._db.execute('PRAGMA synchronous').fetchone()[0] == 1; "
            "s.put([sample(i) for i in range(3)]); os._exit(0)")
    from pathlib import Path
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "b"), str(Path(__file__).parent)], check=True)
    assert [s.turn for s in Spool(tmp_path / "b").iter_samples()] == [0, 1, 2]


@pytest.mark.parametrize("bad", ["rollout", "reward", "topk", "metadata", "surrogate", "none"])
def test_samples_come_back_from_the_spool_with_the_values_they_went_in_with(tmp_path, bad):
    """Samples are stored with orjson, which writes NaN and infinities as null: a sample holding one is
    written by json instead, so every value (non-ASCII text, a lone surrogate, NaN, ±inf) comes back."""
    import math

    nan, inf = float("nan"), float("inf")
    s = TrainingSample(session_id="s\u00e9", turn=1, kind="rl", prompt_ids=[1, 2], response_ids=[3, 4],
                       rollout_log_probs=[-0.1, nan if bad == "rollout" else -0.2], loss_mask=[1, 1],
                       reward=-inf if bad == "reward" else 0.5, response_text="caf\u00e9 🙂" + ("\ud800" if bad == "surrogate" else ""),
                       teacher_topk_log_probs=[[-1.0], [inf if bad == "topk" else -2.0]], teacher_topk_indices=[[5], [6]],
                       metadata={"votes": [1, None, -1], "x": [[nan if bad == "metadata" else 1.5]]})
    spool = Spool(tmp_path)
    spool.put([s])
    _, (got,) = spool.lease(1)

    def same(a, b):
        if isinstance(a, float) and isinstance(b, float):
            return a == b or (math.isnan(a) and math.isnan(b))
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return len(a) == len(b) and all(map(same, a, b))
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        return a == b and type(a) is type(b)

    for name in ("session_id", "prompt_ids", "response_ids", "rollout_log_probs", "reward", "response_text",
                 "teacher_topk_log_probs", "teacher_topk_indices", "metadata"):
        assert same(getattr(got, name), getattr(s, name)), name


def test_a_next_state_is_saved_alone_and_comes_back_in_its_turn(tmp_path):
    """``save_next_state`` writes a small row of its own instead of rewriting the whole record (prompt
    ids, and the conversation twice with records on); ``pending_turns`` puts it back in the record; a
    whole save afterwards (feedback) replaces both; a turn without a record is refused so the caller saves
    it whole; a turn's samples being stored removes both."""
    import json

    spool = Spool(tmp_path)
    record = {"session_key": "k", "index": 1, "next_state": None, "prompt_ids": "AAAA"}
    spool.save_turn(("k", "", 1), json.dumps(record))
    assert spool.save_next_state(("k", "", 1), json.dumps({"role": "user", "content": "thanks"}))
    assert not spool.save_next_state(("k", "", 2), "{}")
    assert [json.loads(p) for p in spool.pending_turns()] == [{**record, "next_state": {"role": "user",
                                                                                       "content": "thanks"}}]
    assert [json.loads(p) for p in Spool(tmp_path).pending_turns()] == [json.loads(spool.pending_turns()[0])]
    whole = {**record, "next_state": {"role": "user", "content": "[explicit feedback: +1]"}}
    spool.save_turn(("k", "", 1), json.dumps(whole))
    assert [json.loads(p) for p in spool.pending_turns()] == [whole]
    assert spool.save_next_state(("k", "", 1), json.dumps({"role": "user", "content": "again"}))
    spool.put([], settled=[("k", "", 1)])
    assert spool.pending_turns() == []
    assert spool._db.execute("SELECT COUNT(*) FROM pending_next_states").fetchone()[0] == 0


def test_a_spool_from_before_next_states_were_saved_alone_opens_and_takes_them(tmp_path):
    import sqlite3

    db = sqlite3.connect(tmp_path / "samples.sqlite3")
    db.execute("CREATE TABLE pending_turns (session_key TEXT NOT NULL, epoch TEXT NOT NULL, turn INTEGER NOT NULL, "
               "payload TEXT NOT NULL, PRIMARY KEY (session_key, epoch, turn))")
    db.execute("INSERT INTO pending_turns VALUES ('k', '', 1, '{\"index\": 1}')")
    db.commit()
    db.close()
    spool = Spool(tmp_path)
    assert spool.pending_turns() == ['{"index": 1}']
    assert spool.save_next_state(("k", "", 1), '{"role": "user", "content": "ok"}')
    assert '"next_state": {"role": "user", "content": "ok"}' in spool.pending_turns()[0]


def _turn(index: int):
    from array import array

    from openclaw_rl.turns import Generation, Turn

    turn = Turn(session_key="u\x1fs", session_id="s", index=index, prompt_ids=array("i", [7, 2**31 - 1, -5, 0]),
                messages=None, tools=None, sampling_temperature=1.0, epoch="e")
    turn.generation = Generation(array("i", [3, 151643]), array("d", [-0.1, -1e-300]), "hi", "stop")
    return turn


def _same_turn(got, want) -> None:
    assert got.prompt_ids == want.prompt_ids and got.prompt_ids.typecode == "i"
    assert got.generation.response_ids == want.generation.response_ids
    assert got.generation.response_logprobs.tobytes() == want.generation.response_logprobs.tobytes()  # bit-exact
    assert (got.session_key, got.epoch, got.index, got.generation.text) == (want.session_key, want.epoch,
                                                                           want.index, want.generation.text)


def test_a_waiting_turns_arrays_are_stored_as_bytes_and_come_back_exact(tmp_path):
    """The writer stores a waiting turn's token arrays as blobs (no base64 in its record, issue #33 item 2);
    ``pending_turns`` gives the record as ``Turn.to_record`` writes it, arrays and next state included."""
    import json

    from openclaw_rl import codec
    from openclaw_rl.turns import Turn

    spool = Spool(tmp_path)
    turn = _turn(1)
    spool.save_turn(("u\x1fs", "e", 1), codec.dumps_str(turn.to_record(arrays=False)), turn.array_bytes())
    payload, prompt = spool._db.execute("SELECT payload, prompt_ids FROM pending_turns").fetchone()
    assert json.loads(payload)["prompt_ids"] is None and prompt == turn.prompt_ids.tobytes()
    turn.next_state = {"role": "user", "content": "thanks"}
    assert spool.save_next_state(("u\x1fs", "e", 1), json.dumps(turn.next_state))
    (restored,) = [Turn.from_record(json.loads(p)) for p in Spool(tmp_path).pending_turns()]
    _same_turn(restored, turn)
    assert restored.next_state == turn.next_state
    assert json.loads(Spool(tmp_path).pending_turns()[0]) == json.loads(json.dumps(turn.to_record()))


def test_a_spool_of_the_previous_schema_opens_and_its_rows_keep_working(tmp_path):
    """A spool written before the arrays moved out of the waiting turn's record (main at a0c7818's schema,
    its record with base64 arrays): it opens, its turn comes back exact, its sample is delivered, and new
    turns are saved with their arrays apart next to it."""
    import json
    import sqlite3

    from openclaw_rl import codec
    from openclaw_rl.turns import Turn

    old = _turn(1)
    db = sqlite3.connect(tmp_path / "samples.sqlite3", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(spool_schemas.ARRAYS_IN_RECORDS)
    payload = sample(3).to_json()
    db.execute("INSERT INTO samples(sample_id, session_id, turn, kind, created, payload) VALUES ('x', 's', 3, 'rl', 0, ?)",
               (payload,))
    db.execute("INSERT INTO spool_stats VALUES ('live_bytes', ?)", (len(payload),))
    db.execute("INSERT INTO pending_turns VALUES ('u\x1fs', 'e', 1, ?)", (codec.dumps_str(old.to_record()),))
    db.execute("INSERT INTO pending_next_states VALUES ('u\x1fs', 'e', 1, '{\"role\": \"user\", \"content\": \"ok\"}')")
    db.close()

    spool = Spool(tmp_path, exclusive=True)
    (restored,) = [Turn.from_record(json.loads(p)) for p in spool.pending_turns()]
    _same_turn(restored, old)
    assert restored.next_state == {"role": "user", "content": "ok"}
    new = _turn(2)
    spool.save_turn(("u\x1fs", "e", 2), codec.dumps_str(new.to_record(arrays=False)), new.array_bytes())
    _same_turn(Turn.from_record(json.loads(spool.pending_turns()[1])), new)
    assert spool.live_bytes() == len(payload)
    _, got = spool.lease(5)
    assert [s.turn for s in got] == [3] and got[0].prompt_ids == [1, 2]
    spool.put([], settled=[("u\x1fs", "e", 1), ("u\x1fs", "e", 2)])  # settled: the rows and the next state go
    assert spool.pending_turns() == []
    assert spool._db.execute("SELECT COUNT(*) FROM pending_next_states").fetchone()[0] == 0
    spool.close()


def test_a_column_another_process_added_first_does_not_fail_the_migration(tmp_path, monkeypatch):
    """Two processes open a spool of the previous schema at once (the proxy and ``openclaw-rl samples``, the
    first start after an upgrade): both see a column missing, the other one adds it first. This one's
    ALTER TABLE then fails with 'duplicate column name', which must not make the spool 'corrupt'."""
    import sqlite3

    path = tmp_path / "samples.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript("""
        CREATE TABLE pending_turns (session_key TEXT NOT NULL, epoch TEXT NOT NULL, turn INTEGER NOT NULL,
            payload TEXT NOT NULL, PRIMARY KEY (session_key, epoch, turn));
        INSERT INTO pending_turns VALUES ('k', '', 1, '{"index": 1}');
    """)
    db.close()
    connect = Spool._connect

    class FirstElsewhere:
        """This process's connection; each ALTER TABLE is made by another connection just before it."""

        def __init__(self, inner: sqlite3.Connection) -> None:
            self._inner = inner

        def __getattr__(self, name: str):
            return getattr(self._inner, name)

        def execute(self, sql: str, *args):
            if sql.startswith("ALTER TABLE"):
                other = sqlite3.connect(path, isolation_level=None)
                other.execute(sql)
                other.close()
            return self._inner.execute(sql, *args)

    monkeypatch.setattr(Spool, "_connect", lambda self: FirstElsewhere(connect(self)))
    spool = Spool(tmp_path)
    assert spool.pending_turns() == ['{"index": 1}']
    monkeypatch.undo()
    spool.close()
    assert Spool(tmp_path).pending_turns() == ['{"index": 1}']
