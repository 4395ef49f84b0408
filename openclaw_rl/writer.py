"""The single writer thread: persists each turn's outcome (spool samples + JSONL records) in order.

Stage: sessions → **writer** → spool. The event loop only enqueues; SQLite commits and record-file
appends happen on this thread, so the proxy never blocks on disk (upstream wrote records inside the
event loop). A FIFO preserves per-session turn order. When the spool is at its cap, samples wait in
memory (counted, logged loudly) and are retried on every later write and every second while idle, so
they move to the spool as soon as the trainer acknowledges a batch: nothing is dropped silently. The
in-memory overflow is bounded: at ``max_overflow`` samples the proxy refuses new requests with 503 +
Retry-After (``overloaded``) until the backlog drains; turns already admitted still land in memory.
``save_turn`` returns a future that is done once the waiting turn is committed, so the reply's last
byte can wait for it (a SIGKILL after the client saw a reply never loses that turn); it fails when the
commit fails (a full disk: SQLITE_FULL, an I/O error, the spool file deleted), and the reply is then refused
(``serving._Reply._wait_durable``). What is still held in memory, the waiting turns whose rows or next
states failed to commit and the samples of the overflow above, is retried every second
(``RETRY_S``, with a check that the spool file is still the one opened) and on every later write, so it
lands as soon as the disk has room again; until then ``health()`` (``/healthz``) says what is wrong.
Record files are append-only and never truncated (upstream truncated them at every weight sync).

Group commit: the thread takes everything queued (up to ``MAX_GROUP`` writes) and, while nothing is held
in memory, commits it in one transaction (``Spool.batch``): one fsync for many concurrent turns, so
``synchronous=FULL`` costs little throughput. Nothing of a group counts until its COMMIT returned: the
futures, the in-memory state, the metrics and the record lines are settled after it, in queue order. When
anything in the group fails (a full spool, a full disk, SQLITE_FULL at COMMIT), the group is rolled back
and its writes run again one by one through the path above, which attributes the error to the write that
causes it (every spool write is idempotent: sample ids are fixed before the first try, waiting rows are
replaced). Per-session turn order is the queue's order either way.

Deleting a user while running (``delete_user``, ``users/deletion.py``) is a queued item too: it runs after
every write queued before it, removes the user's samples from the spool (leased ones too) and from what is
held in memory, and rewrites the record files without their lines, so the spool keeps this one writer.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from pathlib import Path
from typing import Any

from . import codec
from .metrics import ProxyMetrics, log_safe
from .samples import TrainingSample
from .scoring import Outcome
from .spool import Spool, SpoolFull, SpoolMissing, TurnKey
from .threadname import name_os_thread
from .turns import Turn

log = logging.getLogger(__name__)

_WRITES = ("turn", "next_state", "outcome")  # queued items that write the spool (the rest are control)
MAX_GROUP = 256  # writes committed together at most (bounds one transaction's size and the time it holds the lock)
RETRY_S = 1.0  # how often the idle writer checks the spool file and retries what it holds in memory


def _resolve(done: Future, error: BaseException | None = None) -> None:
    """Settle a commit future (a reply that gave up waiting has cancelled it: nothing to tell)."""
    try:  # no done() check first: the reply's thread may cancel it between that check and the set
        if error is None:
            done.set_result(True)
        else:
            done.set_exception(error)
    except InvalidStateError:
        pass


class SampleWriter:
    def __init__(self, spool: Spool, metrics: ProxyMetrics, record_dir: str = "",
                 on_written: Callable[[list[TrainingSample]], None] | None = None, max_overflow: int = 10_000):
        self.spool, self.metrics = spool, metrics
        self._samples_by_kind = metrics.samples.children  # (kind,) → its counter, bound once (metrics.py)
        self._max_overflow = max_overflow
        self.on_written = on_written
        # called (on this thread, or the one that sets max_overflow) when what a refusal reads changed: `problem`,
        # `overloaded` and, while overloaded, the overflow's length (the refusal's message); `serve --workers`
        # tells its workers then (workers/owner.py), instead of polling. Not while the overflow merely grows
        # below its bound: that is every write while the spool is full, one Status per turn to every worker.
        self.on_state_change: Callable[[], None] | None = None
        self._told_state: tuple[str | None, bool, int] = (None, False, 0)
        # SimpleQueue: put/get in C, where Queue runs ~10 Python calls (its Condition) per put and get, 3-4 of
        # each per turn (issue #33 item 2)
        self._queue: queue.SimpleQueue[tuple[str, Any, Any] | None] = queue.SimpleQueue()
        self.overflow: deque[TrainingSample] = deque()
        self._overflow_settled: list[Any] = []  # pending-turn rows to forget once the overflow is committed
        self._overflow_failed = False  # the overflow is held because a write failed, not because of the cap
        self.unsaved: dict[TurnKey, Turn] = {}  # waiting turns whose row (or next state) failed to commit
        self.problem: str | None = None  # why the spool cannot take writes now (None: it can)
        self._next_check = 0.0
        self._eval_lock = threading.Lock()
        self._eval_scores: list[float] = []
        self._records = self._prm_records = None
        if record_dir:
            Path(record_dir).mkdir(parents=True, exist_ok=True)
            self._records = open(Path(record_dir) / "conversations.jsonl", "ab")  # noqa: SIM115
            self._prm_records = open(Path(record_dir) / "judge.jsonl", "ab")  # noqa: SIM115
        self._last_full_log = 0.0
        self._thread = threading.Thread(target=self._run, name="openclaw-writer", daemon=True)
        self._thread.start()

    def __call__(self, turn: Turn, outcome: Outcome) -> None:
        """A turn's final outcome (from the session tracker, in turn order)."""
        self._queue.put(("outcome", turn, outcome))

    def save_turn(self, turn: Turn) -> Future:
        """A turn that waits for its next state or judgement: persisted so a restart resumes it.
        Serialised on this thread, not the event loop; the future is done once it is committed."""
        done: Future = Future()
        self._queue.put(("turn", turn, done))
        return done

    def save_next_state(self, turn: Turn) -> Future:
        """A persisted waiting turn's next state arrived: saved alone (``Spool.save_next_state``), or the
        whole turn where it has no row yet. Queued after the turn's own save, so that row exists."""
        done: Future = Future()
        self._queue.put(("next_state", turn, done))
        return done

    def delete_user(self, user: str) -> Future:
        """Remove `user`'s samples (held in memory or in the spool, leased ones too), waiting turns and record
        lines, on this thread after everything queued before it (the spool keeps one writer). The future's
        result: (counts removed, ids of the removed samples a batch had leased to the trainer)."""
        done: Future = Future()
        self._queue.put(("delete_user", user, done))
        return done

    def retry(self) -> None:
        """Check the spool file and retry what is held in memory now (the writer does so every ``RETRY_S``
        by itself); ``flush`` afterwards waits for the attempt."""
        self._queue.put(("retry", None, None))

    def health(self) -> dict[str, Any]:
        """The spool's part of ``/healthz``: ok while writes commit to the file that was opened."""
        out: dict[str, Any] = {"ok": self.problem is None, "path": str(self.spool.path),
                               "unsaved_turns": len(self.unsaved), "overflow": len(self.overflow)}
        if self.problem is not None:
            out["error"] = self.problem
        return out

    @property
    def overloaded(self) -> bool:
        """The spool is full and the in-memory overflow reached its bound: admit no new turns."""
        return len(self.overflow) >= self._max_overflow

    @property
    def max_overflow(self) -> int:
        return self._max_overflow

    @max_overflow.setter
    def max_overflow(self, value: int) -> None:
        self._max_overflow = value
        self._state_changed()

    def refusal_state(self) -> tuple[str | None, bool, int]:
        """(problem, overloaded, overflow length while overloaded else 0): what a refusal reads
        (``routes.spool_refusal``), coarse enough not to change with every write into the overflow."""
        overloaded = self.overloaded
        return self.problem, overloaded, len(self.overflow) if overloaded else 0

    def _state_changed(self) -> None:
        if self.on_state_change is not None:
            try:
                self.on_state_change()
            except Exception:  # noqa: BLE001 - a listener's bug must not stop the writer
                log.exception("the writer's state-change listener failed")

    def _check_state(self) -> None:
        """Tell ``on_state_change`` when what a refusal depends on changed since it was last told (run on
        this thread after every queued item, where all of it changes)."""
        state = self.refusal_state()
        if state != self._told_state:
            self._told_state = state
            self._state_changed()

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
            if self.unsaved:
                log.error("stopping with %d waiting turns' rows or next states not committed to the spool (%s): "
                          "after a restart those turns wait for a next state again, or are missing", len(self.unsaved),
                          self.problem)
            if self.overflow:
                log.error("stopping with %d samples held in memory, not in the spool (%s): their turns are judged "
                          "again after a restart where their waiting rows were committed", len(self.overflow),
                          self.problem or "spool full")
            self.spool.unlock()
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
        name_os_thread()
        # a control item (or the stop, None) met while gathering a group: next. A list, so that a stop kept
        # here is not mistaken for "nothing kept" (it was, and the thread ran on after close())
        later: list[tuple[str, Any, Any] | None] = []
        nxt = one = None
        while True:
            self._check_state()
            if later:
                item = later.pop()
            else:
                try:
                    item = self._queue.get(timeout=max(0.0, self._next_check - time.monotonic()))
                except queue.Empty:  # idle: check the file; the trainer may have acknowledged a batch since
                    item = ("retry", None, None)
            if item is None:
                return
            if item[0] in _WRITES:
                group = [item]
                while len(group) < MAX_GROUP:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None or nxt[0] not in _WRITES:
                        later.append(nxt)
                        break
                    group.append(nxt)
                if len(group) > 1 and self._commit_group(group):
                    if time.monotonic() >= self._next_check:
                        self._retry()
                    item = group = nxt = None  # type: ignore[assignment]
                    continue
                for one in group[:-1]:
                    self._one(*one)
                item = group[-1]
                group = None  # type: ignore[assignment]
            self._one(*item)
            item = nxt = one = None  # a finished turn must not stay referenced while the thread waits

    def _one(self, op: str, a: Any, b: Any) -> None:
        """One queued item in its own transaction (the path every failure takes)."""
        try:
            if op == "flush":
                a.set()
            elif op == "retry":
                self._retry()
            elif op == "delete_user":
                self._delete_user(a, b)
            elif op in ("turn", "next_state"):
                self._save_turn(op, a, b)
            else:
                self._write(a, b)
        except Exception as e:
            self.metrics.spool_errors.inc()
            log.exception("spool write (%s) for session %s failed", op,
                          log_safe(getattr(a, "session_id", "?")))
            self._failed(e)
        if time.monotonic() >= self._next_check and op != "retry":
            self._retry()

    def _commit_group(self, group: list[tuple[str, Any, Any]]) -> bool:
        """Commit several queued writes in one transaction and settle them after its COMMIT, in order.
        Only while nothing is held in memory (held turns and the overflow take the one-by-one path, which
        owns that state); False, with nothing changed in memory, when the group was not committed."""
        if self.unsaved or self.overflow or self._overflow_settled or self.problem is not None:
            return False
        puts: list[list[TrainingSample]] = []
        try:
            with self.spool.batch():
                for op, turn, b in group:
                    key = (turn.session_key, turn.epoch, turn.index)
                    if op == "outcome":
                        samples = list(b.samples)
                        self.spool.put(samples, settled=key)
                        puts.append(samples)
                    elif op == "turn" or not self.spool.save_next_state(key, codec.dumps_str(turn.next_state)):
                        _save_whole(self.spool, key, turn)
        except Exception as e:
            log.warning("a group commit of %d writes failed (%s): writing each alone", len(group),
                        " ".join(str(e).split())[:200])
            return False
        self.metrics.spool_group_commits.inc()
        self.metrics.spool_group_writes.inc(len(group))
        written = iter(puts)
        for op, turn, b in group:
            if op != "outcome":
                if b is not None:
                    _resolve(b)
                continue
            samples = next(written)
            try:  # committed already: a failing hook or record file must not stop the rest being settled
                self._settled(turn, b, samples)
            except Exception as e:
                self.metrics.spool_errors.inc()
                log.exception("after the spool commit of session %s's turn %d", log_safe(turn.session_id), turn.index)
                self._failed(e)
        return True

    def _settled(self, turn: Turn, outcome: Outcome, samples: list[TrainingSample]) -> None:
        """What a committed outcome does besides the commit (as ``_write`` and ``_persist`` do it alone)."""
        if outcome.eval_score is not None:
            with self._eval_lock:
                self._eval_scores.append(outcome.eval_score)
        for s in samples:
            self._samples_by_kind[(s.kind,)].inc()
        if samples and self.on_written:
            self.on_written(samples)
        if self._records is not None:
            self._record(turn, outcome)

    def _save_turn(self, op: str, turn: Turn, done: Future | None) -> None:
        key = (turn.session_key, turn.epoch, turn.index)
        try:
            if op == "turn" or key in self.unsaved or not self.spool.save_next_state(key, codec.dumps_str(turn.next_state)):
                _save_whole(self.spool, key, turn)
        except Exception as e:  # held and retried: the turn is still in memory
            self.unsaved[key] = turn
            self.metrics.spool_errors.inc()
            self._failed(e, f"turn {turn.index} of session {log_safe(turn.session_id)}")
            if done is not None:
                _resolve(done, e)
            return
        self.unsaved.pop(key, None)
        self._recovered()
        if done is not None:
            _resolve(done)

    def _failed(self, error: BaseException, what: str = "") -> None:
        """A write failed: say why on /healthz, and in the log (each new reason at once, then every 10 s)."""
        problem = f"spool writes fail: {error}" if not isinstance(error, SpoolMissing) else str(error)
        if problem != self.problem or time.monotonic() - self._last_full_log > 10:
            self._last_full_log = time.monotonic()
            log.error("%s%s; %d waiting turns and %d samples held in memory and retried every %gs", problem,
                      f" ({what})" if what else "", len(self.unsaved), len(self.overflow), RETRY_S)
        self.problem = problem
        self.metrics.spool_ok.set(0)

    def _recovered(self) -> None:
        if self.problem is not None and not self.unsaved and not self._overflow_failed:
            log.warning("spool writes succeed again: everything held in memory is committed")
            self.problem = None
            self.metrics.spool_ok.set(1)

    def _retry(self) -> None:
        """Every ``RETRY_S``: is the file still ours (restore a deleted one), then retry what is held."""
        self._next_check = time.monotonic() + RETRY_S
        try:
            self.spool.check_file()
        except SpoolMissing as e:
            self._failed(e)
            if not self.spool.restore_file():
                return  # another file sits at the path: never written over, refused until a restart
        for key, turn in list(self.unsaved.items()):
            self._save_turn("turn", turn, None)
            if key in self.unsaved:
                return  # still failing: the rest would too
        if self.overflow or self._overflow_settled:
            self._persist(list(self.overflow), retrying=len(self.overflow), settled=None)
        if self.problem is not None and not self.unsaved and not self._overflow_failed:
            try:  # nothing held to learn from: does a write of some size commit now?
                self.spool.probe()
            except Exception as e:
                self._failed(e)
            else:
                self._recovered()

    def _write(self, turn: Turn, outcome: Outcome) -> None:
        if outcome.eval_score is not None:
            with self._eval_lock:
                self._eval_scores.append(outcome.eval_score)
        key = (turn.session_key, turn.epoch, turn.index)
        self.unsaved.pop(key, None)  # settled now: its row is deleted with the outcome, not saved again
        self._persist(list(self.overflow) + outcome.samples, retrying=len(self.overflow), settled=key)
        if self._records is not None:
            self._record(turn, outcome)

    def _persist(self, samples: list[TrainingSample], retrying: int, settled: Any) -> None:
        keys = self._overflow_settled + ([settled] if settled is not None else [])
        try:
            self.spool.put(samples, settled=keys)
        except SpoolFull as e:
            # The turns' pending rows stay until their samples are committed: a crash meanwhile re-judges
            # them after the restart instead of losing the samples held in memory.
            self._overflow_settled = keys
            self._overflow_failed = False
            self.overflow = deque(samples)
            self.metrics.overflow.set(len(self.overflow))
            self.metrics.spool_errors.inc()
            if time.monotonic() - self._last_full_log > 10:
                self._last_full_log = time.monotonic()
                log.error("%s: %d samples held in memory until it has room (raise openclaw_spool_max_bytes or "
                          "let training drain it)", e, len(self.overflow))
            return
        except Exception as e:
            self._overflow_settled = keys
            self._overflow_failed = True
            self.overflow = deque(samples)
            self.metrics.overflow.set(len(self.overflow))
            self.metrics.spool_errors.inc()
            self._failed(e, f"{len(samples)} samples")
            return
        if self.overflow:
            log.warning("spool has room again: %d samples held in memory are persisted", retrying)
        self.overflow.clear()
        self._overflow_settled = []
        self._overflow_failed = False
        self.metrics.overflow.set(0)
        if not samples:
            return
        self._recovered()  # a commit that took data: the spool takes writes
        for s in samples[retrying:]:
            self._samples_by_kind[(s.kind,)].inc()
        if self.on_written:
            self.on_written(samples)

    def _delete_user(self, user: str, done: Future) -> None:
        from .users.store import RECORDS, payload_user, rewrite_jsonl

        prefix = user + "\x1f"
        try:
            kept = deque(s for s in self.overflow if _user_of(s) != user)
            held = len(self.overflow) - len(kept)
            self.overflow = kept
            self._overflow_settled = [k for k in self._overflow_settled if not k[0].startswith(prefix)]
            self.metrics.overflow.set(len(self.overflow))
            unsaved = [k for k in self.unsaved if k[0].startswith(prefix)]
            for key in unsaved:
                del self.unsaved[key]
            samples, leased, turns = self.spool.remove_user(lambda payload: payload_user(payload) == user, prefix)
            lines = 0
            if self._records is not None:
                directory = Path(self._records.name).parent
                for f in (self._records, self._prm_records):
                    f.close()  # type: ignore[union-attr]
                try:
                    lines = sum(rewrite_jsonl(directory / name, lambda o: o.get("user") != user) for name in RECORDS)
                finally:
                    self._records = open(directory / RECORDS[0], "ab")  # noqa: SIM115
                    self._prm_records = open(directory / RECORDS[1], "ab")  # noqa: SIM115
        except Exception as e:
            log.exception("deleting user %s from the spool failed", log_safe(user))
            _resolve(done, e)
            return
        self._recovered()
        log.warning("user %s deleted from the spool: %d samples (%d leased to the trainer, %d held in memory), "
                    "%d waiting turns, %d record lines", log_safe(user), samples + held, len(leased), held,
                    turns + len(unsaved), lines)
        counts = {"spool_samples": samples + held, "leased_samples": len(leased), "waiting_turns": turns + len(unsaved),
                  "record_lines": lines}
        try:
            done.set_result((counts, leased))
        except InvalidStateError:
            pass

    def _record(self, turn: Turn, outcome: Outcome) -> None:
        gen = turn.generation
        line: dict[str, Any] = {
            "session_id": turn.session_id, "user": turn.session_key.partition("\x1f")[0], "turn": turn.index,
            "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"), "messages": turn.messages, "prompt_text": turn.prompt_text,
            "response_text": gen.text if gen else None, "next_state": turn.next_state,
            "samples": [s.sample_id for s in outcome.samples], "dropped": outcome.drop.value if outcome.drop else None,
        }
        self._records.write(_record_line(line))  # type: ignore[union-attr]
        self._records.flush()  # type: ignore[union-attr]
        if outcome.record:
            judge_line = {"session_id": turn.session_id, "user": turn.session_key.partition("\x1f")[0],
                          "turn": turn.index, **outcome.record}
            self._prm_records.write(_record_line(judge_line))  # type: ignore[union-attr]
            self._prm_records.flush()  # type: ignore[union-attr]


def _user_of(sample: TrainingSample) -> str:
    return str(sample.metadata.get("user") or str(sample.metadata.get("session_key", "")).partition("\x1f")[0])


def _record_line(obj: dict[str, Any]) -> bytes:
    """One JSONL record line, UTF-8 (orjson on the writer thread: a record holds the whole conversation)."""
    return codec.dumps(obj) + b"\n"


def _save_whole(spool: Spool, key: TurnKey, turn: Turn) -> None:
    """A waiting turn's whole record, its token arrays apart as bytes (``Spool.save_turn``)."""
    spool.save_turn(key, codec.dumps_str(turn.to_record(arrays=False)), turn.array_bytes())
