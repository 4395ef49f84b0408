"""Which user's LoRA adapter the policy engine serves now: the proxy's per-request choice.

Stage: proxy → **adapter choice** → engine. With per-user adapters the proxy adds ``lora_path=<name>`` to
a user's ``/generate`` call (SGLang's per-request adapter field) once that user's adapter is loaded in the
engine; until then the user gets the base model (no ``lora_path``). The trainer (or the weight-sync code
of ``train``) records each load here after the engine has it, so the proxy never names an adapter the
engine would refuse. Adapter names are derived from the user (``adapter_name``): SGLang and PEFT take
only plain identifiers, and a name must not reveal the user's key.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass


def adapter_name(user: str) -> str:
    """A user's adapter name: ``u`` and 16 hex digits of the user's SHA-1 (PEFT and SGLang safe)."""
    return "u" + hashlib.sha1(user.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class ServedAdapter:
    name: str
    version: str  # the adapter's own weight version (``step-N`` of that user's trainer)
    versioned_name: bool = False  # one name per version (external SGLang): the name alone says the version,
    # so the proxy labels the turn with it; otherwise the engine labels each token with the adapter's version


class AdapterDirectory:
    """Users whose adapters the engine serves, with their versions; thread-safe (the trainer writes it,
    the proxy's event loop reads it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._served: dict[str, ServedAdapter] = {}

    def loaded(self, user: str, version: str, name: str | None = None) -> ServedAdapter:
        """`user`'s adapter now serves at `version`, under `name` (default ``adapter_name(user)``; an external
        SGLang gets one name per version, ``sglang_adapters.py``)."""
        served = ServedAdapter(name or adapter_name(user), version, versioned_name=name is not None)
        with self._lock:
            self._served[user] = served
        return served

    def unloaded(self, user: str) -> None:
        with self._lock:
            self._served.pop(user, None)

    def lora_for(self, user: str) -> str | None:
        """The adapter name to send with this user's requests, or None: the base model serves them."""
        served = self.served(user)
        return served.name if served is not None else None

    def served(self, user: str) -> ServedAdapter | None:
        with self._lock:
            return self._served.get(user)

    def snapshot(self) -> dict[str, ServedAdapter]:
        with self._lock:
            return dict(self._served)
