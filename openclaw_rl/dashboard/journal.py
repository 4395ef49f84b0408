"""The turn-outcome journal: what became of every finished turn, and which training step took it.

Stage: sessions → spool → **journal** (a side record, read by the dashboard). The spool forgets a sample
once its batch is acknowledged and the Prometheus counters keep no per-turn detail, so "why was this turn
dropped" and "which step trained it" need a record of their own. It is one append-only JSONL file in the
spool's directory (``journal.jsonl``), so a stopped run's dashboard (``openclaw-rl dashboard --spool-dir``)
finds it next to the samples. Three kinds of line:

* ``turn``: a turn's final outcome (the reply, its next state, the judge record with votes and hint, the
  drop reason, or the samples it became with their reward and the teacher's per-token advantage);
* ``batch``: the sample ids a trainer leased;
* ``trained``: a batch acknowledged after trainer step N.

The hot path only enqueues (``turn`` is called on the proxy's event loop); a thread of its own
serialises and appends. It wakes for the first line of a burst, lets the burst gather for ``GATHER_S`` (the
lines queued meanwhile do not wake it: no system call for the event loop's ``put``), and writes the burst's
lines in one write (or one per ``WRITE_BYTES``): under load one wake-up and one write per ~50 ms instead of a
wake-up, a write and a ``tell`` per turn. A reader sees a line ~50 ms after its turn ended, whole lines only. The file is bounded: past ``max_bytes`` it is renamed to ``journal.1.jsonl``
(the previous one is replaced), so at most twice ``max_bytes`` are kept. A failed write is logged and
counted, never raised into the proxy: the journal is an observation, not the training data.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from .. import codec
from ..threadname import name_os_thread

log = logging.getLogger(__name__)

JOURNAL = "journal.jsonl"
ROTATED = "journal.1.jsonl"
GATHER_S = 0.05  # a burst's first line waits this long for the rest of the burst before they are written
WRITE_BYTES = 256 * 1024  # ...or until this many bytes wait
MAX_ADVANTAGE_TOKENS = 4096  # per-token advantages kept per sample (a long reply keeps its first 4096)


def namespace_of(session_key: str) -> str:
    """The API-key namespace of a session key ("<namespace>\\x1f<session id>")."""
    head, sep, _ = session_key.partition("\x1f")
    return head if sep else ""


def turn_line(turn: Any, outcome: Any) -> dict[str, Any]:
    """The journal line of a finished turn (run on the journal's thread, never on the event loop)."""
    gen = turn.generation
    samples = []
    for s in outcome.samples:
        entry: dict[str, Any] = {"id": s.sample_id, "kind": s.kind, "reward": s.reward,
                                 "ids": s.response_ids[:MAX_ADVANTAGE_TOKENS]}
        if s.teacher_log_probs is not None:
            entry["advantage"] = [round(t - r, 4) for t, r in zip(s.teacher_log_probs[:MAX_ADVANTAGE_TOKENS],
                                                                  s.rollout_log_probs)]
        if 0 in s.loss_mask:  # a C scan (the generator ran once per token on the journal's thread)
            entry["masked"] = [i for i, m in enumerate(s.loss_mask[:MAX_ADVANTAGE_TOKENS]) if m == 0]
        samples.append(entry)
    line: dict[str, Any] = {
        "ev": "turn", "t": time.time(), "ns": namespace_of(turn.session_key), "session": turn.session_id,
        "epoch": turn.epoch, "turn": turn.index, "created": turn.created,
        "reply": gen.text if gen else None, "finish": gen.finish_reason if gen else None,
        "weight_version": gen.weight_version if gen else None, "response_tokens": len(gen.response_ids) if gen else 0,
        "next_state": turn.next_state, "feedback": turn.feedback,
        "drop": outcome.drop.value if outcome.drop else None, "detail": outcome.drop_detail or None,
        "judge": outcome.record or None, "samples": samples,
    }
    if turn.messages:
        last_user = next((m for m in reversed(turn.messages) if m.get("role") == "user"), None)
        if last_user is not None:
            line["prompt"] = last_user.get("content")
    return line


class TurnJournal:
    """Appends journal lines on its own thread; ``close`` writes what is queued and stops it."""

    def __init__(self, directory: str | Path, max_bytes: int = 64 * 1024**2):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / JOURNAL
        self.max_bytes = max_bytes
        self.errors = 0
        self._file: Any = None
        self._size = 0  # the open file's size: counted, not asked (a tell per line)
        self._waiting: list[bytes] = []  # whole lines not yet written
        self._waiting_bytes = 0
        self.drops: Counter[str] = Counter()  # dropped turns by reason since start (the console's counts)
        self._queue: queue.SimpleQueue[tuple[str, Any, Any] | None] = queue.SimpleQueue()  # C: no Python lock
        self._thread = threading.Thread(target=self._run, name="openclaw-journal", daemon=True)
        self._thread.start()

    # --- producers (cheap: enqueue only) -----------------------------------------------------------------

    def turn(self, turn: Any, outcome: Any) -> None:
        if outcome.drop is not None:
            self.drops[outcome.drop.value] += 1
        self._queue.put(("turn", turn, outcome))

    def tee(self, sink: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        """A session-tracker sink that journals each outcome, then hands it to ``sink`` (the spool writer)."""
        def both(turn: Any, outcome: Any) -> None:
            self.turn(turn, outcome)
            sink(turn, outcome)
        return both

    def batch(self, batch_id: str, sample_ids: list[str]) -> None:
        self._queue.put(("line", {"ev": "batch", "t": time.time(), "batch": batch_id, "samples": sample_ids}, None))

    def trained(self, batch_id: str, step: int | None) -> None:
        self._queue.put(("line", {"ev": "trained", "t": time.time(), "batch": batch_id, "step": step}, None))

    def delete_user(self, user: str) -> Future:
        """Rewrite both files without `user`'s turn lines, on this thread after every line queued before it;
        the future's result is the number of lines removed (``batch`` lines name sample ids only: kept)."""
        done: Future = Future()
        self._queue.put(("delete_user", user, done))
        return done

    def flush(self, timeout: float = 10.0) -> None:
        if not self._thread.is_alive():
            return
        done = threading.Event()
        self._queue.put(("flush", done, None))
        done.wait(timeout)

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(10)

    # --- thread ------------------------------------------------------------------------------------------

    def _run(self) -> None:
        name_os_thread()
        while True:
            item: Any = self._queue.get()  # idle: asleep until the first item of a burst
            if item is not None and item[0] in ("turn", "line"):
                time.sleep(GATHER_S)  # the rest of the burst queues up without waking this thread
            while True:
                if item is None:
                    self._write_waiting()
                    if self._file is not None:
                        self._file.close()
                    return
                self._handle(*item)
                item = None  # a finished turn (its prompt ids, its messages) must not outlive its line here
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            self._write_waiting()

    def _handle(self, op: str, a: Any, b: Any) -> None:
        if op == "flush":
            self._write_waiting()
            a.set()
            return
        if op == "delete_user":
            self._write_waiting()
            from openclaw_rl.users.store import rewrite_jsonl

            try:
                if self._file is not None:
                    self._file.close()
                    self._file = None  # reopened by the next line
                b.set_result(sum(rewrite_jsonl(self.dir / name, lambda o: o.get("ns") != a)
                                 for name in (ROTATED, JOURNAL)))
            except Exception as e:
                self.errors += 1
                log.exception("journal: deleting a user's lines failed")
                b.set_exception(e)
            return
        try:
            self._append(turn_line(a, b) if op == "turn" else a)
        except Exception:
            self.errors += 1
            log.exception("journal write failed (the dashboard misses this %s; training is unaffected)", op)

    def _append(self, line: dict[str, Any]) -> None:
        data = codec.dumps(line) + b"\n"
        if self._file is None:
            self._open()
        if self._size + self._waiting_bytes + len(data) > self.max_bytes and self._size + self._waiting_bytes:
            self._write_waiting()
            if self._file is not None:
                self._file.close()
                self._file = None  # a failed rename below leaves no closed file to write to: the next line reopens
            self.path.replace(self.dir / ROTATED)
            self._open()
        self._waiting.append(data)
        self._waiting_bytes += len(data)
        if self._waiting_bytes >= WRITE_BYTES:
            self._write_waiting()

    def _open(self) -> None:
        # kept open: one open per line cost 3x the write; unbuffered, so that each write is whole lines
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115
        self._size = self._file.seek(0, 2)

    def _write_waiting(self) -> None:
        """The waiting lines in one write (readers, the dashboard or another process, see whole lines)."""
        if not self._waiting:
            return
        data = b"".join(self._waiting)
        self._waiting.clear()
        self._waiting_bytes = 0
        try:
            if self._file is None:
                self._open()
            view = memoryview(data)
            while view:  # a regular file takes it in one write; a short one goes on where it stopped
                view = view[self._file.write(view):]
            self._size += len(data)
        except Exception:
            self.errors += 1
            log.exception("journal write failed (the dashboard misses %d bytes of lines; training is unaffected)",
                          len(data))


def read_journal(directory: str | Path) -> Iterator[dict[str, Any]]:
    """Every journal line, oldest first (the rotated file, then the current one); a torn last line is skipped."""
    for name in (ROTATED, JOURNAL):
        path = Path(directory) / name
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            continue
        for text in raw.splitlines():
            try:
                yield codec.loads(text)
            except ValueError:
                continue
