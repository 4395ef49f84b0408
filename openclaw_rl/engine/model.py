"""The token-level model core that the SGLang-compatible engine server drives.

Stage: engine HTTP layer (``server.py``) → **core** → token ids with log-probs. A core is token-in,
token-plus-logprob-out: it knows nothing about HTTP, text, chat templates, stop strings or finish
reasons. Everything SGLang decides above sampling (stop tokens and strings, trimming, the ``null``
first entry of input log-probs, ``max_new_tokens`` bookkeeping, pausing) lives in the server, so the
scripted fake (``scripted.py``) and the real KV-cache sampler share one implementation of those rules.

Log-prob contract (what real SGLang 0.5.23 does, see the golden README):
  * output log-probs (``TokenStep.logprob`` and its top list) are computed from the distribution the
    token was *sampled* from: after ``logit_bias`` and scaled by the request temperature,
    ``log_softmax((logits + bias) / T)``; at temperature 0 (greedy) they are the unscaled
    ``log_softmax(logits + bias)``. They are taken before top-p/top-k/min-p truncation, which
    therefore never renormalises them;
  * input log-probs (``score``) are never temperature-scaled and never biased: they are the plain
    ``log_softmax(logits)`` of the model, which is what a teacher must report.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

TopLogprobs = tuple[tuple[float, int], ...]
"""A top-k list: ``(logprob, token_id)`` pairs, highest log-prob first."""


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    """What a core needs to sample one sequence. Stop conditions are deliberately absent: the server
    applies them and closes the generator, so both cores agree on SGLang's finish rules."""

    temperature: float
    """Softmax temperature; below 1e-6 means greedy (argmax), as in SGLang."""
    top_p: float
    """Nucleus mass in (0, 1]; 1.0 disables."""
    top_k: int
    """Keep the k most likely tokens; -1 disables."""
    min_p: float
    """Drop tokens below ``min_p * p_max``; 0.0 disables."""
    max_new_tokens: int
    """Upper bound of steps the server will pull (>= 1). A core may use it to reserve KV cache."""
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    """Added to the logits before sampling *and* before the output log-probs are taken."""
    top_logprobs_num: int = 0
    """Length of ``TokenStep.top_logprobs``; 0 means the core may skip computing it."""
    seed: int | None = None
    """SGLang's ``sampling_seed``: makes one request reproducible; None = the core's own RNG."""
    adapter: str | None = None
    """SGLang's ``lora_path``: the LoRA adapter this request runs with (a core with an adapter bank); None = base."""


@dataclass(frozen=True, slots=True)
class TokenStep:
    """One sampled token, as the server appends it to ``output_ids``."""

    token_id: int
    logprob: float
    """log p(token) under the sampling distribution (temperature-scaled, biased; see module doc)."""
    top_logprobs: TopLogprobs = ()
    """The ``top_logprobs_num`` best tokens of that same distribution (may or may not hold token_id)."""
    weight_version: str = "default"
    """The weight version that produced this token; the server turns runs of it into
    ``meta_info.weight_versions`` segments, so a mid-request update is visible to the client."""


@dataclass(frozen=True, slots=True)
class InputScores:
    """Teacher-style scores of given ids, from one forward pass over them (never temperature-scaled)."""

    token_logprobs: list[float]
    """``token_logprobs[j] = log p(ids[start + j] | ids[:start + j])``, for every position from ``start``
    to the end; empty when ``start == len(ids)``."""
    top_logprobs: list[TopLogprobs]
    """Same length as ``token_logprobs`` when ``top_k > 0`` (the distribution that scored that
    position), else empty."""
    next_top_logprobs: TopLogprobs
    """When ``top_k > 0``: the top-k of the next-token distribution after *all* of ``ids`` (SGLang
    reports it as the one ``output_top_logprobs`` entry of a ``max_new_tokens: 0`` request), else ()."""


@runtime_checkable
class EngineModel(Protocol):
    """The slice of a model core that ``make_engine_app`` calls.

    Concurrency: ``generate`` and ``score`` are called concurrently from one event loop, one call per
    request (``n`` samples are separate calls). A batching core is expected to merge the in-flight
    calls into shared forward passes (continuous batching); the scripted core simply interleaves.
    Pausing (``/pause_generation``) is the server's: it stops pulling steps, so a core that computes
    ahead of the pulls should keep at most a step or two queued per request.
    """

    @property
    def vocab_size(self) -> int:
        """Rows of the embedding table. Input ids outside ``[0, vocab_size)`` crash real SGLang; the
        server checks them before any call reaches the core."""
        ...

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Ids that end generation unless the request sets ``ignore_eos`` (Qwen: ``<|im_end|>``)."""
        ...

    @property
    def context_length(self) -> int:
        """Maximum prompt + completion length; the server rejects longer requests with SGLang's message."""
        ...

    @property
    def weight_version(self) -> str:
        """Label of the weights now loaded ("default" until an update names one)."""
        ...

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> AsyncGenerator[TokenStep, None]:
        """Sample up to ``sampling.max_new_tokens`` tokens after ``prompt_ids``, one step per token.

        The core must not stop on eos by itself (eos is only another token; ``ignore_eos`` requests
        keep sampling it). The server stops pulling when SGLang would finish and then calls
        ``aclose()``: a core must free the request's slot and cache in a ``finally`` block. The server
        only calls this with ``max_new_tokens >= 1``.
        """
        ...

    async def score(self, ids: Sequence[int], start: int, top_k: int) -> InputScores:
        """Log-probs of ``ids[start:]`` given their prefixes (1 <= start <= len(ids)), unscaled.

        The server maps SGLang's ``logprob_start_len = k`` to ``start = k + 1`` and adds the ``null``
        entry for ``ids[k]`` itself, so both cores share that off-by-one.
        """
        ...

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None) -> None:
        """Load new weights from ``model_path``; when ``weight_version`` is given, report it from now on.

        Requests in flight may continue across the update; each ``TokenStep`` states the version that
        produced it. Raise (any exception) to make the HTTP call answer ``success: false``.
        """
        ...

    def flush_cache(self) -> None:
        """Drop any prefix/KV cache that is not in use (``/flush_cache``); a no-op for cacheless cores."""
        ...


async def sample_tokens(core: EngineModel, prompt: Sequence[int], n_new: int, temperature: float = 1.0,
                        seed: int | None = None) -> tuple[list[int], list[float]]:
    """``n_new`` tokens sampled from ``core`` without truncation (top-p 1, no top-k or min-p) and their
    log-probs: how the trainer tests and the teacher-mismatch bench draw responses straight from a core."""
    ids: list[int] = []
    lps: list[float] = []
    cfg = SamplingConfig(temperature=temperature, top_p=1.0, top_k=-1, min_p=0.0, max_new_tokens=n_new, seed=seed)
    async for step in core.generate(prompt, cfg):
        ids.append(step.token_id)
        lps.append(step.logprob)
        if len(ids) == n_new:
            break
    return ids, lps
