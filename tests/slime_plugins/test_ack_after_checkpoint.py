"""A batch leaves the spool only once a checkpoint holds the step that trained it (resumable runs).

The event order below is THUDM/slime ``train_async.py``'s (624b824): ``generate(k + 1)`` is requested
before step k trains, then step k trains, then the checkpoint of step k is written when
``(k + 1) % save_interval == 0`` (or at the last rollout). ``tests/slime_plugins/test_slime_cpu.py``
drives the real loop's pieces where Slime is importable.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from openclaw_rl.slime_hooks.bridge import durable_step


def _events(num_rollout: int, save_interval: int) -> list[tuple[str, int]]:
    events = [("generate", 0)]
    for k in range(num_rollout):
        if k + 1 < num_rollout:
            events.append(("generate", k + 1))
        events.append(("train", k))
        if (k + 1) % save_interval == 0 or k == num_rollout - 1:
            events.append(("save", k))
    return events


@pytest.mark.parametrize("save_interval", [1, 2, 3, 7])
def test_acknowledged_steps_are_always_checkpointed_and_every_checkpointed_step_is_acknowledged(save_interval):
    args = SimpleNamespace(save="/ckpt", save_interval=save_interval, async_save=False)
    saved = -1
    for kind, k in _events(20, save_interval):
        if kind == "save":
            saved = k
        elif kind == "generate":
            # Exactly the checkpointed steps leave the spool: none later (a crash would lose them), none
            # earlier (the spool would re-deliver batches a relaunch already has in its weights).
            assert durable_step(args, k) == (saved if saved >= 0 else None), (k, saved)


def test_without_a_checkpoint_a_batch_is_acknowledged_once_its_step_has_trained():
    args = SimpleNamespace(save=None, save_interval=None)
    trained = -1
    for kind, k in _events(6, 100):
        if kind == "train":
            trained = k
        elif kind == "generate":
            done = durable_step(args, k)
            assert done is None or done <= trained
            assert done == (k - 2 if k >= 2 else None)


def test_runtime_ack_through_deletes_only_batches_of_earlier_steps(tmp_path):
    from openclaw_rl.runtime import ProxyRuntime
    from openclaw_rl.samples import TrainingSample
    from openclaw_rl.spool import Spool

    spool = Spool(tmp_path / "spool")
    runtime = object.__new__(ProxyRuntime)  # the ack bookkeeping only: no proxy server needed
    runtime.proxy, runtime._unacked = SimpleNamespace(spool=spool, journal=None), []
    samples = [TrainingSample(session_id=f"s{i}", turn=1, kind="rl", prompt_ids=[1], response_ids=[2],
                              rollout_log_probs=[-0.1], loss_mask=[1], reward=1.0) for i in range(6)]
    spool.put(samples)
    for step in range(3):
        batch_id, _ = spool.lease(2)
        runtime._unacked.append((batch_id, step))
    assert runtime.ack_through(1) == 2
    assert spool.depth() == 2 and [s for _, s in runtime._unacked] == [2]
    spool.release_leases()  # what the next start does: the unacknowledged batch comes back
    assert spool.ready_count() == 2
    spool.close()


@pytest.mark.parametrize("save_interval", [1, 2, 3, 7])
def test_under_async_save_only_finalized_checkpoints_are_acknowledged(save_interval):
    """``--async-save``: a checkpoint exists for ``--load`` only once Megatron has finalized it.

    Both Slimes (THUDM/slime 624b824 and the one bundled in OpenClaw-RL 0d034dd) run the same
    ``save_model``: ``maybe_finalize_async_save(blocking=True)`` (finishes the previous save; Megatron's
    finalize step writes ``latest_checkpointed_iteration.txt``, which ``--load`` reads), then schedule this
    one in the background; only the last rollout's save is forced synchronous. The driver waits for
    ``save_model`` (a ``ray.get``), so a scheduled checkpoint is durable once the *next* save has started.
    """
    args = SimpleNamespace(save="/ckpt", save_interval=save_interval, async_save=True)
    num_rollout = 20
    finalized, pending = -1, None
    for kind, k in _events(num_rollout, save_interval):
        if kind == "save":
            if pending is not None:
                finalized = pending  # the blocking finalize at the start of save_model
            pending = k
            if k == num_rollout - 1:
                finalized, pending = k, None  # force_sync at the last rollout
        elif kind == "generate":
            # never a checkpoint still being written (a crash now would lose it and its batches)...
            assert durable_step(args, k) == (finalized if finalized >= 0 else None), (k, finalized, pending)
    assert finalized == num_rollout - 1
