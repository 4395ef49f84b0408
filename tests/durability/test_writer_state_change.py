"""``SampleWriter.on_state_change`` (what ``serve --workers``' owner pushes to its workers as a ``Status``) fires
when a refusal's inputs change (the spool's problem, "overloaded"), not on every write that grows the overflow
while the spool is full: that would be one Status per turn to every worker."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from test_group_commit import outcome, turn

from openclaw_rl.metrics import ProxyMetrics
from openclaw_rl.spool import Spool
from openclaw_rl.workers.owner import OwnerHub
from openclaw_rl.writer import SampleWriter


def test_a_full_spool_tells_the_listener_once_not_per_write(tmp_path):
    writer = SampleWriter(Spool(tmp_path, max_bytes=1), ProxyMetrics(), max_overflow=1000)
    calls: list[tuple] = []
    lock = threading.Lock()

    def changed() -> None:
        with lock:
            calls.append((writer.problem, writer.overloaded, len(writer.overflow)))
    writer.on_state_change = changed
    try:
        for i in range(1, 21):
            t = turn(i)
            writer(t, outcome(t))
            writer.flush()
        assert len(writer.overflow) >= 18  # the 1-byte spool took at most the first samples
        assert not writer.overloaded
        assert len(calls) <= 1, f"{len(calls)} state changes told for writes into the overflow: {calls[:5]}"
        writer.max_overflow = len(writer.overflow)  # now full: that is a change a worker must hear of
        writer.flush()
        assert calls and calls[-1][1] is True
    finally:
        writer.close()


def test_the_owners_status_changes_only_with_what_a_refusal_reads(tmp_path):
    """The Status's overflow count is only shown in the "spool is full" refusal: below the bound, a growing
    overflow is no new Status (the hub broadcasts each distinct one to every worker)."""
    writer = SimpleNamespace(overloaded=False, overflow=[1, 2, 3], problem=None)
    writer.refusal_state = lambda: SampleWriter.refusal_state(writer)  # the writer's own rule, on these fields
    proxy = SimpleNamespace(tracker=SimpleNamespace(on_end=lambda key: None), writer=writer,
                            service=SimpleNamespace(context_length=4096, keep_messages=True))
    hub = OwnerHub(proxy, 2)  # type: ignore[arg-type]
    before = hub.status()
    writer.overflow = [1, 2, 3, 4]
    assert hub.status() == before
    writer.overloaded = True
    full = hub.status()
    assert full != before and full.overloaded and full.overflow == 4
