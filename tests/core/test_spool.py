"""The durable spool: ordered delivery, leases, acknowledgement, crash re-delivery, disk cap."""

from __future__ import annotations

import pytest

from openclaw_rl.samples import TrainingSample
from openclaw_rl.spool import Spool, SpoolFull


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


def test_put_is_idempotent_per_sample_id(tmp_path):
    spool = Spool(tmp_path)
    s = sample(1)
    spool.put([s])
    spool.put([s])
    assert spool.depth() == 1


def test_disk_cap_refuses_loudly(tmp_path):
    spool = Spool(tmp_path, max_bytes=1)
    with pytest.raises(SpoolFull):
        spool.put([sample(1)])


def test_sample_invariants_are_enforced():
    with pytest.raises(ValueError, match="loss_mask has 1 entries for 2 response tokens"):
        TrainingSample(session_id="s", turn=1, kind="rl", prompt_ids=[1], response_ids=[2, 3],
                       rollout_log_probs=[0.0, 0.0], loss_mask=[1], reward=0.0)
    with pytest.raises(ValueError, match="finite"):
        TrainingSample(session_id="s", turn=1, kind="opd", prompt_ids=[1], response_ids=[2],
                       rollout_log_probs=[0.0], loss_mask=[1], reward=0.0, teacher_log_probs=[float("nan")])
