"""Per-user adapters into an external SGLang server: ``/load_lora_adapter`` and ``/unload_lora_adapter``.

Stage: per-user trainer → **adapter sync** → policy engine (SGLang started with ``--enable-lora``, its
``--max-lora-rank`` and ``--lora-target-modules`` covering the trainer's ``LoraConfig``, and
``--max-loaded-loras`` at least the number of users with an adapter; or the embedded engine, which serves
the same endpoints). Each publish writes the user's adapter as a PEFT directory
(``adapter_model.safetensors`` + ``adapter_config.json``) under ``<sync dir>/<adapter>/<version>``, loads it
under a *versioned* name (``<adapter>_<version>``), and only then unloads the previous version's name:
requests already sent with the old name keep a loaded adapter, new ones get the new name from the proxy's
``AdapterDirectory``. SGLang reports the base model's ``weight_version`` for LoRA requests, so the proxy
labels a turn that used an adapter with the adapter's version itself (``serving.py``).
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import httpx
import torch

from openclaw_rl.errors import CommandError

log = logging.getLogger(__name__)


class AdapterSyncError(CommandError):
    """The policy server refused or failed an adapter load."""


def served_name(adapter: str, version: str) -> str:
    """The name one version of an adapter is loaded under: ``u<hash>_step_3``."""
    return f"{adapter}_{re.sub(r'[^A-Za-z0-9]', '_', version)}"


class SGLangAdapterSync:
    """``load(adapter, state, version) -> served name``: write, load the new name, unload the old one."""

    def __init__(self, url: str, sync_dir: str | Path, lora: Any, *, api_key: str = "", timeout_s: float = 600.0):
        self.url = url.rstrip("/")
        self.dir = Path(sync_dir).resolve()  # the server reads the path itself: absolute
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lora = lora
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(timeout=timeout_s, headers=headers)
        self.current: dict[str, tuple[str, Path]] = {}  # adapter -> (served name, directory)
        self._lock = threading.Lock()

    def load(self, adapter: str, state: dict[str, torch.Tensor], version: str) -> str:
        from safetensors.torch import save_file

        name = served_name(adapter, version)
        target = self.dir / adapter / name
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(tmp / "adapter_model.safetensors"))
        self.lora.save_pretrained(str(tmp))
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        with self._lock:
            self._post("/load_lora_adapter", {"lora_name": name, "lora_path": str(target), "weight_version": version})
            previous = self.current.get(adapter)
            self.current[adapter] = (name, target)
        if previous is not None and previous[0] != name:
            try:
                self._post("/unload_lora_adapter", {"lora_name": previous[0]})
            except AdapterSyncError as exc:  # the new version serves; an old one left loaded is only memory
                log.warning("could not unload %s: %s", previous[0], exc)
            shutil.rmtree(previous[1], ignore_errors=True)
        return name

    def unload(self, adapter: str) -> None:
        """Remove a user's adapter from the server (deleting the user)."""
        with self._lock:
            previous = self.current.pop(adapter, None)
        if previous is not None:
            self._post("/unload_lora_adapter", {"lora_name": previous[0]})
            shutil.rmtree(previous[1].parent, ignore_errors=True)

    def _post(self, path: str, body: dict[str, Any]) -> None:
        try:
            resp = self.http.post(f"{self.url}{path}", json=body)
        except httpx.HTTPError as exc:
            raise AdapterSyncError(f"policy server {self.url}{path} unreachable: {exc!r}") from exc
        try:
            data = resp.json()
        except ValueError:
            data = {}
        if resp.status_code != 200 or (isinstance(data, dict) and data.get("success") is False):
            message = data.get("error_message") if isinstance(data, dict) else None
            raise AdapterSyncError(f"policy server refused {path} ({resp.status_code}): "
                                   f"{message or resp.text[:300]}")

    def close(self) -> None:
        self.http.close()
