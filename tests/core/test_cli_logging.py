"""The CLI's log handler writes to ``sys.stderr`` as it is when a record is emitted: a background thread
(a proxy's judge, run in-process by a test or a wrapper) that logs after ``sys.stderr`` was replaced and the
old stream closed writes to the new stream, not into a closed file ("--- Logging error ---")."""

from __future__ import annotations

import io
import logging
import sys

from openclaw_rl import cli


def test_a_record_goes_to_the_stderr_of_the_moment_it_is_logged(monkeypatch):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    first, second = io.StringIO(), io.StringIO()
    try:
        monkeypatch.setattr(sys, "stderr", first)
        cli.setup_logging("info", False)
        logging.getLogger("openclaw_rl.test").info("to the first")
        monkeypatch.setattr(sys, "stderr", second)
        first.close()  # what a finished capture does to the stream logging was set up with
        errors = []
        monkeypatch.setattr(logging.Handler, "handleError", lambda self, record: errors.append(record))
        logging.getLogger("openclaw_rl.test").info("to the second")
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])
    assert errors == []
    assert "to the second" in second.getvalue()
