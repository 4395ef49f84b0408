"""The torch core's batch: its requests' rows and their one shared, left-padded KV cache.

Stage: engine server → torch core → **batch** → token ids with log-probs. Kept apart from the scheduler
(``torch_core``) because it is bookkeeping of tensors, not forward passes: rows join (their prompts' KV
merged in, whichever side is shorter left-padded so last tokens align), leave (their rows dropped, then
the cache columns no remaining row attends to), and each decode step grows the attention mask by one
column (a row that is not ready feeds a masked dummy column). Touched only in the core's worker thread,
under its lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from openclaw_rl.engine.model import SamplingConfig, TokenStep


@dataclass(eq=False, slots=True)
class Request:
    """One ``generate`` call: its sampling setup, its place in the batch and its outbox of steps."""

    prompt: list[int]
    sampling: SamplingConfig
    generator: torch.Generator
    outbox: asyncio.Queue[TokenStep | BaseException]
    bias: tuple[torch.Tensor, torch.Tensor] | None  # (ids, values) of the in-vocabulary logit_bias
    temperature: float  # the logits' divisor; 1.0 for greedy rows, whose log-probs are unscaled
    greedy: bool
    truncates: bool  # top-k, top-p or min-p cut the distribution: only then is a sort needed
    adapter: str  # the LoRA adapter of this row (adapters.BASE: none)
    produced: int = 0
    pos: int = 0  # valid cache entries of this row = the position of `pending`
    pending: int = -1  # the last sampled token, which enters the cache in the next decode step
    closed: bool = False


@dataclass(frozen=True, slots=True)
class DecodeInputs:
    """One decode step's inputs over the whole batch (see ``KVBatch.step``)."""

    ids: torch.Tensor  # [B, 1]: every row's pending token
    positions: torch.Tensor  # [B, 1]
    is_ready: list[bool]  # per row of the batch: does this step count for it


class KVBatch:
    """The rows decoded together and their KV cache (``cache`` is rebuilt only when the rows change; decode
    steps grow it in place) with its attention ``mask`` ([B, T], False on left padding and sat-out steps)."""

    def __init__(self) -> None:
        self.rows: list[Request] = []
        self.cache: Any = None
        self.mask: torch.Tensor | None = None

    def reset(self) -> None:
        self.rows, self.cache, self.mask = [], None, None

    def tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(item[0], item[1]) for item in self.cache]  # 5.x yields (k, v, sliding), 4.5x (k, v)

    def step(self, ready: Sequence[Request]) -> DecodeInputs | None:
        """The next decode step's inputs, its mask column appended (True for the ready rows); None when no
        row of the batch is ready (the batch was reset, its event loop ended, mid-burst)."""
        is_ready = [r in ready for r in self.rows]
        if not any(is_ready) or self.mask is None:
            return None
        ids = torch.tensor([[r.pending] for r in self.rows])
        positions = torch.tensor([[r.pos] for r in self.rows])
        self.mask = torch.cat([self.mask, torch.tensor(is_ready).unsqueeze(1)], dim=1)
        return DecodeInputs(ids, positions, is_ready)

    def merge(self, kv: list[tuple[torch.Tensor, torch.Tensor]], group: list[Request], length: int) -> None:
        """Append rows to the batch cache, left-padding whichever side is shorter so last tokens align."""
        mask = torch.ones(len(group), length, dtype=torch.bool)
        if self.rows:
            assert self.mask is not None
            width = max(self.mask.shape[1], length)
            kv = [(torch.cat([lpad(k0, width), lpad(k, width)]), torch.cat([lpad(v0, width), lpad(v, width)]))
                  for (k0, v0), (k, v) in zip(self.tensors(), kv)]
            mask = torch.cat([lpad(self.mask, width), lpad(mask, width)])
        self._set(self.rows + group, kv, mask)

    def remove(self, leaving: list[Request]) -> None:
        """Drop rows, then the cache columns no remaining row attends to (their left padding)."""
        keep = [i for i, r in enumerate(self.rows) if r not in leaving]
        rows = [self.rows[i] for i in keep]
        if not rows:
            self.reset()
            return
        assert self.mask is not None
        index = torch.tensor(keep)
        kv = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.tensors()]
        mask = self.mask.index_select(0, index)
        used = mask.any(dim=0)
        if not bool(used.all()):
            cols = used.nonzero().squeeze(1)
            kv = [(k.index_select(2, cols), v.index_select(2, cols)) for k, v in kv]
            mask = mask.index_select(1, cols)
        self._set(rows, kv, mask)

    def _set(self, rows: list[Request], kv: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor) -> None:
        self.rows, self.mask = rows, mask
        self.cache = DynamicCache(kv)


def lpad(x: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad the sequence axis (dim 2 of a [B, H, T, D] cache, dim 1 of a [B, T] mask) to ``width``."""
    missing = width - x.shape[-2 if x.dim() == 4 else -1]
    if missing == 0:
        return x
    return F.pad(x, (0, 0, missing, 0)) if x.dim() == 4 else F.pad(x, (missing, 0), value=False)
