"""What a deployment holds about each user, and deleting all of it: ``openclaw-rl users``.

Stage: spool / journal / records / experience / adapter checkpoints → **per-user view**. A user's data
lives in five places, all keyed by the user (the session key's namespace, ``users/identity.py``):

* the spool (``samples.sqlite3``): samples not yet trained (``metadata.user``) and turns waiting for their
  next state (``session_key`` = ``<user>\\x1f<session>``);
* the turn journal (``journal.jsonl`` and its rotated file): every finished turn, ``ns`` = the user;
* the conversation and judge records (``--record-dir``: ``conversations.jsonl``, ``judge.jsonl``, ``user``);
* OEL's experience (``experience.sqlite``, keyed by the user);
* the user's adapter checkpoints (``<ckpt dir>/users/<adapter name>/``, ``user.json`` names the user).

``scan`` counts them per user; ``delete_user`` removes every one of them, then scans again so the caller can
show that nothing remains. It needs the spool's writer lock: the proxy (or ``local``) must be stopped, or
the deletion would race turns being written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openclaw_rl.users.adapters import adapter_name

JOURNALS = ("journal.jsonl", "journal.1.jsonl")
RECORDS = ("conversations.jsonl", "judge.jsonl")


@dataclass
class UserSummary:
    user: str
    samples_waiting: int = 0  # in the spool, not trained yet
    turns_waiting: int = 0  # waiting for their next state
    turns: int = 0  # finished turns in the journal
    samples: int = 0  # samples those turns became
    trained_samples: int = 0  # ... that a training step took
    last_activity: float | None = None  # unix time of the newest journal line
    first_activity: float | None = None  # ... of the oldest (after a deletion: when the user came back)
    adapter: str = ""  # the adapter's name (a hash of the user)
    adapter_version: str | None = None  # the newest adapter checkpoint (step-N of the user's trainer)
    record_lines: int = 0
    experience: bool = False
    paths: list[str] = field(default_factory=list)  # adapter checkpoint directories

    @property
    def total(self) -> int:
        """Everything counted: 0 means nothing of this user remains."""
        return (self.samples_waiting + self.turns_waiting + self.turns + self.record_lines + int(self.experience)
                + len(self.paths))


@dataclass(frozen=True)
class RunDirs:
    spool_dir: Path
    record_dir: Path | None = None
    ckpt_dir: Path | None = None

    @classmethod
    def of_local_run(cls, out_dir: str | Path) -> RunDirs:
        """The layout of ``openclaw-rl local --out-dir``: spool/, records/, checkpoints/."""
        out = Path(out_dir)
        return cls(out / "spool", out / "records", out / "checkpoints")


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                yield obj


def scan(dirs: RunDirs) -> dict[str, UserSummary]:
    """Every user the run holds anything of, with counts."""
    users: dict[str, UserSummary] = {}

    def get(user: str) -> UserSummary:
        return users.setdefault(user, UserSummary(user, adapter=adapter_name(user)))

    batches: dict[str, list[str]] = {}
    trained: set[str] = set()
    for name in reversed(JOURNALS):  # the rotated file holds the older lines
        for line in _jsonl(dirs.spool_dir / name):
            if line.get("ev") == "batch":
                batches[str(line.get("batch"))] = list(line.get("samples") or [])
            elif line.get("ev") == "trained":
                trained.update(batches.get(str(line.get("batch")), []))
    for name in JOURNALS:
        for line in _jsonl(dirs.spool_dir / name):
            if line.get("ev") != "turn" or "ns" not in line:
                continue
            u = get(str(line["ns"]))
            u.turns += 1
            ids = [s.get("id") for s in line.get("samples") or []]
            u.samples += len(ids)
            u.trained_samples += sum(i in trained for i in ids)
            t = line.get("t")
            if isinstance(t, (int, float)):
                u.last_activity = max(u.last_activity or 0.0, float(t))
                u.first_activity = float(t) if u.first_activity is None else min(u.first_activity, float(t))
    db = dirs.spool_dir / "samples.sqlite3"
    if db.exists():
        import sqlite3

        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            for (payload,) in conn.execute("SELECT payload FROM samples"):
                get(payload_user(payload)).samples_waiting += 1
            for (key,) in conn.execute("SELECT session_key FROM pending_turns"):
                get(key.partition("\x1f")[0]).turns_waiting += 1
        finally:
            conn.close()
    if dirs.record_dir is not None:
        for name in RECORDS:
            for line in _jsonl(dirs.record_dir / name):
                if "user" in line:
                    get(str(line["user"])).record_lines += 1
    experience = dirs.spool_dir / "experience.sqlite"
    if experience.exists():
        from openclaw_oel.store import ExperienceStore

        store = ExperienceStore(experience)
        try:
            for entry in store.entries():
                get(entry.key).experience = True
        finally:
            store.close()
    if dirs.ckpt_dir is not None and (dirs.ckpt_dir / "users").is_dir():
        for adapter_dir in sorted((dirs.ckpt_dir / "users").iterdir()):
            steps = sorted(p for p in adapter_dir.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))
            owner = next((json.loads((p / "user.json").read_text()).get("user") for p in reversed(steps)
                          if (p / "user.json").exists()), None)
            if owner is None:
                continue
            u = get(str(owner))
            u.paths.append(str(adapter_dir))
            u.adapter_version = f"step-{int(steps[-1].name.split('-')[1])}" if steps else None
    return users


def payload_user(payload: str) -> str:
    try:
        meta = json.loads(payload).get("metadata") or {}
    except ValueError:
        return ""
    return str(meta.get("user") or str(meta.get("session_key", "")).partition("\x1f")[0])


def rewrite_jsonl(path: Path, keep: Callable[[dict[str, Any]], bool]) -> int:
    """Rewrite `path` without the lines `keep` refuses (atomically: a temporary file renamed over it)."""
    if not path.exists():
        return 0
    removed = 0
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out, open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    obj = json.loads(line)
                except ValueError:
                    obj = None
                if isinstance(obj, dict) and not keep(obj):
                    removed += 1
                    continue
                out.write(line)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return removed


def delete_user(dirs: RunDirs, user: str) -> tuple[dict[str, int], UserSummary]:
    """Remove everything of `user`; returns what was removed, and a fresh scan's summary (all zero)."""
    from openclaw_rl.spool import Spool

    removed: dict[str, int] = {}
    spool = Spool(dirs.spool_dir, exclusive=True)  # SpoolLocked while a proxy runs on it
    try:
        samples, _, turns = spool.remove_user(lambda payload: payload_user(payload) == user, user + "\x1f")
        spool._db.execute("VACUUM")  # stopped: the whole file is rewritten, so no free page keeps old bytes
        removed["spool_samples"], removed["waiting_turns"] = samples, turns
        removed["journal_lines"] = sum(rewrite_jsonl(dirs.spool_dir / name, lambda o: o.get("ns") != user)
                                       for name in JOURNALS)
        if dirs.record_dir is not None:
            removed["record_lines"] = sum(rewrite_jsonl(dirs.record_dir / name, lambda o: o.get("user") != user)
                                          for name in RECORDS)
        experience = dirs.spool_dir / "experience.sqlite"
        if experience.exists():
            from openclaw_oel.store import ExperienceStore

            store = ExperienceStore(experience)
            try:
                removed["experience"] = int(store.delete(user))
            finally:
                store.close()
        if dirs.ckpt_dir is not None:
            target = dirs.ckpt_dir / "users" / adapter_name(user)
            removed["adapter_checkpoints"] = len(list(target.glob("step-*"))) if target.exists() else 0
            if target.exists():
                shutil.rmtree(target)
    finally:
        spool.close()
    after = scan(dirs).get(user, UserSummary(user, adapter=adapter_name(user)))
    return removed, after
