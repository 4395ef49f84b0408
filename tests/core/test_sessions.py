"""The next-state state machine, with a fake scorer: order, concurrency, session end, TTL, at-least-one."""

from __future__ import annotations

import asyncio
import random
from array import array

from openclaw_rl.binary_rl import BinaryRLScorer
from openclaw_rl.config import Settings
from openclaw_rl.judge import PRMJudgement
from openclaw_rl.metrics import ProxyMetrics
from openclaw_rl.scoring import Outcome
from openclaw_rl.sessions import SessionTracker
from openclaw_rl.turns import DropReason, Generation, Turn


class FakeJudge:
    enabled = True

    def __init__(self, scores: dict[str, float], delay=lambda: 0.0):
        self.scores, self.delay = scores, delay

    async def prm(self, response_text: str, next_state: dict[str, str]) -> PRMJudgement:
        await asyncio.sleep(self.delay())
        score = self.scores.get(next_state["content"], 0.0)
        return PRMJudgement(score, [int(score)] * 3)


def make(scores=None, delay=lambda: 0.0, **rl):
    settings = Settings()
    for k, v in rl.items():
        setattr(settings.rl, k, v)
    scorer = BinaryRLScorer(settings, FakeJudge(scores or {}, delay))
    emitted: list[tuple[Turn, Outcome]] = []
    tracker = SessionTracker(scorer, lambda t, o: emitted.append((t, o)), ProxyMetrics(), ttl_s=60)
    return tracker, emitted


_prompts = iter(range(100, 10**9))


def turn(key="s", prompt=None) -> Turn:
    """A turn; each gets its own prompt unless one is given (an identical prompt is a retry)."""
    ids = prompt if prompt is not None else (1, 2, next(_prompts))
    return Turn(session_key=key, session_id=key, index=0, prompt_ids=array("i", ids), messages=None, tools=None,
                sampling_temperature=1.0)


def gen(n=3) -> Generation:
    return Generation.from_lists(list(range(10, 10 + n)), [-0.5] * n, "text", "stop")


async def settle():
    """Wait until every task the tracker started (its judgements, each emitting in order as it ends) is done.
    They are the only other tasks on this loop; nothing is left to chance by sleeping."""
    me = asyncio.current_task()
    while pending := [t for t in asyncio.all_tasks() if t is not me and not t.done()]:
        _, late = await asyncio.wait(pending, timeout=30)
        assert not late, f"{len(late)} judgements still running after 30 s"


def test_turn_waits_for_next_state_then_is_judged():
    async def run():
        tracker, emitted = make({"thanks": 1.0})
        t1 = tracker.begin(turn(), None)
        tracker.complete(t1, gen())
        await settle()
        assert emitted == []
        t2 = tracker.begin(turn(), {"role": "user", "content": "thanks"})
        await settle()
        assert [(t.index, o.samples[0].reward) for t, o in emitted] == [(1, 1.0)]
        assert t1.next_state == {"role": "user", "content": "thanks"} and t2.index == 2
    asyncio.run(run())


def test_next_state_arrives_while_the_turn_is_still_generating():
    async def run():
        tracker, emitted = make({"thanks": -1.0})
        t1 = tracker.begin(turn(), None)
        tracker.begin(turn(), {"role": "user", "content": "thanks"})  # concurrent request, same session
        await settle()
        assert emitted == []
        tracker.complete(t1, gen())
        await settle()
        assert emitted[0][1].samples[0].reward == -1.0
    asyncio.run(run())


def test_out_of_order_judgements_are_emitted_in_turn_order():
    async def run():
        rng = random.Random(0)
        tracker, emitted = make({f"u{i}": 1.0 for i in range(20)}, delay=lambda: rng.random() * 0.02)
        for i in range(20):
            t = tracker.begin(turn(), {"role": "user", "content": f"u{i}"} if i else None)
            tracker.complete(t, gen())
        await settle()
        assert [t.index for t, _ in emitted] == list(range(1, 20))
    asyncio.run(run())


