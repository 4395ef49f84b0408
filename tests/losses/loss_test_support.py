"""Builders and plain-Python references shared by the loss tests (Slime's packed micro-batch layout)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def default_args(**overrides: Any) -> SimpleNamespace:
    """The loss-relevant subset of Slime's args, with OpenClaw's script values where they matter."""
    values: dict[str, Any] = {
        "rollout_temperature": 1.0,
        "eps_clip": 0.2,
        "eps_clip_high": 0.28,
        "eps_clip_c": None,
        "entropy_coef": 0.0,
        "use_kl_loss": False,
        "kl_loss_coef": 0.0,
        "kl_loss_type": "low_var_kl",
        "use_rollout_logprobs": False,
    }
    values.update(overrides)
    return SimpleNamespace(**values)


def build_packed_batch(
    response_lengths: Sequence[int],
    prompt_lengths: Sequence[int] | None = None,
    vocab: int = 5,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> tuple[dict[str, Any], torch.Tensor]:
    """Random tokens and leaf logits [1, sum(total), V] packed like Slime's thd micro-batch."""
    generator = torch.Generator().manual_seed(seed)
    prompts = list(prompt_lengths) if prompt_lengths is not None else [2] * len(response_lengths)
    totals = [p + r for p, r in zip(prompts, response_lengths, strict=True)]
    tokens = [torch.randint(0, vocab, (total,), generator=generator) for total in totals]
    logits = (2 * torch.randn(1, sum(totals), vocab, generator=generator, dtype=dtype)).requires_grad_()
    batch = {
        "unconcat_tokens": tokens,
        "total_lengths": totals,
        "response_lengths": list(response_lengths),
        "loss_masks": [torch.ones(r, dtype=torch.int32) for r in response_lengths],
    }
    return batch, logits


def reference_response_rows(
    batch: dict[str, Any], logits: torch.Tensor, temperature: float = 1.0
) -> list[list[list[float]]]:
    """Per sample, per response token: the python-float logit row that predicts it (temperature applied)."""
    rows, start = [], 0
    flat = logits.detach()[0].tolist()
    for total, resp in zip(batch["total_lengths"], batch["response_lengths"], strict=True):
        prompt = total - resp
        rows.append([[v / temperature for v in flat[start + prompt - 1 + j]] for j in range(resp)])
        start += total
    return rows


def python_log_softmax(row: Sequence[float]) -> list[float]:
    peak = max(row)
    log_norm = peak + math.log(sum(math.exp(v - peak) for v in row))
    return [v - log_norm for v in row]


def reference_token_log_probs(
    batch: dict[str, Any], logits: torch.Tensor, temperature: float = 1.0
) -> list[list[float]]:
    """log p(response token) per sample by plain-Python loops, independent of the code under test."""
    out = []
    for rows, tokens, resp in zip(
        reference_response_rows(batch, logits, temperature), batch["unconcat_tokens"], batch["response_lengths"],
        strict=True,
    ):
        response_tokens = tokens.tolist()[len(tokens) - resp :]
        out.append([python_log_softmax(row)[tok] for row, tok in zip(rows, response_tokens, strict=True)])
    return out


def python_sample_mean_sum(per_sample: Sequence[Sequence[float]], masks: Sequence[Sequence[float]]) -> float:
    """Sum over samples of the masked mean with denominator max(sum(mask), 1)."""
    return sum(
        sum(v * m for v, m in zip(values, mask, strict=True)) / max(sum(mask), 1)
        for values, mask in zip(per_sample, masks, strict=True)
    )


class AllocationProbe(TorchDispatchMode):
    """Records (op, numel) for every freshly allocated tensor output."""

    def __init__(self) -> None:
        super().__init__()
        self.allocations: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        aliased = any(ret.alias_info is not None for ret in func._schema.returns)  # a view or an in-place op
        if not aliased:
            for tensor in tree_flatten(out)[0]:
                if isinstance(tensor, torch.Tensor):
                    self.allocations.append((str(func), tensor.numel()))
        return out

    def larger_than(self, numel: int) -> list[tuple[str, int]]:
        return [(op, n) for op, n in self.allocations if n > numel]
