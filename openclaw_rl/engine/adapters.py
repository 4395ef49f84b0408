"""Many LoRA adapters served at once by the torch core: the per-request adapter choice.

Stage: engine server → torch core → **adapters** → model. SGLang serves LoRA adapters with
``--enable-lora``: they are loaded and replaced through ``/load_lora_adapter`` / ``/unload_lora_adapter``
and chosen per request by ``lora_path``; one batch mixes requests of different adapters and of the base
model. This bank does the same for the embedded engine with PEFT's mixed-adapter batches: the core's
model is wrapped once (``get_peft_model``, every adapter of one ``LoraConfig``, as SGLang fixes the rank
and target modules at start-up), each forward passes one adapter name per row (``__base__``: no adapter),
and each LoRA layer adds its delta only to its adapter's rows. A placeholder adapter with zero ``B`` stays
the active one, so a forward without names (the core's scoring) is exactly the base model's.

Cost that stays flat in the number of adapters: PEFT's own ``adapter_names=`` forward walks every module of
the model on every call and its state-dict helpers walk every tensor, which with 100 adapters made a decode
step 4x slower and a swap ~0.7 s (measured); and its mixed batches run one LoRA pass per distinct adapter
and layer (2.9x the base's latency with 8 distinct adapters). So PEFT holds the adapters (add, delete,
shapes) but the bank computes the deltas: the LoRA layers' own adapter path is switched off, and a forward
hook registered once on each LoRA layer adds ``(x A_row^T) B_row^T * scaling`` for every row at once, with
A and B gathered per row (two ``bmm``; zeros for base rows), as SGLang's LoRA kernels do. An adapter's
weights are replaced by copying into its own tensors, found once when the adapter is added.

Every method except ``read_adapter`` is called with the core's lock held (between two forward passes).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

BASE = "__base__"  # PEFT's name for "no adapter" in a mixed batch
_PLACEHOLDER = "oc_zero"  # the active adapter: B = 0, so the plain forward is the base model's


def lora_config(rank: int = 8, alpha: int = 16, target_modules: Sequence[str] | None = None) -> Any:
    """The one adapter shape a bank serves (and a per-user trainer trains)."""
    from peft import LoraConfig

    targets = list(target_modules or ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, bias="none", target_modules=targets)


class AdapterBank:
    """The adapters a core serves, by name, each with its own weight version."""

    def __init__(self, model: torch.nn.Module, config: Any):
        from peft import get_peft_model
        from peft.tuners.lora import LoraLayer

        self.config = config
        self.peft = get_peft_model(model, copy.deepcopy(config), adapter_name=_PLACEHOLDER)
        self.peft.eval()
        self.model = model  # the same modules, LoRA layers injected: called directly, without PEFT's wrapper
        self.versions: dict[str, str] = {}
        self._tensors: dict[str, dict[str, torch.Tensor]] = {}  # adapter -> state-dict key -> its parameter
        self._names: list[str] | None = None  # the rows' adapters during a forward (read by the pre-hooks)
        self.layers = [(path, m) for path, m in self.peft.named_modules() if isinstance(m, LoraLayer)]
        self.peft.base_model.disable_adapter_layers()  # the layers compute the base; the hooks add the deltas
        for _, layer in self.layers:
            layer.register_forward_hook(self._add_delta)

    def _add_delta(self, layer: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        names = self._names
        if names is None:
            return output
        x = args[0]
        zero_a = zero_b = None
        a_rows, b_rows = [], []
        for name in names:
            if name in layer.lora_A and name in self.versions:
                a_rows.append(layer.lora_A[name].weight)
                b_rows.append(layer.lora_B[name].weight)
            else:  # a base row: a zero delta
                if zero_a is None:
                    ref_a, ref_b = layer.lora_A[_PLACEHOLDER].weight, layer.lora_B[_PLACEHOLDER].weight
                    zero_a, zero_b = torch.zeros_like(ref_a), torch.zeros_like(ref_b)
                a_rows.append(zero_a)
                b_rows.append(zero_b)
        a, b = torch.stack(a_rows), torch.stack(b_rows)  # [B, r, in], [B, out, r]
        scaling = layer.scaling[_PLACEHOLDER]  # one LoraConfig: every adapter scales alike
        delta = torch.bmm(torch.bmm(x.to(a.dtype), a.transpose(1, 2)), b.transpose(1, 2)) * scaling
        return output + delta.to(output.dtype)

    def _own_tensors(self, name: str) -> dict[str, torch.Tensor]:
        """`name`'s parameters under the keys of ``get_peft_model_state_dict`` (adapter name left out)."""
        out = {}
        for path, layer in self.layers:
            for part in ("lora_A", "lora_B"):
                modules = getattr(layer, part)
                if name in modules:
                    out[f"{path}.{part}.weight"] = modules[name].weight
        return out

    def names(self) -> list[str]:
        return list(self.versions)

    def load(self, name: str, state: Mapping[str, torch.Tensor], version: str) -> None:
        """Add adapter `name` or replace its weights (from ``get_peft_model_state_dict``). The tensors are
        checked against the bank's shape before anything changes, so a bad one is refused (ValueError)."""
        if name in (BASE, _PLACEHOLDER) or not name.isidentifier():
            raise ValueError(f"adapter name {name!r}: expected a plain identifier")
        added = name not in self.versions
        if added:
            self.peft.add_adapter(name, copy.deepcopy(self.config))
            self.peft.set_adapter(_PLACEHOLDER)
            self.peft.base_model.disable_adapter_layers()
            self.peft.eval()
            self._tensors[name] = self._own_tensors(name)
        try:
            own = self._tensors[name]
            wrong = sorted(set(state) ^ set(own))
            if wrong:
                raise ValueError(f"adapter {name}: tensors do not fit the served LoRA shape, e.g. {wrong[:2]}")
            bad = next((k for k, v in state.items() if tuple(v.shape) != tuple(own[k].shape)), None)
            if bad is not None:
                raise ValueError(f"adapter {name}: tensor {bad} has shape {list(state[bad].shape)}, "
                                 f"the served rank expects {list(own[bad].shape)}")
            with torch.no_grad():
                for key, tensor in state.items():
                    own[key].copy_(tensor)
        except BaseException:
            if added:
                self._tensors.pop(name, None)
                self.peft.delete_adapter(name)
                self.peft.set_adapter(_PLACEHOLDER)
                self.peft.base_model.disable_adapter_layers()
            raise
        self.versions[name] = version

    def unload(self, name: str) -> None:
        if name not in self.versions:
            raise KeyError(name)
        self.peft.delete_adapter(name)
        self.peft.set_adapter(_PLACEHOLDER)
        self.peft.base_model.disable_adapter_layers()
        del self.versions[name]
        del self._tensors[name]

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self._tensors[name].items()}

    def adapter_bytes(self, name: str) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors[name].values())

    def forward(self, names: list[str], **kwargs: Any) -> Any:
        """A forward with one adapter name (or ``BASE``) per row; all-base rows skip PEFT's batch split."""
        if all(n == BASE for n in names):
            return self.model(**kwargs)  # the placeholder is active: exactly the base model
        self._names = names
        try:
            return self.model(**kwargs)
        finally:
            self._names = None


def read_adapter(path: str | Path) -> dict[str, torch.Tensor]:
    """An adapter saved by PEFT (``adapter_model.safetensors`` in a directory, as SGLang's ``lora_path``),
    read outside the core's lock. Its ``adapter_config.json``, when present, must match the served shape
    (checked by ``AdapterBank.load`` through the tensor shapes)."""
    from safetensors.torch import load_file

    path = Path(path)
    file = path / "adapter_model.safetensors" if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(f"no adapter_model.safetensors at {path}")
    if path.is_dir() and (path / "adapter_config.json").exists():
        json.loads((path / "adapter_config.json").read_text())  # a malformed config is refused here
    return load_file(file)