def test_session_done_flushes_last_turn_and_failed_turns_keep_order():
    async def run():
        tracker, emitted = make({"ok": 1.0})
        t1 = tracker.begin(turn(), None)
        t2 = tracker.begin(turn(), {"role": "user", "content": "ok"})
        tracker.fail(t1, DropReason.GENERATION_FAILED)
        tracker.complete(t2, gen())
        tracker.end_session("s")
        await settle()
        assert [(t.index, o.drop) for t, o in emitted] == [(1, DropReason.GENERATION_FAILED),
                                                           (2, DropReason.NO_NEXT_STATE)]
        assert "s" not in tracker.sessions
    asyncio.run(run())


def test_turn_still_generating_when_its_session_ends_is_still_settled():
    async def run():
        tracker, emitted = make()
        t1 = tracker.begin(turn(), None)
        tracker.end_session("s")
        tracker.complete(t1, gen())
        await settle()
        assert [(t.index, o.drop) for t, o in emitted] == [(1, DropReason.NO_NEXT_STATE)]
    asyncio.run(run())


def test_at_least_one_promotes_first_judged_zero_turn_only():
    async def run():
        tracker, emitted = make({"meh": 0.0})
        for i in range(3):
            t = tracker.begin(turn(), {"role": "user", "content": "meh"} if i else None)
            tracker.complete(t, gen())
        await settle()
        outcomes = [o for _, o in emitted]
        assert outcomes[0].samples[0].loss_mask == [1, 1, 1] and outcomes[0].samples[0].reward == 0.0
        assert outcomes[0].samples[0].metadata["promoted_at_least_one"]
        assert outcomes[1].drop == DropReason.ZERO_SCORE
    asyncio.run(run())


def test_upstream_keep_masked_samples_option():
    async def run():
        tracker, emitted = make({"meh": 0.0}, keep_masked_samples=True, at_least_one=False)
        t = tracker.begin(turn(), None)
        tracker.complete(t, gen())
        tracker.begin(turn(), {"role": "user", "content": "meh"})
        await settle()
        assert emitted[0][1].samples[0].loss_mask == [0, 0, 0]
    asyncio.run(run())


def test_idle_sessions_expire_after_ttl():
    async def run():
        tracker, emitted = make()
        t = tracker.begin(turn("idle"), None)
        tracker.complete(t, gen())
        assert tracker.sweep(now=tracker.sessions["idle"].last_seen + 30) == 0
        assert tracker.sweep(now=tracker.sessions["idle"].last_seen + 61) == 1
        await settle()
        assert emitted[0][1].drop == DropReason.NO_NEXT_STATE and not tracker.sessions
    asyncio.run(run())


def test_memory_is_bounded_by_max_sessions():
    async def run():
        tracker, emitted = make()
        tracker.max_sessions = 5
        for i in range(12):
            t = tracker.begin(turn(f"s{i}"), None)
            tracker.complete(t, gen())
        await settle()
        assert len(tracker.sessions) == 5 and len(emitted) == 7
    asyncio.run(run())


def test_one_key_cannot_evict_another_keys_sessions():
    async def run():
        tracker, emitted = make()
        tracker.max_sessions = 5
        b = tracker.begin(turn("B\x1fwaiting"), None)
        tracker.complete(b, gen())
        for i in range(12):  # key A opens far more sessions than its quota
            t = tracker.begin(turn(f"A\x1fs{i}"), None)
            tracker.complete(t, gen())
        await settle()
        assert "B\x1fwaiting" in tracker.sessions  # B's waiting turn is untouched
        assert sum(k.startswith("A\x1f") for k in tracker.sessions) == 5
        assert len(emitted) == 7 and all(t.session_key.startswith("A\x1f") for t, _ in emitted)
    asyncio.run(run())


