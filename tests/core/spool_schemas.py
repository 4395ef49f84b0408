"""Earlier versions' spool schemas, as their SQL created them: the migration tests open spools written by them.

Each constant is one released layout; the tables shared by all of them are written once."""

_SHARED = """
    CREATE TABLE samples (seq INTEGER PRIMARY KEY AUTOINCREMENT, sample_id TEXT NOT NULL UNIQUE,
        session_id TEXT NOT NULL, turn INTEGER NOT NULL, kind TEXT NOT NULL, batch_id TEXT, created REAL NOT NULL,
        payload TEXT NOT NULL);
    CREATE INDEX samples_batch ON samples(batch_id);
    CREATE TABLE spool_stats (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
    CREATE TABLE write_probe (data BLOB);
    CREATE TABLE pending_next_states (session_key TEXT NOT NULL, epoch TEXT NOT NULL, turn INTEGER NOT NULL,
        next_state TEXT NOT NULL, PRIMARY KEY (session_key, epoch, turn));
"""

ARRAYS_IN_RECORDS = _SHARED + """
    CREATE TABLE pending_turns (session_key TEXT NOT NULL, epoch TEXT NOT NULL, turn INTEGER NOT NULL,
        payload TEXT NOT NULL, PRIMARY KEY (session_key, epoch, turn));
"""
"""main at a0c7818: a waiting turn's arrays base64 in its record, a sample's in its JSON."""

WAITING_ARRAYS_AS_BLOBS = _SHARED + """
    CREATE TABLE pending_turns (session_key TEXT NOT NULL, epoch TEXT NOT NULL, turn INTEGER NOT NULL,
        payload TEXT NOT NULL, prompt_ids BLOB, response_ids BLOB, logprobs BLOB,
        PRIMARY KEY (session_key, epoch, turn));
"""
"""main at 34b3828: a waiting turn's arrays as blob columns, a sample's still in its JSON."""
