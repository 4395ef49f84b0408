"""The durable sample spool: finished samples wait here until a training batch takes them.

Stage: sessions → **spool** → rollout. SQLite in WAL mode, because a user's turns cannot be regenerated
like a dataset prompt: a sample is committed (``synchronous=FULL``: fsynced, so it survives a power loss)
before it counts as submitted. ``sync="normal"`` (opt-in, ``openclaw_spool_sync``) commits to the WAL
without an fsync: a sample survives a crash of the proxy process (the OS keeps the write), not a power
loss or kernel crash, which may roll back the last commits (the file stays consistent); measured here:
0.46-0.51 vs 0.15 ms of CPU and 4.5-8 vs 0.1 ms of wall time (p50) per commit, two commits per turn.
A sample leaves the spool only when the batch holding it is acknowledged. ``lease`` marks samples with
a batch id, ``ack`` deletes them, ``release_leases`` (run at start-up) hands unacknowledged ones back,
oldest first, so a crash between drain and training re-delivers instead of losing data. One SQLite file
also lets ``openclaw-rl samples`` read a running proxy's spool from another process.

One writer per spool: the proxy opens it ``exclusive`` (an ``flock`` on ``samples.sqlite3.lock`` beside the
database), so a second proxy on the same directory fails at start with a clear error instead of
restoring the same waiting turns twice; readers (``openclaw-rl samples``, tests) open it without the lock.
The writer's commits check that the file is still the one opened (same device and inode): a spool
deleted or replaced under a running proxy would otherwise take commits into an unlinked file that
nothing can read back. ``SpoolMissing`` refuses them; ``restore_file`` writes the open database back to
its path when the file was deleted (never over a file someone put there).

Group commit: ``batch()`` runs several writes (``put``, ``save_turn``, ``save_next_state``) in one
transaction, one COMMIT and so one fsync, which the writer thread uses for everything queued at once
(``writer.py``); ``commits`` counts the write transactions committed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from .errors import CommandError
from .samples import TrainingSample
from .spool_schema import ARRAY_COLUMNS, INSERT_SAMPLE, SAMPLE_BYTES, SCHEMA, migrate
from .turns import with_array_bytes

log = logging.getLogger(__name__)

TurnKey = tuple[str, str, int]  # (session_key, epoch, turn index)
_T = TypeVar("_T")


class SpoolFull(RuntimeError):
    """The spool's live samples reached the configured cap."""


class SpoolCorrupt(ValueError):
    """The spool file fails SQLite's integrity check (or is not a SQLite database)."""


class SpoolUnwritable(ValueError):
    """The spool cannot be opened for writing at start-up: its disk is full or failing, or it is read-only."""


# SQLite's primary result codes that mean "cannot write here", not "the file is damaged": SQLITE_READONLY,
# SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN (Python >= 3.11 exposes them; older ones are matched by text)
_CANNOT_WRITE_CODES = {8, 10, 13, 14}
_CANNOT_WRITE_TEXT = ("disk is full", "disk i/o error", "unable to open", "readonly")


def _cannot_write(error: sqlite3.DatabaseError) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _CANNOT_WRITE_CODES
    return any(text in str(error).lower() for text in _CANNOT_WRITE_TEXT)


class SpoolLocked(CommandError):
    """Another process (or another proxy in this one) already writes this spool."""


class SpoolMissing(RuntimeError):
    """The spool file was deleted or replaced while it was open: commits would land in a file nobody reads."""


