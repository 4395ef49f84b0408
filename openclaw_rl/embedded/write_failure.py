"""A file the run must write could not be written: the run stops in one line, its spool intact.

Stage: trainer → **its own files** (the weights it syncs, checkpoints, ``metrics.jsonl``). A full disk, a
file-size limit (``ulimit -f``: EFBIG, Python ignores SIGXFSZ) or a deleted directory made these writes
raise whatever the writing library raises (``OSError``, safetensors' ``SafetensorError``, torch's
``RuntimeError``), and ``train``/``local`` died with a traceback mid-step. ``writing`` turns any failure of
one such write into ``WriteFailed``, a ``CommandError``: ``run_train``/``run_local`` stop as on SIGTERM
(requests in flight finish, untrained samples stay in the spool, the report is written if it can be), then
``openclaw-rl`` prints ``openclaw-rl train: error: could not write …`` and exits 1. The spool itself is
the proxy's (``writer.py``): it refuses replies with 503 while it cannot commit and goes on once it can.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from openclaw_rl.errors import CommandError


class WriteFailed(CommandError):
    """One of the run's own files could not be written; the run stops (the spool keeps what it holds)."""


@contextmanager
def writing(what: str, path: str | Path, *, partial: Path | None = None) -> Iterator[None]:
    """Within: any failure is `WriteFailed` naming `what` and `path`; `partial` (a temporary dir) is removed."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - each writer raises its own type; all mean the same here
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
        raise WriteFailed(f"could not write {what} to {path}: {exc}; training stopped, untrained samples stay "
                          "in the spool (free space and start it again)") from None