def test_identical_retry_supersedes_the_unanswered_turn():
    async def run():
        tracker, emitted = make({"q": 1.0, "thanks": 1.0})
        state = {"role": "user", "content": "q"}
        t1 = tracker.begin(turn("s", (1, 2, 3)), state)
        tracker.complete(t1, gen())
        t2 = tracker.begin(turn("s", (1, 2, 3)), state)  # the same prompt again: t1's reply was never used
        await settle()
        assert [(t.index, o.drop) for t, o in emitted] == [(1, DropReason.SUPERSEDED_BY_RETRY)]
        tracker.complete(t2, gen())
        t3 = tracker.begin(turn("s", (1, 2, 3, 9, 9)), {"role": "user", "content": "thanks"})
        tracker.complete(t3, gen())
        await settle()
        assert [(t.index, o.drop) for t, o in emitted][1] == (2, None)  # t2 became the sample, once
        assert emitted[1][0].next_state == {"role": "user", "content": "thanks"}
    asyncio.run(run())


def test_a_retry_while_the_first_is_still_generating_and_a_different_prompt_is_a_next_state():
    async def run():
        tracker, emitted = make({"q2": 1.0})
        t1 = tracker.begin(turn("s", (1, 2)), None)
        t2 = tracker.begin(turn("s", (1, 2)), None)  # double submit while t1 generates
        await settle()
        assert [o.drop for _, o in emitted] == [DropReason.SUPERSEDED_BY_RETRY]
        assert tracker.complete(t1, gen()) is None  # the late answer of the superseded turn is ignored
        tracker.fail(t1, DropReason.CLIENT_DISCONNECTED)  # and so is a late failure: counted once
        tracker.complete(t2, gen())
        t3 = tracker.begin(turn("s", (1, 2, 5)), {"role": "user", "content": "q2"})  # a different prompt
        await settle()
        assert [(t.index, o.drop) for t, o in emitted] == [(1, DropReason.SUPERSEDED_BY_RETRY), (2, None)]
        assert t3.index == 3
    asyncio.run(run())


def test_a_next_state_saved_alone_survives_a_restart_and_is_judged_with_it(tmp_path):
    """When a persisted turn's next state arrives, only that is written (not the whole record again);
    a crash while the judge runs loses nothing: after the restart the turn comes back with its next
    state and is judged with it."""
    import json

    from openclaw_rl.spool import Spool
    from openclaw_rl.writer import SampleWriter

    spool = Spool(tmp_path)
    writer = SampleWriter(spool, ProxyMetrics())

    class StuckJudge(FakeJudge):
        async def prm(self, response_text, next_state):
            await asyncio.Event().wait()  # the process dies before the verdict

    async def before_the_crash() -> None:
        tracker = SessionTracker(BinaryRLScorer(Settings(), StuckJudge({})), writer, ProxyMetrics(), ttl_s=60,
                                 persist=writer.save_turn, persist_next_state=writer.save_next_state)
        first = tracker.begin(turn("s"), None)
        tracker.complete(first, gen())
        writer.flush()  # its record is written (the writer serialises it when it gets to it)
        tracker.begin(turn("s"), {"role": "user", "content": "thanks"})

    asyncio.run(before_the_crash())
    writer.flush()
    (payload,) = spool._db.execute("SELECT payload FROM pending_turns WHERE turn=1").fetchone()
    (next_state,) = spool._db.execute("SELECT next_state FROM pending_next_states WHERE turn=1").fetchone()
    assert json.loads(payload)["next_state"] is None  # the record was not written again...
    assert json.loads(next_state) == {"role": "user", "content": "thanks"}  # ...only its next state

    async def after_the_restart() -> list[tuple[Turn, Outcome]]:
        emitted: list[tuple[Turn, Outcome]] = []
        scorer = BinaryRLScorer(Settings(), FakeJudge({"thanks": 1.0}))
        tracker = SessionTracker(scorer, lambda t, o: emitted.append((t, o)), ProxyMetrics(), ttl_s=60)
        tracker.restore([Turn.from_record(json.loads(p)) for p in Spool(tmp_path).pending_turns()])
        await settle()
        return emitted

    emitted = asyncio.run(after_the_restart())
    assert [(t.index, t.next_state["content"], o.samples[0].reward) for t, o in emitted] == [(1, "thanks", 1.0)]
    writer.close()
