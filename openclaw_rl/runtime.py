"""The proxy running beside a trainer: open the gate, wait for a batch in the spool, close the gate.

Stage: spool → **rollout** → trainer. Both trainers use this: Slime's rollout function (through
``openclaw_rl.slime_hooks.bridge``) and the embedded CPU trainer. The proxy runs on its own thread and
event loop. A batch is *leased* from the spool and acknowledged once the trainer is done with it
(``ack``: the embedded trainer after its step; ``ack_through``: Slime's bridge once the step that
trained it is checkpointed); samples beyond the batch stay in the spool for the next one (upstream
discarded them). A lease never acknowledged is handed back at the next start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .address import advertised_url, write_address
from .config import Settings
from .samples import TrainingSample
from .server import Proxy
from .servers import BackgroundServer

log = logging.getLogger(__name__)


@dataclass
class Batch:
    batch_id: str
    samples: list[TrainingSample]
    metrics: dict[str, float] = field(default_factory=dict)


class ProxyRuntime:
    def __init__(self, settings: Settings, *, tokenizer: Any = None, judge_tokenizer: Any = None):
        self.settings = settings
        self.proxy = Proxy.build(settings, tokenizer=tokenizer, judge_tokenizer=judge_tokenizer, gate_open=False)
        self.server = BackgroundServer(self.proxy.app, settings.proxy.host, settings.proxy.port, log_level="warning",
                                       max_header_bytes=settings.proxy.max_header_bytes)
        self.server.start()
        self._unacked: list[tuple[str, int | None]] = []  # (batch id, trainer step), oldest first
        self.advertised_url = advertised_url(settings.proxy.host, self.server.port, settings.proxy.advertise_host)
        written = write_address(settings.spool.dir, self.advertised_url)
        log.info("openclaw-rl proxy (%s mode) listening on %s/v1, reachable at %s/v1%s", settings.mode,
                 self.server.url, self.advertised_url, f" (written to {written})" if written else "")

    @property
    def url(self) -> str:
        return self.server.url

    def collect(self, n: int, *, progress_every_s: float = 30.0, timeout_s: float | None = None,
                on_progress: Any = None, stop: threading.Event | None = None, step: int | None = None) -> Batch | None:
        """Admit traffic until ``n`` samples are in the spool, then pause it and lease them.

        ``step`` is the trainer step the batch is for (Slime's rollout id), used by :meth:`ack_through`.
        Returns None if ``stop`` is set first (the samples stay in the spool).
        """
        spool, gate = self.proxy.spool, self.proxy.gate
        started = last_log = time.monotonic()
        gate.open()
        self.proxy.metrics.submission_open.set(1)
        ready = spool.ready_count()
        last_ready = ready
        try:
            while ready < n:
                if stop is not None and stop.is_set():
                    return None
                ready = spool.wait_ready(n, timeout=min(0.5, progress_every_s))
                self.proxy.metrics.batch_fill.set(ready / n)
                if on_progress:
                    on_progress(ready, n)
                now = time.monotonic()
                if ready != last_ready:
                    last_ready, last_log = ready, now
                elif now - last_log >= progress_every_s:
                    last_log = now
                    log.info("waiting for samples: %d/%d ready, %d turns awaiting a next state or judge, %d sessions",
                             ready, n, self.proxy.tracker.pending_turns, len(self.proxy.tracker.sessions))
                if timeout_s is not None and now - started > timeout_s:
                    raise TimeoutError(f"only {ready}/{n} samples after {timeout_s}s")
        finally:
            gate.close()
            self.proxy.metrics.submission_open.set(0)
        batch_id, samples = spool.lease(n)
        self._unacked.append((batch_id, step))
        if self.proxy.journal is not None:
            self.proxy.journal.batch(batch_id, [s.sample_id for s in samples])
        rewards = [s.reward for s in samples]
        eval_scores = self.proxy.writer.take_eval_scores()
        counts = Counter(rewards)
        metrics = {"rollout/batch_fill_seconds": time.monotonic() - started,
                   "rollout/spool_leftover": float(spool.ready_count()),
                   "rollout/reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
                   "rollout/reward_pos_frac": counts.get(1.0, 0) / max(len(rewards), 1),
                   "rollout/reward_neg_frac": counts.get(-1.0, 0) / max(len(rewards), 1),
                   "rollout/reward_zero_frac": counts.get(0.0, 0) / max(len(rewards), 1)}
        if eval_scores:
            metrics["rollout/prm_eval_score"] = sum(eval_scores) / len(eval_scores)
        return Batch(batch_id, samples, metrics)

    def ack(self, batch_id: str | None = None, step: int | None = None) -> None:
        """The trainer is done with the batch (or, with no id, with every batch handed out so far);
        ``step``: the trainer step that trained it (for the dashboard's journal)."""
        done = [(bid, s) for bid, s in self._unacked if batch_id is None or bid == batch_id]
        self._acknowledge(done, step)

    def ack_through(self, step: int) -> int:
        """Acknowledge every batch collected for a trainer step <= ``step``; returns how many."""
        done = [(bid, s) for bid, s in self._unacked if s is not None and s <= step]
        self._acknowledge(done)
        return len(done)

    def _acknowledge(self, done: list[tuple[str, int | None]], step: int | None = None) -> None:
        for entry in done:
            self.proxy.spool.ack(entry[0])
            self._unacked.remove(entry)
            if self.proxy.journal is not None:
                self.proxy.journal.trained(entry[0], step if step is not None else entry[1])

    def stop(self) -> None:
        self.proxy.gate.close()
        self.server.stop()
        self.proxy.writer.close()
        if self.proxy.journal is not None:
            self.proxy.journal.close()
