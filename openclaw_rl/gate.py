"""The submission gate: closed while the trainer syncs weights, open while samples are collected.

Slime's rollout thread opens and closes it; request handlers on the proxy's event loop check it.
Closed means 503 + ``Retry-After`` (upstream's behaviour) or, in ``hold`` mode, waiting up to a bound
for it to reopen, so a chatting user sees a short delay instead of an error.
"""

from __future__ import annotations

import asyncio
import threading
import time

from .errors import SubmissionPaused


class SubmissionGate:
    def __init__(self, *, is_open: bool = True, mode: str = "reject", hold_s: float = 60.0):
        self._open = threading.Event()
        if is_open:
            self._open.set()
        self.mode, self.hold_s = mode, hold_s

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    def open(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._open.clear()

    async def admit(self) -> None:
        if self._open.is_set():
            return
        if self.mode == "hold":
            deadline = time.monotonic() + self.hold_s
            while time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                if self._open.is_set():
                    return
        raise SubmissionPaused("submission paused for a weight update; retry shortly",
                               headers={"Retry-After": "2"})
