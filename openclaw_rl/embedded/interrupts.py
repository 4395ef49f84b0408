"""Ctrl-C and SIGTERM for the long-running commands (`local`, `train`): both stop a run the same way.

A run catches ``KeyboardInterrupt`` around its training loop and stops cleanly (requests in flight
finish, untrained samples stay in the spool). SIGTERM, what ``kill``, systemd and container runtimes
send, is turned into the same exception while the command runs. An interrupt before the run is up is
``InterruptedWhileStarting``, which ``cli.main`` prints as one line with the exit code it carries.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: drain, report, keep the spool."""

    exit_code = 143  # 128 + SIGTERM, should it end the command (see `cli.main`)


class InterruptedWhileStarting(KeyboardInterrupt):
    """Ctrl-C or SIGTERM before the run was up (a first `local` builds its model for a minute or more,
    `train` may load a large checkpoint): what had started is stopped, nothing was trained."""

    def __init__(self, cause: KeyboardInterrupt):
        super().__init__("while starting, before any training step")
        self.exit_code = getattr(cause, "exit_code", 130)


@contextmanager
def while_starting() -> Iterator[None]:
    """Within: an interrupt is re-raised as `InterruptedWhileStarting` (wrap the building of a run's stack)."""
    try:
        yield
    except KeyboardInterrupt as exc:
        raise InterruptedWhileStarting(exc) from None


def name_of(interrupt: KeyboardInterrupt) -> str:
    return "SIGTERM" if isinstance(interrupt, Terminated) else "Ctrl-C"


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within: SIGTERM raises `Terminated` in the main thread; the previous handler is put back after."""

    def raise_terminated(signum: int, frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
