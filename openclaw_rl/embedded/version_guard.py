"""``train``'s version guard: a policy engine that restarted serves its launch weights until it gets ours.

Stage: weight sync → **version guard** → policy engines (real SGLang, or ``openclaw-rl engine``). A
restarted SGLang comes back serving the checkpoint it was launched from, as ``default``; until the next
step's sync, every turn it samples is off-policy, and the trainer refuses those as stale (seen with real
SGLang 0.5.23: versions went step-12 → default after a restart). The guard polls each engine's
``/model_info`` (``/get_model_info`` on older SGLang) every ``interval_s``. While an engine that was given weights does not answer, or
answers with another version, the proxy's submission gate is held closed (new requests get 503 +
Retry-After, or wait in ``hold`` mode); the engine's last weights are loaded again under their label
(``SGLangWeightSync.restore_if_regressed``), and the gate reopens only once every engine serves what
the trainer last synced. A restart is seen within ``interval_s``: a server that is down for longer (a
real SGLang takes tens of seconds to start) never serves a request on its launch weights; one that
restarts faster than the poll may serve a few, whose samples the staleness check refuses as before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from .weight_sync import SGLangWeightSync, WeightSyncError

log = logging.getLogger(__name__)

HOLD = "policy engine restarted"  # the gate hold's reason


class VersionGuard:
    """``check()`` once, or ``start()`` a thread that checks every ``interval_s`` until ``stop()``."""

    def __init__(self, engines: Sequence[SGLangWeightSync], gate: Any, *, interval_s: float = 1.0):
        self.engines, self.gate, self.interval_s = list(engines), gate, interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._down: dict[str, str] = {}  # engine url -> why it is down, as last logged: one line per outage

    def check(self) -> list[str]:
        """Each engine's state: "ok", "restored" (it had regressed and has its weights again), "down"
        (it did not answer, or refused the restore; checked again next time), "unsynced" (never given
        weights: its launch weights are the right ones). The gate is held while any is "down"."""
        states = [self._check(engine) for engine in self.engines]
        if "down" in states:
            self.gate.hold(HOLD)
        else:
            self.gate.release(HOLD)
        return states

    def _check(self, engine: SGLangWeightSync) -> str:
        if engine.version is None:
            return "unsynced"
        try:
            restored = engine.restore_if_regressed(before_restore=lambda: self.gate.hold(HOLD))
        except WeightSyncError as exc:
            if self._down.get(engine.url) != str(exc):  # logged when it goes down, or for a new reason
                log.warning("policy engine %s not ready (%s): requests wait until it serves %s again", engine.url,
                            exc, engine.version)
            self._down[engine.url] = str(exc)
            return "down"
        if self._down.pop(engine.url, None) is not None and not restored:
            log.warning("policy engine %s answers again and serves %s", engine.url, engine.version)
        if restored:
            log.warning("policy engine %s serves %s again", engine.url, engine.version)
        return "restored" if restored else "ok"

    def start(self) -> None:
        if self.interval_s <= 0 or self._thread is not None:
            return

        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                try:
                    self.check()
                except Exception:  # noqa: BLE001 - a guard bug must not end training; it is logged
                    log.exception("version guard check failed")

        self._thread = threading.Thread(target=loop, name="version-guard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop checking and release the gate hold (no more syncs: nothing to wait for)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self.gate.release(HOLD)
