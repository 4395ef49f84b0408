"""The spool's SQLite schema, the columns added since its first version, and how an older spool is brought to it.

Stage: **spool** (``spool.py`` writes and reads through these tables). Apart from ``spool.py`` because the
schema and its migration are one job: what a file written by any earlier version holds, and what it needs
to be read by this one (``ALTER TABLE … ADD COLUMN``: old rows keep their meaning, see each column's comment).
"""

from __future__ import annotations

import sqlite3

from .samples import ARRAY_FIELDS

SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    sample_id  TEXT NOT NULL UNIQUE,
    session_id TEXT NOT NULL,
    turn       INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    batch_id   TEXT,
    created    REAL NOT NULL,
    payload    TEXT NOT NULL,
    -- the sample's long arrays apart from its JSON (payload), as the bytes of an array each
    -- (TrainingSample.to_row, samples.ARRAY_FIELDS); NULL in rows written before, whose JSON holds them
    prompt_ids             BLOB,
    response_ids           BLOB,
    rollout_log_probs      BLOB,
    loss_mask              BLOB,
    teacher_log_probs      BLOB,
    teacher_topk_log_probs BLOB,
    teacher_topk_indices   BLOB,
    teacher_prompt_ids     BLOB,
    student_topk_indices   BLOB
);
CREATE INDEX IF NOT EXISTS samples_batch ON samples(batch_id);
CREATE TABLE IF NOT EXISTS spool_stats (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
-- written and emptied in one commit while writes fail, to learn when the disk takes them again
CREATE TABLE IF NOT EXISTS write_probe (data BLOB);
-- A waiting turn: its record (JSON) and, apart from it, its token arrays as the bytes of array('i'/'d')
-- (NULL in rows written before they moved out of the record, which then holds them in base64)
CREATE TABLE IF NOT EXISTS pending_turns (
    session_key  TEXT NOT NULL,
    epoch        TEXT NOT NULL,
    turn         INTEGER NOT NULL,
    payload      TEXT NOT NULL,
    prompt_ids   BLOB,
    response_ids BLOB,
    logprobs     BLOB,
    PRIMARY KEY (session_key, epoch, turn)
);
-- A waiting turn's next state that arrived after its record was saved (see save_next_state): a row of its
-- own, since SQLite rewrites a whole row to update one column.
CREATE TABLE IF NOT EXISTS pending_next_states (
    session_key TEXT NOT NULL,
    epoch       TEXT NOT NULL,
    turn        INTEGER NOT NULL,
    next_state  TEXT NOT NULL,
    PRIMARY KEY (session_key, epoch, turn)
);
-- A waiting turn's next state goes with its row: a new record of the turn (which holds the next state) and
-- its deletion (settled) remove it, in SQLite rather than one more statement from Python per write.
CREATE TRIGGER IF NOT EXISTS pending_turn_saved AFTER INSERT ON pending_turns BEGIN
    DELETE FROM pending_next_states WHERE session_key = NEW.session_key AND epoch = NEW.epoch AND turn = NEW.turn;
END;
CREATE TRIGGER IF NOT EXISTS pending_turn_deleted AFTER DELETE ON pending_turns BEGIN
    DELETE FROM pending_next_states WHERE session_key = OLD.session_key AND epoch = OLD.epoch AND turn = OLD.turn;
END;
"""

# Columns added since the first schema: a spool written before them gets them when it is opened. A sample's
# long arrays: the bytes of an array each (``TrainingSample.to_row``), NULL in rows written before (their
# JSON holds them) and for a field that is None or stayed in the JSON.
ADDED_COLUMNS = {"pending_turns": ("prompt_ids BLOB", "response_ids BLOB", "logprobs BLOB"),
                  "samples": tuple(f"{name} BLOB" for name, _, _ in ARRAY_FIELDS)}
ARRAY_COLUMNS = ", ".join(name for name, _, _ in ARRAY_FIELDS)
# A sample's size as the cap counts it: its JSON's UTF-8 bytes and its arrays' bytes
SAMPLE_BYTES = "LENGTH(CAST(payload AS BLOB)) + " + " + ".join(
    f"COALESCE(LENGTH({name}), 0)" for name, _, _ in ARRAY_FIELDS)
INSERT_SAMPLE = (f"INSERT OR IGNORE INTO samples(sample_id, session_id, turn, kind, created, payload, {ARRAY_COLUMNS}) "
                 f"VALUES ({', '.join('?' * (6 + len(ARRAY_FIELDS)))})")


def migrate(db: sqlite3.Connection) -> None:
    """Bring a spool written by an earlier version to this schema (the columns added since, ``ADDED_COLUMNS``);
    its rows keep their meaning (a waiting turn's record or a sample's JSON without the blobs still holds its
    arrays)."""
    for table, columns in ADDED_COLUMNS.items():
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for column in columns:
            if column.split()[0] not in have:
                try:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
                except sqlite3.OperationalError as e:  # another process opening it added it since the check
                    if "duplicate column name" not in str(e):
                        raise
