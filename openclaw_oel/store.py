"""OEL's experience store: one experience per user (API key namespace), durable, inspectable, deletable.

Stage: mode scorer (``oel``) → **experience store** (``<spool dir>/experience.sqlite``). A file of its
own beside the spool database rather than a table in it: the spool's writer owns its connection and
commit batching, and experience is written once per ended session, not per sample. Keys are the API
key namespaces of ``sessions._namespace`` (a hash prefix of the key, never the key), ``default`` for a
proxy without keys. ``openclaw-rl experience --spool-dir DIR`` lists, shows and deletes entries.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

FILE_NAME = "experience.sqlite"
DEFAULT_KEY = "default"

_SCHEMA = """CREATE TABLE IF NOT EXISTS experience (
    key TEXT PRIMARY KEY, rules TEXT NOT NULL, sessions INTEGER NOT NULL, updated REAL NOT NULL)"""


@dataclass(slots=True)
class Entry:
    key: str
    rules: list[str]
    sessions: int  # sessions whose extraction wrote this entry
    updated: float  # unix time

    def text(self) -> str:
        return "\n".join(f"- {r}" for r in self.rules)


def store_key(namespace: str) -> str:
    return namespace or DEFAULT_KEY


class ExperienceStore:
    """SQLite, synchronous=FULL; calls are short and may run in a worker thread (one lock)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(_SCHEMA)

    @classmethod
    def beside(cls, spool_dir: str | Path) -> ExperienceStore:
        return cls(Path(spool_dir) / FILE_NAME)

    def get(self, key: str) -> Entry | None:
        with self._lock:
            row = self._db.execute("SELECT key, rules, sessions, updated FROM experience WHERE key = ?",
                                   (key,)).fetchone()
        return None if row is None else Entry(row[0], [r for r in row[1].split("\n") if r], row[2], row[3])

    def put(self, key: str, rules: list[str]) -> Entry:
        """Replace the key's rules, counting one more session."""
        if any("\n" in r for r in rules):
            raise ValueError("a rule is one line")
        now = time.time()
        with self._lock:
            self._db.execute(
                "INSERT INTO experience (key, rules, sessions, updated) VALUES (?, ?, 1, ?) ON CONFLICT(key) DO "
                "UPDATE SET rules = excluded.rules, sessions = sessions + 1, updated = excluded.updated",
                (key, "\n".join(rules), now))
        entry = self.get(key)
        assert entry is not None
        return entry

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM experience WHERE key = ?", (key,)).rowcount > 0

    def entries(self) -> list[Entry]:
        with self._lock:
            rows = self._db.execute("SELECT key, rules, sessions, updated FROM experience ORDER BY key").fetchall()
        return [Entry(k, [r for r in rules.split("\n") if r], n, u) for k, rules, n, u in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
