"""The submission gate: closed while the trainer syncs weights, open while samples are collected.

Slime's rollout thread opens and closes it; request handlers on the proxy's event loop check it.
Others may *hold* it closed for a reason of their own, whatever open/close say (``train``'s version
guard while a policy engine that restarted gets its weights back). Closed means 503 + ``Retry-After`` (upstream's behaviour) or, in ``hold`` mode, waiting up to a bound
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
        self._lock = threading.Lock()
        self._wanted = is_open  # what open()/close() asked for
        self._holds: set[str] = set()  # reasons keeping it closed regardless
        self._apply()
        self.mode, self.hold_s = mode, hold_s

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    def open(self) -> None:
        with self._lock:
            self._wanted = True
            self._apply()

    def close(self) -> None:
        with self._lock:
            self._wanted = False
            self._apply()

    def hold(self, reason: str) -> None:
        """Keep the gate closed until ``release(reason)``, whatever ``open()`` says meanwhile."""
        with self._lock:
            self._holds.add(reason)
            self._apply()

    def release(self, reason: str) -> None:
        with self._lock:
            self._holds.discard(reason)
            self._apply()

    @property
    def holds(self) -> frozenset[str]:
        return frozenset(self._holds)

    def _apply(self) -> None:
        if self._wanted and not self._holds:
            self._open.set()
        else:
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
