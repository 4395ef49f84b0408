"""The single writer thread: persists each turn's outcome (spool samples + JSONL records) in order.

Stage: sessions → **writer** → spool. The event loop only enqueues; SQLite commits and record-file
appends happen on this thread, so the proxy never blocks on disk (upstream wrote records inside the
event loop). A FIFO preserves per-session turn order. When the spool is at its cap, samples wait in
memory (counted, logged loudly) and are retried on every later write and every second while idle, so
they move to the spool as soon as the trainer acknowledges a batch: nothing is dropped silently. The
in-memory overflow is bounded: at ``max_overflow`` samples the proxy refuses new requests with 503 +
Retry-After (``overloaded``) until the backlog drains; turns already admitted still land in memory.
``save_turn`` returns a future that is done once the waiting turn is committed, so the reply's last
byte can wait for it (a SIGKILL after the client saw a reply never loses that turn).
Record files are append-only and never truncated (upstream truncated them at every weight sync).
Group commit: what is queued when the thread wakes is written together, each run of turn saves in one
transaction and each run of outcomes in one, in queue order. Under concurrency the commits (each an
fsync with ``synchronous=FULL``, milliseconds of wall time here) were the thread's queue: replies waited
for commits of other sessions' turns. Every future is still set only after its own row is committed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from itertools import groupby
from pathlib import Path
from typing import Any

from . import codec
from .metrics import ProxyMetrics, log_safe
from .samples import TrainingSample
from .scoring import Outcome
from .spool import Spool, SpoolFull
from .turns import Turn

log = logging.getLogger(__name__)


class SampleWriter:
    def __init__(self, spool: Spool, metrics: ProxyMetrics, record_dir: str = "",
                 on_written: Callable[[list[TrainingSample]], None] | None = None, max_overflow: int = 10_000):
        self.spool, self.metrics = spool, metrics
        self.max_overflow = max_overflow
        self.on_written = on_written
        self._queue: queue.Queue[tuple[str, Any, Any] | None] = queue.Queue()
        self.overflow: deque[TrainingSample] = deque()
        self._overflow_settled: list[Any] = []  # pending-turn rows to forget once the overflow is committed
        self._eval_lock = threading.Lock()
        self._eval_scores: list[float] = []
        self._records = self._prm_records = None
        if record_dir:
            Path(record_dir).mkdir(parents=True, exist_ok=True)
            self._records = open(Path(record_dir) / "conversations.jsonl", "ab")  # noqa: SIM115
            self._prm_records = open(Path(record_dir) / "judge.jsonl", "ab")  # noqa: SIM115
        self._thread = threading.Thread(target=self._run, name="openclaw-writer", daemon=True)
        self._thread.start()
        self._last_full_log = 0.0

    def __call__(self, turn: Turn, outcome: Outcome) -> None:
        """A turn's final outcome (from the session tracker, in turn order)."""
        self._queue.put(("outcome", turn, outcome))

    def save_turn(self, turn: Turn) -> Future:
        """A turn that waits for its next state or judgement: persisted so a restart resumes it.
        Serialised on this thread, not the event loop; the future is done once it is committed."""
        done: Future = Future()
        self._queue.put(("turn", turn, done))
        return done

    @property
    def overloaded(self) -> bool:
        """The spool is full and the in-memory overflow reached its bound: admit no new turns."""
        return len(self.overflow) >= self.max_overflow

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until everything enqueued so far is persisted (at once when closed: nothing would answer)."""
        if not self._thread.is_alive():
            return
        done = threading.Event()
        self._queue.put(("flush", done, None))
        done.wait(timeout)

    def close(self) -> None:
        """Persist what is enqueued and stop the thread; closing twice is a no-op (a runtime stopped by its
        owner is stopped again at exit)."""
        if self._thread.is_alive():
            self.flush()
            self._queue.put(None)
            self._thread.join(10)
        for f in (self._records, self._prm_records):
            if f:
                f.close()

    # --- eval scores (rollout/prm_eval_score) ------------------------------------------------------------

    def take_eval_scores(self) -> list[float]:
        with self._eval_lock:
            scores, self._eval_scores = self._eval_scores, []
        return scores

    # --- thread ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=1.0 if self.overflow else None)
            except queue.Empty:  # idle with a backlog: the trainer may have acknowledged a batch since
                self._persist(list(self.overflow), retrying=len(self.overflow), settled=[])
                continue
            batch = [item]
            while batch[-1] is not None and len(batch) < GROUP_MAX:  # what else is queued: one commit per run
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            for op, run in groupby(batch, key=lambda it: None if it is None else it[0]):
                if op is None:
                    return
                items = list(run)
                if op == "flush":
                    for _, done, _ in items:
                        done.set()
                elif op == "turn":
                    self._save_turns([(turn, fut) for _, turn, fut in items])
                else:
                    self._guarded(op, items[0][1], self._write, [(turn, outcome) for _, turn, outcome in items])

    def _guarded(self, op: str, first: Any, fn: Callable[..., None], *args: Any) -> bool:
        """Run one write; a failure is counted and logged (the caller's turns stay pending for a restart)."""
        try:
            fn(*args)
            return True
        except Exception:
            self.metrics.spool_errors.inc()
            log.exception("spool write (%s) for session %s failed", op, log_safe(getattr(first, "session_id", "?")))
            return False

    def _save_turns(self, items: list[tuple[Turn, Future]]) -> None:
        """Waiting turns, one transaction for all; a turn that cannot be serialised fails only its own future."""
        rows, waiting = [], []
        for turn, fut in items:
            try:
                rows.append(((turn.session_key, turn.epoch, turn.index), codec.dumps_str(turn.to_record())))
                waiting.append(fut)
            except Exception as e:
                fut.set_exception(e)
                self._guarded("turn", turn, _reraise, e)
        if not rows:
            return
        try:
            self.spool.save_turns(rows)
        except Exception as e:
            for fut in waiting:
                fut.set_exception(e)
            self._guarded("turn", items[0][0], _reraise, e)
            return
        for fut in waiting:
            fut.set_result(True)

    def _write(self, outcomes: list[tuple[Turn, Outcome]]) -> None:
        """Turns' final outcomes: their samples and settled rows in one transaction, then their records."""
        for _, outcome in outcomes:
            if outcome.eval_score is not None:
                with self._eval_lock:
                    self._eval_scores.append(outcome.eval_score)
        self._persist(list(self.overflow) + [s for _, outcome in outcomes for s in outcome.samples],
                      retrying=len(self.overflow),
                      settled=[(turn.session_key, turn.epoch, turn.index) for turn, _ in outcomes])
        if self._records is not None:
            for turn, outcome in outcomes:
                self._record(turn, outcome)

    def _persist(self, samples: list[TrainingSample], retrying: int, settled: list[Any]) -> None:
        keys = self._overflow_settled + settled
        try:
            self.spool.put(samples, settled=keys)
        except SpoolFull as e:
            # The turns' pending rows stay until their samples are committed: a crash meanwhile re-judges
            # them after the restart instead of losing the samples held in memory.
            self._overflow_settled = keys
            self.overflow = deque(samples)
            self.metrics.overflow.set(len(self.overflow))
            self.metrics.spool_errors.inc()
            if time.monotonic() - self._last_full_log > 10:
                self._last_full_log = time.monotonic()
                log.error("%s: %d samples held in memory until it has room (raise openclaw_spool_max_bytes or "
                          "let training drain it)", e, len(self.overflow))
            return
        except Exception:
            self._overflow_settled = keys
            self.overflow = deque(samples)
            self.metrics.overflow.set(len(self.overflow))
            self.metrics.spool_errors.inc()
            log.exception("spool write failed; %d samples held in memory and retried on the next write",
                          len(samples))
            return
        if self.overflow:
            log.warning("spool has room again: %d samples held in memory are persisted", retrying)
        self.overflow.clear()
        self._overflow_settled = []
        self.metrics.overflow.set(0)
        if not samples:
            return
        for s in samples[retrying:]:
            self.metrics.samples.labels(s.kind).inc()
        if self.on_written:
            self.on_written(samples)

    def _record(self, turn: Turn, outcome: Outcome) -> None:
        gen = turn.generation
        line: dict[str, Any] = {
            "session_id": turn.session_id, "turn": turn.index, "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"),
            "messages": turn.messages, "prompt_text": turn.prompt_text,
            "response_text": gen.text if gen else None, "next_state": turn.next_state,
            "samples": [s.sample_id for s in outcome.samples], "dropped": outcome.drop.value if outcome.drop else None,
        }
        self._records.write(_record_line(line))  # type: ignore[union-attr]
        self._records.flush()  # type: ignore[union-attr]
        if outcome.record:
            judge_line = {"session_id": turn.session_id, "turn": turn.index, **outcome.record}
            self._prm_records.write(_record_line(judge_line))  # type: ignore[union-attr]
            self._prm_records.flush()  # type: ignore[union-attr]


GROUP_MAX = 64  # queued writes taken together at most


def _reraise(error: BaseException) -> None:
    raise error


def _record_line(obj: dict[str, Any]) -> bytes:
    """One JSONL record line, UTF-8 (orjson on the writer thread: a record holds the whole conversation)."""
    return codec.dumps(obj) + b"\n"
