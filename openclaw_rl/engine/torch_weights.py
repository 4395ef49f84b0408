"""The torch core's Hugging Face model from outside: checkpoints read, new weights matched, call conventions.

Stage: weight sync → **torch core weights** → torch core. Kept apart from the scheduler (``torch_core``)
because none of it runs per token: a checkpoint is read off the event loop and outside the core's lock
(``read_checkpoint``), and every tensor of it is matched against the loaded model before anything is
copied (``match_state_dict``), so a checkpoint of another architecture is refused and the old weights
keep serving. Also what the model's config and ``forward`` signature say (EOS ids, keyword names), which
differ across transformers versions.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch


def forward_kwargs(model: Any) -> tuple[str, str | None]:
    """The KV-cache and logits-trimming keyword names of ``model.forward``: transformers 5.x renamed
    ``past_key_values`` to ``cache`` (the old name warns, removal in 5.40); 4.5x only knows the old one."""
    params = inspect.signature(model.forward).parameters
    cache = "cache" if "cache" in params else "past_key_values"
    return cache, "logits_to_keep" if "logits_to_keep" in params else None


def config_eos(model: Any) -> list[int]:
    """The EOS ids of the model's generation config and config, together."""
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None)
        ids += [value] if isinstance(value, int) else list(value or [])
    return sorted(set(ids))


def match_state_dict(model: Any, state_dict: Mapping[str, torch.Tensor], source: str, *,
                     peft: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(model tensor, new tensor) pairs covering every weight of ``model`` once; a ``ValueError`` naming the
    first tensor that is unexpected, missing or of another shape. Tied weights need only one of their names;
    ``peft``: the model's layers are PEFT-wrapped (LoRA enabled), its base weights matched by their plain names."""
    own = model.state_dict(keep_vars=True)
    if peft:
        own = {k.replace(".base_layer.", "."): v for k, v in own.items() if ".lora_" not in k}
    groups: dict[int, list[str]] = {}
    for name, tensor in own.items():
        groups.setdefault(id(tensor), []).append(name)
    unexpected = sorted(set(state_dict) - set(own))
    if unexpected:
        raise ValueError(f"{source} does not fit the loaded model: unexpected tensors {unexpected[:3]}")
    pairs = []
    for names in groups.values():
        found = next((n for n in names if n in state_dict), None)
        if found is None:
            raise ValueError(f"{source} does not fit the loaded model: tensor {names[0]!r} is missing")
        target, tensor = own[found], state_dict[found]
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(f"{source} does not fit the loaded model: tensor {found!r} has shape "
                             f"{list(tensor.shape)}, the model expects {list(target.shape)}")
        pairs.append((target.data, tensor))
    return pairs


def read_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file or of a directory of safetensors shards (what
    ``save_pretrained`` writes); read outside the lock, so serving goes on meanwhile."""
    from safetensors.torch import load_file

    path = Path(path)
    shards = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no safetensors checkpoint at {path}")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(shard))
    return state
