"""Push a trainer's weights into an external SGLang server with SGLang's own ``/update_weights_from_disk``.

Stage: trainer → **weight sync** → policy engine (a separate process: real SGLang, or the embedded
engine, which implements the same endpoint). The in-process path (``openclaw-rl local``) copies tensors
directly; a server in another process needs a checkpoint it can read. Each sync writes the full weights
(LoRA adapters merged, without touching the trainer's own weights) as a Hugging Face checkpoint into a
fresh directory, asks the server to load it under a version label, checks that the server reports that
label, and deletes the previous directory. The caller keeps submission paused meanwhile (the proxy's
gate), as Slime does.

Requests admitted before the gate closed may still be generating. Unpaused, SGLang 0.5.23's update waits
for the requests in flight (its model-update lock) and then flushes the old weights' KV cache; but in the
real-SGLang test, under concurrent requests, it failed an update with "Weights were updated, but the cache
was not flushed because requests are still running or queued", which ended ``train`` (a request still in
its batch when the update ran). So, as Slime pauses its engines around a weight update, the server's
generation is paused first (``/pause_generation`` in ``retract`` mode: running requests go back to the
queue, so the cache can be flushed, and they are recomputed with the new weights after
``/continue_generation``; their log-probs come from the weights that sampled each token, and the proxy
marks such a turn's version ``mixed:``). A server without ``/pause_generation`` is updated unpaused.

Why from disk and not from tensors: ``/update_weights_from_tensor`` needs the trainer and the server to
share a process group or CUDA IPC handles; from disk works for any server that can read the directory
(put it on ``/dev/shm`` on a GPU box to keep the write off the disk).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import torch

from ..errors import CommandError
from .write_failure import writing

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 10.0  # a version check waits this long at most (the sync lock is held meanwhile)


class WeightSyncError(CommandError):
    """The server refused or failed the update; its old weights (and version) keep serving."""


def full_state_dict(model: torch.nn.Module) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The weights to serve and the plain model that names them.

    For a ``peft`` model, each LoRA-wrapped linear becomes ``W + scale · B·A`` computed out of place
    (``get_delta_weight``), so the trainer's base weights are never merged and unmerged (which drifts in
    bf16); adapter tensors are left out and ``base_layer`` is removed from the names, giving exactly the
    base checkpoint's keys. A plain model is returned as is.
    """
    get_base = getattr(model, "get_base_model", None)
    if get_base is None:
        return model, dict(model.state_dict())
    base = get_base()
    merged: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in base.named_modules():
            base_layer = getattr(module, "base_layer", None)
            if base_layer is None or not hasattr(module, "get_delta_weight"):
                continue
            weight = base_layer.weight.detach().clone()
            for adapter in getattr(module, "active_adapters", []):
                if adapter in getattr(module, "lora_A", {}):
                    weight += module.get_delta_weight(adapter).to(weight.dtype)
            merged[f"{name}.weight"] = weight
        state: dict[str, torch.Tensor] = {}
        for key, tensor in base.state_dict().items():
            if "lora_" in key:
                continue
            clean = key.replace(".base_layer.", ".")
            state[clean] = merged.get(clean, tensor)
    return base, state


def write_checkpoint(model: torch.nn.Module, out: Path) -> Path:
    """Save the servable full weights of ``model`` (config included) into ``out`` atomically."""
    base, state = full_state_dict(model)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with writing("the weights to sync", out, partial=tmp):
        base.save_pretrained(tmp, state_dict=state, safe_serialization=True)
    # A run restarted on the same out dir (after a kill, without a checkpoint to resume from) numbers its
    # steps from 1 again: the killed run's `step-N` is in the way, and rename() cannot replace a directory.
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


class ServerUnreachable(WeightSyncError):
    """The server did not take the connection before the update began (it is down or restarting)."""


UNREACHABLE_WAIT_S = 300.0  # a sync waits this long for a policy server that is down (restarting) before
# it gives up and stops the run; real SGLang takes ~25 s to start, a large model minutes
RETRY_S = 1.0  # between its attempts


