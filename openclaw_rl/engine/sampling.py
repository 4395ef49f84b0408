"""Sampling one token per batch row: the engine's temperature, logit bias, SGLang's truncations and top log-probs.

Stage: engine server → torch core → **sampling** → token ids with log-probs. Kept apart from the
scheduler (``torch_core``) because it is pure tensor maths on one step's logits: the same function runs for
prefill and decode rows, and what it reports is what the trainer's fidelity check compares against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from openclaw_rl.engine.model import SamplingConfig, TopLogprobs


class SampledRow(Protocol):
    """What sampling reads of one batch row (``torch_batch.Request`` is one)."""

    sampling: SamplingConfig
    generator: torch.Generator
    bias: tuple[torch.Tensor, torch.Tensor] | None
    temperature: float
    greedy: bool
    truncates: bool


def sample_rows(logits: torch.Tensor, reqs: Sequence[SampledRow],
                token_limit: int) -> tuple[list[int], list[float], list[TopLogprobs]]:
    """Sample one token per row; log-probs of ``log_softmax((logits + bias) / T)`` before truncation.

    Greedy rows take the argmax and report unscaled log-probs. Sampled rows use inverse-CDF sampling
    with one uniform draw from the request's own ``torch.Generator`` (``torch.multinomial`` costs ~70 us
    a row on a 4k vocabulary, which was a third of a batch-8 decode step), so a seeded request samples
    the same tokens whatever it is batched with.
    """
    z = logits.float().clone()
    if token_limit < z.shape[-1]:
        z[:, token_limit:] = float("-inf")
    for i, req in enumerate(reqs):
        if req.bias is not None:
            z[i].index_add_(0, req.bias[0], req.bias[1])
    temps = [r.temperature for r in reqs]
    logprobs = torch.log_softmax(z if all(t == 1.0 for t in temps) else z / torch.tensor(temps).unsqueeze(1), dim=-1)
    tokens = z.argmax(dim=-1).tolist() if any(r.greedy for r in reqs) else [0] * len(reqs)
    drawn = [i for i, r in enumerate(reqs) if not r.greedy]
    if drawn:
        probs = logprobs[drawn].exp() if len(drawn) < len(reqs) else logprobs.exp()
        for j, i in enumerate(drawn):
            if reqs[i].truncates:
                probs[j] = truncate(probs[j], reqs[i].sampling)
        cdf = probs.double().cumsum(dim=-1)
        total = cdf[:, -1:]
        u = torch.cat([torch.rand(1, generator=reqs[i].generator, dtype=torch.float64) for i in drawn])
        x = torch.minimum(u.unsqueeze(1) * total, torch.nextafter(total, torch.zeros_like(total)))
        for i, token in zip(drawn, torch.searchsorted(cdf, x, right=True).squeeze(1).tolist()):
            tokens[i] = token
    chosen = logprobs.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1).tolist()
    k = max(r.sampling.top_logprobs_num for r in reqs)
    if k <= 0:
        return tokens, chosen, [()] * len(reqs)
    values, indices = logprobs.topk(min(k, z.shape[-1]), dim=-1)
    tops = [top_pairs(v[:r.sampling.top_logprobs_num], i[:r.sampling.top_logprobs_num])
            for r, v, i in zip(reqs, values.tolist(), indices.tolist())]
    return tokens, chosen, tops


def truncate(probs: torch.Tensor, s: SamplingConfig) -> torch.Tensor:
    """Zero what SGLang's top-k, then top-p, then min-p drop (the most likely token always stays)."""
    ordered, order = probs.sort(descending=True)
    keep = torch.ones_like(ordered, dtype=torch.bool)
    if s.top_k > 0:
        keep[s.top_k:] = False
    if s.top_p < 1.0:
        keep &= (ordered.cumsum(0) - ordered) < s.top_p
    if s.min_p > 0.0:
        keep &= ordered >= s.min_p * ordered[0]
    keep[0] = True
    return probs * torch.zeros_like(keep).scatter_(0, order, keep)


def top_pairs(values: list[float], ids: list[int]) -> TopLogprobs:
    return tuple(zip(values, ids))
