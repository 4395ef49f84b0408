"""``PrefixCache``: the KV of recent prompts, reused for the longest common token prefix of a new one.

Why: an OpenClaw request carries a ~15K-token system prompt and tool list that is identical on every
turn of every session, and prefilling it again took ~15 s a reply on two cores. SGLang keeps a radix
tree of prefixes; a handful of whole prompts compared token by token gives the same reuse for the
embedded core's traffic (a few sessions sharing one long head) at a fraction of the code.

The KV of a prefix depends only on the prefix's tokens and the weights, so an entry stays exact until
the weights change: the core clears the cache on every weight update and on ``flush_cache``. Entries
are plain ``[1, heads, tokens, head_dim]`` tensors per layer; they are never written in place (the
transformers cache appends by concatenation), so a reused slice cannot be corrupted by the request
that reuses it. Touched only under the core's lock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(eq=False, slots=True)
class _Entry:
    ids: torch.Tensor  # 1-D long: the prompt whose KV this is
    kv: KV


@dataclass(slots=True)
class PrefixStats:
    """Counters for logs and benchmarks: lookups, hits and prompt tokens not recomputed."""

    lookups: int = 0  # prompts looked up (an empty cache's too)
    prompt_tokens: int = 0  # their tokens: reused_tokens / prompt_tokens is the share served from the cache
    hits: int = 0
    reused_tokens: int = 0
    flushes: int = 0


@dataclass(slots=True)
class PrefixCache:
    """Up to ``entries`` recent prompts (least recently used dropped first); ``entries`` 0 disables it.

    ``min_tokens``: a shorter common prefix is not worth a separate forward pass (the prompt then joins
    an ordinary batched prefill).
    """

    entries: int = 4
    min_tokens: int = 64
    stats: PrefixStats = field(default_factory=PrefixStats)
    _items: list[_Entry] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self._items)

    def lookup(self, ids: Sequence[int], limit: int) -> tuple[int, KV] | None:
        """The longest cached prefix of ``ids`` of at most ``limit`` tokens, as (length, KV views)."""
        if self.entries <= 0:
            return None
        self.stats.lookups += 1
        self.stats.prompt_tokens += len(ids)
        if not self._items:
            return None
        query = torch.tensor(ids[:limit], dtype=torch.long)
        best, best_len = None, 0
        for entry in self._items:
            n = min(len(query), len(entry.ids))
            differs = (query[:n] != entry.ids[:n]).nonzero()
            common = int(differs[0, 0]) if len(differs) else n
            if common > best_len:
                best, best_len = entry, common
        if best is None or best_len < self.min_tokens:
            return None
        self._items.remove(best)
        self._items.append(best)
        self.stats.hits += 1
        self.stats.reused_tokens += best_len
        return best_len, [(k[:, :, :best_len], v[:, :, :best_len]) for k, v in best.kv]

    def store(self, ids: Sequence[int], kv: KV) -> None:
        """Remember the KV of ``ids`` (one row); an entry that is a prefix of ``ids`` is replaced."""
        if self.entries <= 0 or len(ids) < self.min_tokens:
            return
        new = torch.tensor(list(ids), dtype=torch.long)
        self._items = [e for e in self._items
                       if not (len(e.ids) <= len(new) and bool(torch.equal(e.ids, new[:len(e.ids)])))]
        self._items.append(_Entry(new, kv))
        del self._items[:-self.entries]

    def clear(self) -> None:
        if self._items:
            self.stats.flushes += 1
        self._items = []


def prefix_counters(model: Any) -> dict[str, int] | None:
    """A core's prefix-cache counters (``PrefixStats``), when it has a prefix cache."""
    stats = getattr(getattr(model, "prefixes", None), "stats", None)
    return dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else None