class SGLangWeightSync:
    """``sync(model, version)``: write, ``/update_weights_from_disk``, verify the version, clean up."""

    def __init__(self, url: str, sync_dir: str | Path, *, api_key: str = "", timeout_s: float = 600.0):
        self.url = url.rstrip("/")
        self.dir = Path(sync_dir).resolve()  # the server resolves the path itself: make it absolute
        self.dir.mkdir(parents=True, exist_ok=True)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(timeout=timeout_s, headers=headers)
        self._current: Path | None = None
        self._warned_no_pause = False
        self._legacy_info = False  # the server has only /get_model_info and /get_server_info (older SGLang)
        self.last_timings: dict[str, float] = {}
        # the label and checkpoint the server was last made to serve (None before the first load): what a
        # restarted server, back on its launch weights ("default"), must be given again
        self.version: str | None = None
        self.loaded: Path | None = None
        self.restores = 0  # loads that gave a restarted server its weights back
        self._lock = threading.RLock()  # one load at a time: the trainer's sync, or the version guard's restore

    def server_version(self, timeout_s: float | None = None) -> str:
        """The version label the server reports now (``"default"`` until the first update)."""
        return str(self.info("model_info", timeout_s).get("weight_version"))

    def sync(self, model: torch.nn.Module, version: str, *, wait_s: float = UNREACHABLE_WAIT_S) -> None:
        with self._lock:
            t0 = time.perf_counter()
            target = write_checkpoint(model, self.dir / f"{version}")
            t1 = time.perf_counter()
            self._load_when_up(target, version, wait_s)
            t2 = time.perf_counter()
            if self._current is not None and self._current != target:
                shutil.rmtree(self._current, ignore_errors=True)
            self._current = target
            self.last_timings = {"perf/sync_write_ms": (t1 - t0) * 1000, "perf/sync_update_ms": (t2 - t1) * 1000}

    def restore_if_regressed(self, before_restore: Callable[[], None] = lambda: None) -> bool:
        """If the server no longer serves what it was last made to serve (it restarted, and serves its
        launch weights as ``default``), load those weights again under their label; True if it did.
        ``before_restore`` runs first (the caller stops admitting requests). Raises ``WeightSyncError``
        when the server does not answer or refuses. Runs under the sync lock, so a sync in progress is
        never mistaken for a regression."""
        with self._lock:
            if self.version is None or self.loaded is None:
                return False
            served = self.server_version(CHECK_TIMEOUT_S)
            if served == self.version:
                return False
            log.warning("policy server %s serves %r, not %r (restarted?): loading %s again", self.url, served,
                        self.version, self.loaded)
            before_restore()
            self.load(self.loaded, self.version)
            self.restores += 1
            return True

    def _load_when_up(self, target: Path, version: str, wait_s: float) -> None:
        """``load``, waiting up to `wait_s` for a server that does not take connections (killed, restarting:
        the version guard holds the proxy's gate meanwhile). Nothing was sent to it, so trying again is safe."""
        deadline = time.monotonic() + wait_s
        waited = False
        while True:
            try:
                self.load(target, version)
                return
            except ServerUnreachable as exc:
                if time.monotonic() >= deadline:
                    raise WeightSyncError(f"{exc}; gave up after waiting {wait_s:.0f} s for it") from None
                if not waited:  # one line per outage
                    log.warning("%s: the %s weights wait for it (up to %.0f s)", exc, version, wait_s)
                waited = True
                time.sleep(RETRY_S)

    def load(self, model_path: str | Path, version: str) -> None:
        """Ask the server to load ``model_path`` as ``version``, its generation paused meanwhile; raise
        ``WeightSyncError`` if it did not."""
        with self._lock:
            self._load(model_path, version)
            self.version, self.loaded = version, Path(model_path)

    def _load(self, model_path: str | Path, version: str) -> None:
        paused = self._pause()
        try:
            self._update(model_path, version)
        except BaseException:
            if paused:
                self._continue(after_failure=True)
            raise
        if paused:
            self._continue()
        reported = self.server_version()
        if reported != version:
            raise WeightSyncError(f"policy server reports weight_version {reported!r} after loading {version!r}")
        log.info("policy server %s now serves %s (%s)", self.url, version, model_path)

    def _update(self, model_path: str | Path, version: str) -> None:
        body = {"model_path": str(model_path), "weight_version": version}
        try:
            resp = self.http.post(f"{self.url}/update_weights_from_disk", json=body)
        except httpx.HTTPError as exc:  # SGLang dies on a checkpoint of the wrong shape: say so
            raise WeightSyncError(f"policy server {self.url} did not answer the weight update ({exc!r}); "
                                  "it may have crashed (SGLang exits on a checkpoint that does not fit)") from exc
        data = _json(resp)
        if resp.status_code != 200 or not data.get("success"):
            raise WeightSyncError(f"policy server refused the weight update ({resp.status_code}): "
                                  f"{data.get('message', resp.text[:300])}")

    def _pause(self) -> bool:
        """Pause the server's generation (``retract``); False when it has no such endpoint."""
        try:
            resp = self.http.post(f"{self.url}/pause_generation", json={"mode": "retract"})
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ServerUnreachable(f"policy server {self.url} unreachable before the weight update: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"policy server {self.url} unreachable before the weight update: {exc!r}") from exc
        if resp.status_code in (404, 405):
            if not self._warned_no_pause:
                self._warned_no_pause = True
                log.warning("policy server %s has no /pause_generation: weights are updated unpaused (a request "
                            "still in SGLang's batch then makes it refuse to flush its cache and fail the update)",
                            self.url)
            return False
        if resp.status_code != 200:
            raise WeightSyncError(f"policy server refused to pause generation ({resp.status_code}): "
                                  f"{resp.text[:300]}")
        return True

    def _continue(self, after_failure: bool = False) -> None:
        """Resume generation after an update, whether it succeeded or not. After a failed update, the
        update's error is the one raised, and this one is logged."""
        try:
            resp = self.http.post(f"{self.url}/continue_generation", json={})
            failed = None if resp.status_code == 200 else f"{resp.status_code}: {resp.text[:300]}"
        except httpx.HTTPError as exc:
            failed = repr(exc)
        if failed is None:
            return
        if after_failure:
            log.error("policy server %s did not resume generation after a failed update: %s", self.url, failed)
            return
        raise WeightSyncError(f"policy server {self.url} did not resume generation after the weight update "
                              f"({failed}); its requests stay paused until /continue_generation succeeds")

    def info(self, name: str, timeout_s: float | None = None) -> Mapping[str, Any]:
        """``/model_info`` or ``/server_info``: SGLang 0.5.23 logs a deprecation warning at every call of the
        older ``/get_model_info`` and ``/get_server_info``, so those are asked only of a server that answers
        404 to the new name (older SGLang), and from then on directly."""
        if not self._legacy_info:
            resp = self._get(f"/{name}", timeout_s)
            if resp.status_code != 404:
                return self._checked(f"/{name}", resp)
            self._legacy_info = True
        return self.get(f"/get_{name}", timeout_s)

    def get(self, path: str, timeout_s: float | None = None) -> Mapping[str, Any]:
        return self._checked(path, self._get(path, timeout_s))

    def _get(self, path: str, timeout_s: float | None = None) -> httpx.Response:
        try:
            return self.http.get(f"{self.url}{path}", **({"timeout": timeout_s} if timeout_s else {}))
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"policy server {self.url} unreachable: {exc!r}") from exc

    @staticmethod
    def _checked(path: str, resp: httpx.Response) -> Mapping[str, Any]:
        if resp.status_code != 200:
            raise WeightSyncError(f"policy server {path} answered {resp.status_code}: {resp.text[:300]}")
        return _json(resp)

    def close(self) -> None:
        self.http.close()


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        return {"message": resp.text[:300]}
    return data if isinstance(data, dict) else {"message": str(data)[:300]}