LOCK_NAME = "samples.sqlite3.lock"


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _fd_id(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


class Spool:
    def __init__(self, directory: str | Path | None = None, max_bytes: int = 4 * 1024**3, *, sync: str = "full",
                 exclusive: bool = False):
        if sync not in ("full", "normal"):
            raise ValueError(f"spool sync must be 'full' or 'normal', not {sync!r}")
        if not directory:
            directory = tempfile.mkdtemp(prefix="openclaw-spool-")
            log.warning("no spool dir configured: samples live in %s and are lost when it is removed", directory)
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "samples.sqlite3"
        self.max_bytes, self.sync = max_bytes, sync
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._lock_file: int | None = None
        self._batch_thread: int | None = None  # the thread inside batch(): its writes join that transaction
        self.commits = 0  # write transactions committed by this Spool (group commit folds several into one)
        if exclusive:
            self.lock_for_writing()
        try:
            self._db = self._connect()
            problems = [r[0] for r in self._db.execute("PRAGMA quick_check").fetchall()]
            if problems != ["ok"]:
                raise sqlite3.DatabaseError("; ".join(problems[:3]))
            self._db.executescript(SCHEMA)
            self._migrate()
            self._db.execute("INSERT OR IGNORE INTO spool_stats(name, value) SELECT 'live_bytes', "
                             f"COALESCE(SUM({SAMPLE_BYTES}), 0) FROM samples")
        except sqlite3.DatabaseError as e:
            self.unlock()
            detail = " ".join(str(e).split())  # one line, however many problems SQLite lists
            if _cannot_write(e):  # a full disk is not a corrupt file: nothing to move aside
                raise SpoolUnwritable(
                    f"spool {self.path} cannot be written ({detail[:300]}): free space on its filesystem, or "
                    f"choose another spool dir (--spool-dir / openclaw_spool_dir)") from None
            raise SpoolCorrupt(
                f"spool {self.path} is corrupt ({detail[:300]}). Stop every process using it, move {self.dir} aside (keep "
                f"it: `sqlite3 {self.path} .recover` may rescue its samples) and start with an empty spool dir"
            ) from None
        self._file_id = _file_id(self.path)

    def _migrate(self) -> None:
        """Bring a spool written by an earlier version to this schema (``spool_schema.migrate``)."""
        migrate(self._db)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={self.sync.upper()}")
        return db

    # --- one writer: the lock file ------------------------------------------------------------------

    def lock_for_writing(self) -> None:
        """An exclusive ``flock`` on the lock file, held while this Spool writes. Released by the kernel
        when the process dies (a SIGKILL leaves no stale lock); another open file of this process conflicts
        too, so two proxies in one process cannot share a spool either."""
        path = self.dir / LOCK_NAME
        if self._lock_file is not None and _fd_id(self._lock_file) == _file_id(path):
            return  # held already
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            os.close(fd)
            raise SpoolLocked(
                f"spool {self.dir} is in use by another openclaw-rl proxy ({f'pid {holder}' if holder else 'a process'} "
                f"holds {path}): one proxy per spool. Stop it, or give this one its own openclaw_spool_dir "
                "(`openclaw-rl samples` reads a running proxy's spool without this lock)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        if self._lock_file is not None:
            os.close(self._lock_file)
        self._lock_file = fd

    def unlock(self) -> None:
        """Stop being the spool's writer (the proxy has shut down): another proxy may now open it."""
        if self._lock_file is not None:
            os.close(self._lock_file)
            self._lock_file = None

    # --- the file is still ours ---------------------------------------------------------------------

    def check_file(self) -> None:
        """Raise SpoolMissing unless the database path still names the file this Spool opened."""
        now = _file_id(self.path)
        if now != self._file_id:
            what = "deleted" if now is None else "replaced by another file"
            raise SpoolMissing(f"spool file {self.path} was {what} while the proxy had it open: commits cannot be "
                               "read back from it")

    def restore_file(self) -> bool:
        """The database file was deleted while open: write the open database (everything committed, read
        through this connection's still-open files) back to its path and continue there. False, touching
        nothing, when another file now sits at the path."""
        with self._lock:
            if _file_id(self.path) == self._file_id:
                return True
            if self.path.exists():
                return False
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".restoring")
            tmp.unlink(missing_ok=True)
            copy = sqlite3.connect(tmp)
            try:
                self._db.backup(copy)
            finally:
                copy.close()
            os.rename(tmp, self.path)
            self._db.close()
            self._db = self._connect()
            self._file_id = _file_id(self.path)
            if self._lock_file is not None:
                self.lock_for_writing()  # again where the lock file went with it
        log.error("spool file %s was deleted while open: rewrote it from the open database", self.path)
        return True

    @contextlib.contextmanager
    def _transaction(self, check: bool = False) -> Iterator[None]:
        """One write transaction; the caller holds the lock. ``check``: the file must be the one opened before
        BEGIN and still after COMMIT (``check_file``: one ``stat`` each), else SpoolMissing. Both are needed: the
        one after, so a write reported done is in the readable file; the one before, because this connection's
        WAL is opened by path too, and a commit after the database file was replaced would append frames for
        the old database to the WAL that the new file is read with (the replaced-file test sees them).

        Rolls back on any exception, a Ctrl-C included, but only while the transaction is still open:
        a KeyboardInterrupt can land just after COMMIT has returned from SQLite (the batch is then
        acknowledged for good), and a ROLLBACK there would fail and hide the interrupt. BEGIN is inside the
        try for the same reason: one interrupted just after it would otherwise leave the transaction open.
        """
        if self._db.in_transaction:  # left open by an interrupt between contextlib's code and the with body
            log.warning("rolling back a spool transaction that an interrupt left open")
            self._db.execute("ROLLBACK")
        if check:
            self.check_file()
        try:
            self._db.execute("BEGIN IMMEDIATE")
            yield
            self._db.execute("COMMIT")
            self.commits += 1
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        if check:  # deleted between the check and the commit: the commit went nowhere readable
            self.check_file()

    # --- writing ------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """One transaction for the writes made inside it by this thread (group commit): all of them commit
        at its end, in one COMMIT (one fsync), or none does when anything inside raises, the COMMIT included."""
        with self._arrived:
            with self._transaction(check=True):
                self._batch_thread = threading.get_ident()
                try:
                    yield
                finally:
                    self._batch_thread = None
            self._arrived.notify_all()

    def _apply(self, write: Callable[..., _T], *args: Any) -> _T:
        """Run ``write(*args)`` in the enclosing ``batch()`` when this thread is inside one, else in a transaction
        of its own (no context manager in the batch's path: several writes per turn go through here)."""
        if self._batch_thread == threading.get_ident():
            return write(*args)
        with self._arrived:
            with self._transaction(check=True):
                out = write(*args)
            self._arrived.notify_all()
        return out

    def live_bytes(self) -> int:
        """Bytes of the samples not yet acknowledged by the trainer (a sample's JSON and its arrays' blobs,
        ``SAMPLE_BYTES``): what the cap limits. Kept in the
        database next to the samples (same transactions), so it is exact across processes and restarts;
        the file itself never shrinks, which is why its size is not the measure."""
        with self._lock:
            return self._db.execute("SELECT value FROM spool_stats WHERE name='live_bytes'").fetchone()[0]

    def put(self, samples: list[TrainingSample], settled: TurnKey | list[TurnKey] | None = None) -> None:
        """Persist samples atomically (all or none) and, in the same transaction, forget the pending
        turn(s) they came from (their next states go with them: a trigger), so a crash can neither lose nor
        duplicate them. Raises SpoolFull when the live samples already fill the cap (one batch may overshoot it)."""
        keys = [] if settled is None else settled if isinstance(settled, list) else [settled]
        if not samples and not keys:
            return
        rows = []
        for s in samples:
            s.sample_id = s.sample_id or uuid.uuid4().hex
            payload, blobs = s.to_row()
            rows.append((s.sample_id, s.session_id, s.turn, s.kind, time.time(), payload, *blobs))
        self._apply(self._put, rows, keys)

    def _execute(self, sql: str, params: tuple[Any, ...]) -> sqlite3.Cursor:
        return self._db.execute(sql, params)  # the connection of now (restore_file opens another)

    def _put(self, rows: list[tuple[Any, ...]], keys: list[TurnKey]) -> None:
        db = self._db
        if rows:
            live = db.execute("SELECT value FROM spool_stats WHERE name='live_bytes'").fetchone()[0]
            if live >= self.max_bytes:
                raise SpoolFull(f"spool {self.path} holds {live} bytes of unacknowledged samples, at its cap of "
                                f"{self.max_bytes} bytes")
            added = 0
            for row in rows:  # one by one: a sample already there (re-judged after a crash) adds nothing
                if db.execute(INSERT_SAMPLE, row).rowcount:
                    payload = row[5]  # its UTF-8 length, as LENGTH(CAST(payload AS BLOB)) counts it, and its blobs
                    added += len(payload) if payload.isascii() else len(payload.encode())
                    added += sum(len(blob) for blob in row[6:] if blob is not None)
            if added:
                db.execute("UPDATE spool_stats SET value = value + ? WHERE name='live_bytes'", (added,))
        if keys:
            db.executemany("DELETE FROM pending_turns WHERE session_key=? AND epoch=? AND turn=?", keys)

    def save_turn(self, key: TurnKey, payload: str,
                  arrays: tuple[bytes | None, bytes | None, bytes | None] = (None, None, None)) -> None:
        """Persist (or update) a turn that waits for its next state or its judgement: its record (JSON) and,
        apart, its token arrays' bytes (``Turn.array_bytes``: prompt ids, response ids, log-probs), which
        ``pending_turns`` puts back in the record. A next state saved apart before goes (a trigger)."""
        self._apply(self._execute, "INSERT OR REPLACE INTO pending_turns(session_key, epoch, turn, payload, "
                    "prompt_ids, response_ids, logprobs) VALUES (?,?,?,?,?,?,?)", (*key, payload, *arrays))

    def save_next_state(self, key: TurnKey, next_state: str) -> bool:
        """Add a persisted waiting turn's next state (JSON) in a row of its own, without rewriting its
        record, which holds the prompt's ids and, with records on, the conversation twice (~125 KB at ~8K
        tokens: ~1 ms of CPU to rewrite). False when the turn has no record, so the caller saves it whole."""
        return bool(self._apply(self._execute, "INSERT OR REPLACE INTO pending_next_states(session_key, epoch, "
                                "turn, next_state) SELECT session_key, epoch, turn, ? FROM pending_turns "
                                "WHERE session_key=? AND epoch=? AND turn=?", (next_state, *key)).rowcount)

    def probe(self, nbytes: int = 64 * 1024) -> None:
        """Commit ``nbytes`` and delete them again (one transaction): raises what a real write of that size
        would (SQLITE_FULL on a full disk), so the writer knows when the spool takes writes again."""
        with self._lock, self._transaction(check=True):
            self._db.execute("INSERT INTO write_probe(data) VALUES (zeroblob(?))", (nbytes,))
            self._db.execute("DELETE FROM write_probe")

    def pending_turns(self) -> list[str]:
        """Each waiting turn's record (JSON), with a next state saved apart put back in it."""
        with self._lock:
            rows = self._db.execute(
                "SELECT t.payload, n.next_state, t.prompt_ids, t.response_ids, t.logprobs FROM pending_turns t "
                "LEFT JOIN pending_next_states n ON n.session_key = t.session_key AND n.epoch = t.epoch "
                "AND n.turn = t.turn ORDER BY t.session_key, t.epoch, t.turn").fetchall()
        out = []
        for payload, next_state, *arrays in rows:
            if next_state is None and arrays == [None, None, None]:
                out.append(payload)
                continue
            record = json.loads(payload)
            if next_state is not None:
                record["next_state"] = json.loads(next_state)
            out.append(json.dumps(with_array_bytes(record, *arrays)))
        return out

    # --- delivery -----------------------------------------------------------------------------------

    def ready_count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM samples WHERE batch_id IS NULL").fetchone()[0]

    def depth(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM samples").fetchone()[0]

    def wait_ready(self, n: int, timeout: float) -> int:
        """Block until at least ``n`` unleased samples exist or ``timeout`` passes; return the count."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                count = self._db.execute("SELECT COUNT(*) FROM samples WHERE batch_id IS NULL").fetchone()[0]
                left = deadline - time.monotonic()
                if count >= n or left <= 0:
                    return count
                self._arrived.wait(min(left, 1.0))

    def lease(self, n: int, batch_id: str | None = None) -> tuple[str, list[TrainingSample]]:
        """Mark the ``n`` oldest unleased samples as belonging to a batch and return them."""
        batch_id = batch_id or uuid.uuid4().hex
        with self._lock, self._transaction():
            rows = self._db.execute(f"SELECT seq, payload, {ARRAY_COLUMNS} FROM samples WHERE batch_id IS NULL "
                                    "ORDER BY seq LIMIT ?", (n,)).fetchall()
            self._db.executemany("UPDATE samples SET batch_id=? WHERE seq=?", [(batch_id, row[0]) for row in rows])
        samples = []
        for seq, payload, *blobs in rows:
            sample = TrainingSample.from_row(payload, blobs)
            sample.index = seq
            samples.append(sample)
        return batch_id, samples

    def ack(self, batch_id: str) -> int:
        """The trainer has the batch: its samples leave the spool for good (and free their room)."""
        with self._lock, self._transaction():
            freed = self._db.execute(f"SELECT COALESCE(SUM({SAMPLE_BYTES}), 0) FROM samples WHERE batch_id=?",
                                     (batch_id,)).fetchone()[0]
            n = self._db.execute("DELETE FROM samples WHERE batch_id=?", (batch_id,)).rowcount
            self._db.execute("UPDATE spool_stats SET value = MAX(0, value - ?) WHERE name='live_bytes'", (freed,))
        return n

    def release_leases(self) -> int:
        """Hand back samples leased by a batch that was never acknowledged (start-up recovery)."""
        with self._arrived:
            n = self._db.execute("UPDATE samples SET batch_id=NULL WHERE batch_id IS NOT NULL").rowcount
            self._arrived.notify_all()
        if n:
            log.warning("re-delivering %d samples from a batch that was never acknowledged", n)
        return n

    def remove_user(self, owns: Callable[[str], bool], session_prefix: str) -> tuple[int, list[str], int]:
        """Delete, in one transaction, the samples whose payload `owns` (leased or not) and the waiting turns
        and next states of session keys starting with `session_prefix` (deleting a user, ``users/``).
        ``secure_delete`` overwrites the freed cells, and a TRUNCATE checkpoint then moves the pages into
        the database and empties the WAL (a reader still holding an old snapshot can keep it from
        finishing: it is retried at the next one). Returns (samples removed, the ids of those a batch had
        leased to the trainer, waiting turns removed)."""
        with self._arrived:
            self._db.execute("PRAGMA secure_delete=ON")
            try:
                with self._transaction(check=True):
                    rows = self._db.execute("SELECT seq, sample_id, batch_id, payload FROM samples").fetchall()
                    doomed = [(seq, sid, batch) for seq, sid, batch, payload in rows if owns(payload)]
                    self._db.executemany("DELETE FROM samples WHERE seq = ?", [(seq,) for seq, _, _ in doomed])
                    n = len(session_prefix)
                    turns = self._db.execute("DELETE FROM pending_turns WHERE substr(session_key, 1, ?) = ?",
                                             (n, session_prefix)).rowcount
                    self._db.execute("DELETE FROM pending_next_states WHERE substr(session_key, 1, ?) = ?",
                                     (n, session_prefix))
                    self._db.execute(f"UPDATE spool_stats SET value = (SELECT COALESCE(SUM({SAMPLE_BYTES}), 0) "
                                     "FROM samples) WHERE name = 'live_bytes'")
            finally:
                self._db.execute("PRAGMA secure_delete=OFF")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return len(doomed), [sid for _, sid, batch in doomed if batch is not None], turns

    def iter_samples(self) -> Iterator[TrainingSample]:
        with self._lock:
            rows = self._db.execute(f"SELECT seq, payload, {ARRAY_COLUMNS} FROM samples ORDER BY seq").fetchall()
        for seq, payload, *blobs in rows:
            sample = TrainingSample.from_row(payload, blobs)
            sample.index = seq
            yield sample

    def close(self) -> None:
        with self._lock:
            self._db.close()
        self.unlock()
