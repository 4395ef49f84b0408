"""``train``'s weight sync to several policy engines: one checkpoint, every engine paused, updated, resumed.

Stage: trainer → **weight sync** → policy engines. With several engines (``--policy-url`` comma-separated,
or one sglang-router URL, whose ``/workers`` list names them), a step's weights must reach every one
before the proxy's gate reopens, or sessions on a stale engine would sample off-policy. The checkpoint is
written once; each engine then gets ``SGLangWeightSync``'s load (pause in ``retract`` mode, update from
disk, check the version, continue), all engines at once, so a sync costs the slowest engine's load, not
their sum. A failure on any engine fails the sync (the run stops, as with one engine). The router itself
is never asked to pause or update: sglang-router 0.3.2 forwards neither ``/pause_generation`` nor
``/update_weights_from_disk`` to its workers. Workers that join the router after ``train`` started are not
seen (the list is read once, at start).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import torch

from ..engines import split_urls
from .weight_sync import UNREACHABLE_WAIT_S, SGLangWeightSync, WeightSyncError, write_checkpoint

log = logging.getLogger(__name__)


def engine_urls(policy_url: str, *, api_key: str = "", timeout_s: float = 10.0) -> list[str]:
    """The engines behind ``policy_url``: its comma-separated URLs, or, for one URL that is an
    sglang-router, the workers the router lists (``GET /workers``); a plain SGLang answers that with 404."""
    urls = split_urls(policy_url)
    if len(urls) != 1:
        return urls
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(f"{urls[0]}/workers", headers=headers, timeout=timeout_s)
        data = resp.json() if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return urls  # the weight sync's own first call reports an unreachable server clearly
    workers = data.get("workers") if isinstance(data, dict) else None
    if not isinstance(workers, list):
        return urls
    found = [str(w["url"]).rstrip("/") for w in workers if isinstance(w, dict) and w.get("url")]
    if not found:
        raise WeightSyncError(f"the router at {urls[0]} lists no workers: start the policy engines first")
    log.info("policy router %s: weights go to its %d workers (%s)", urls[0], len(found), ", ".join(found))
    return found


class FanOutWeightSync:
    """``SGLangWeightSync``'s interface over several engines (``engines``: one client each)."""

    def __init__(self, urls: list[str], sync_dir: str | Path, *, api_key: str = "", timeout_s: float = 600.0):
        self.engines = [SGLangWeightSync(url, sync_dir, api_key=api_key, timeout_s=timeout_s) for url in urls]
        self.dir = self.engines[0].dir
        self.url = ",".join(e.url for e in self.engines)
        self.last_timings: dict[str, float] = {}
        self._current: Path | None = None
        self._pool = ThreadPoolExecutor(len(self.engines), thread_name_prefix="weight-sync")
        self._lock = threading.Lock()

    @property
    def restores(self) -> int:
        return sum(e.restores for e in self.engines)

    def server_version(self, timeout_s: float | None = None) -> str:
        """The version every engine reports; engines that disagree give ``url=version`` pairs joined by ``; ``."""
        versions = list(self._pool.map(lambda e: e.server_version(timeout_s), self.engines))
        if len(set(versions)) == 1:
            return versions[0]
        return "; ".join(f"{e.url}={v}" for e, v in zip(self.engines, versions))

    def info(self, name: str, timeout_s: float | None = None) -> Any:
        return self.engines[0].info(name, timeout_s)

    def sync(self, model: torch.nn.Module, version: str, *, wait_s: float = UNREACHABLE_WAIT_S) -> None:
        with self._lock:
            t0 = time.perf_counter()
            target = write_checkpoint(model, self.dir / f"{version}")
            t1 = time.perf_counter()
            self.load_all(target, version, wait_s)
            t2 = time.perf_counter()
            if self._current is not None and self._current != target:
                shutil.rmtree(self._current, ignore_errors=True)
            self._current = target
            self.last_timings = {"perf/sync_write_ms": (t1 - t0) * 1000, "perf/sync_update_ms": (t2 - t1) * 1000}

    def load_all(self, target: Path, version: str, wait_s: float = UNREACHABLE_WAIT_S) -> None:
        """Every engine loads ``target`` as ``version`` (at once); raises the first engine's failure."""
        futures = [self._pool.submit(e._load_when_up, target, version, wait_s) for e in self.engines]
        errors = [f.exception() for f in futures]
        failed = [(e.url, err) for e, err in zip(self.engines, errors) if err is not None]
        if failed:
            raise WeightSyncError(f"{len(failed)} of {len(self.engines)} policy engines did not load {version}: "
                                  + "; ".join(f"{url}: {err}" for url, err in failed))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for engine in self.engines:
            engine.close()


def weight_sync_for(policy_url: str, sync_dir: str | Path, *, api_key: str = "") -> SGLangWeightSync | FanOutWeightSync:
    """One engine's ``SGLangWeightSync`` as before, or a ``FanOutWeightSync`` over several."""
    urls = engine_urls(policy_url, api_key=api_key)
    if len(urls) == 1:
        return SGLangWeightSync(urls[0], sync_dir, api_key=api_key)
    return FanOutWeightSync(urls, sync_dir, api_key=api_key)
