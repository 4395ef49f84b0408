"""``ScriptedModel``: the deterministic fake core behind proxy tests and benchmarks.

Stage: engine server → **scripted core**. A ``responder`` decides the reply text from the prompt ids;
the core "samples" it as NON-CANONICAL ids, one token per UTF-8 byte (added tokens such as ``<think>``
or ``<tool_call>`` keep their single id), then eos. Decoding those ids gives the text back exactly, but
re-encoding the text gives different (merged) ids, so a client that re-tokenises instead of keeping
the sampled ids is caught by an id mismatch. Log-probs come from a ``scorer`` giving log p(token |
prefix), used both for sampled tokens and for teacher scoring, so on-policy/teacher alignment can be
checked exactly. It has no weights, distribution, temperature or cache; it does not stop by itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import struct
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from openclaw_rl.engine.model import InputScores, SamplingConfig, TokenStep, TopLogprobs

Responder = Callable[[list[int]], str]
Scorer = Callable[[Sequence[int], int], float]

DEFAULT_REPLY = "Hello! How can I help you today?"
FORCE_BIAS = 20.0
"""A ``logit_bias`` at least this large forces its token at log-prob 0.0 (what +100 does to a real model)."""
_SCORER_WINDOW = 8  # prefix tokens the default scorer hashes: deterministic, and O(1) per position


def _hash_unit(*values: int) -> float:
    """A deterministic number in [0, 1) from ints (stable across processes, unlike ``hash``)."""
    digest = hashlib.blake2b(struct.pack(f"<{len(values)}q", *values), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def hash_scorer(prefix: Sequence[int], token: int) -> float:
    """Default scorer: a deterministic log-prob in (-4, -0.01) from the last few prefix ids and the token."""
    return -0.01 - 3.99 * _hash_unit(*prefix[-_SCORER_WINDOW:], len(prefix), token)


def byte_level_alphabet() -> dict[int, str]:
    """Byte → printable character of byte-level BPE (the GPT-2 scheme): printable Latin-1 bytes stand for
    themselves, the other 68 are shifted to code points 256 and up, in byte order."""
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    alphabet = {b: chr(b) for b in kept}
    shifted = (b for b in range(256) if b not in alphabet)
    alphabet.update({b: chr(256 + i) for i, b in enumerate(shifted)})
    return alphabet


class ScriptedModel:
    """A deterministic ``EngineModel``: scripted text as byte tokens, scorer log-probs, optional latency.

    Args:
        tokenizer: a byte-level BPE Hugging Face tokenizer (needs ``get_vocab``, ``get_added_vocab``,
            ``eos_token_id``); every one of the 256 byte characters must be a vocabulary token.
        responder: prompt ids → reply text (called once per sample; default: a fixed short reply).
        scorer: (prefix ids, token) → log p(token | prefix) (default: ``hash_scorer``).
        ttft_s: delay before the first token; tokens_per_s: decode rate after it (0 = instant).
        yield_every: while no token is waiting for its time, yield to the event loop only every this many
            tokens (1: after each, so concurrent requests interleave token by token as in a batching
            engine). Each yield costs ~30 µs of the server's CPU: a benchmark's judge mock, whose CPU
            shares the cores with the proxies it measures, yields less often.
    """

    def __init__(self, tokenizer: Any, responder: Responder | None = None, scorer: Scorer | None = None, *,
                 ttft_s: float = 0.0, tokens_per_s: float = 0.0, context_length: int = 4096,
                 eos_token_ids: Sequence[int] | None = None, yield_every: int = 1):
        self.responder = responder or (lambda prompt_ids: DEFAULT_REPLY)
        self.scorer = scorer or hash_scorer
        self.ttft_s = ttft_s
        self.tokens_per_s = tokens_per_s
        self.yield_every = max(1, yield_every)
        self._vocab_size = len(tokenizer)
        self._context_length = context_length
        self._eos = frozenset(eos_token_ids if eos_token_ids is not None else [tokenizer.eos_token_id])
        self._weight_version = "default"
        self.model_path: str | None = None
        """The path of the last ``update_weights_from_disk`` (there are no weights to load)."""
        self.weight_updates = 0
        vocab = tokenizer.get_vocab()
        missing = [ch for ch in byte_level_alphabet().values() if ch not in vocab]
        if missing:
            raise ValueError(f"tokenizer is not byte-level BPE: {len(missing)} byte tokens missing, e.g. {missing[0]!r}")
        self._byte_ids = [vocab[ch] for _, ch in sorted(byte_level_alphabet().items())]
        self._added = dict(tokenizer.get_added_vocab())
        self._added_re = re.compile("|".join(re.escape(t) for t in sorted(self._added, key=len, reverse=True)))

    # --- EngineModel ----------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def context_length(self) -> int:
        return self._context_length

    @property
    def weight_version(self) -> str:
        return self._weight_version

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> AsyncGenerator[TokenStep, None]:
        """The responder's text as byte tokens, then eos repeated (the server stops at the first one
        unless ``ignore_eos``). Temperature does not change anything: the fake has no distribution."""
        forced = max(sampling.logit_bias.items(), key=lambda kv: kv[1], default=None)
        forced_id = forced[0] if forced is not None and forced[1] >= FORCE_BIAS else None
        script = [] if forced_id is not None else self.encode_non_canonical(self.responder(list(prompt_ids)))
        eos = min(self._eos)
        context = list(prompt_ids)
        started = time.monotonic()
        for i in range(sampling.max_new_tokens):
            await self._wait_for_token(started, i)
            token = forced_id if forced_id is not None else (script[i] if i < len(script) else eos)
            logprob = 0.0 if forced_id is not None else self.scorer(context, token)
            top = self._top_logprobs(context, token, logprob, sampling.top_logprobs_num)
            yield TokenStep(token, logprob, top, self._weight_version)
            context.append(token)

    async def score(self, ids: Sequence[int], start: int, top_k: int) -> InputScores:
        ids = list(ids)
        logprobs: list[float] = []
        tops: list[TopLogprobs] = []
        for p in range(start, len(ids)):
            prefix = ids[:p]
            logprobs.append(self.scorer(prefix, ids[p]))
            if top_k:
                tops.append(self._top_logprobs(prefix, ids[p], logprobs[-1], top_k))
        next_top: TopLogprobs = ()
        if top_k:  # no token follows the input: a hash-chosen candidate stands in for the argmax
            guess = int(_hash_unit(*ids[-_SCORER_WINDOW:], len(ids)) * self._vocab_size)
            next_top = self._top_logprobs(ids, guess, self.scorer(ids, guess), top_k)
        return InputScores(logprobs, tops, next_top)

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None) -> None:
        self.model_path = model_path
        self.weight_updates += 1
        if weight_version is not None:
            self._weight_version = weight_version

    def flush_cache(self) -> None:
        pass

    # --- the non-canonical encoding ---------------------------------------------------------------

    def encode_non_canonical(self, text: str) -> list[int]:
        """One id per UTF-8 byte; added tokens (``<think>``, ``<tool_call>``, ``<|im_end|>`` …) as their id."""
        ids: list[int] = []
        pos = 0
        for match in self._added_re.finditer(text) if self._added else ():
            ids += [self._byte_ids[b] for b in text[pos:match.start()].encode()]
            ids.append(self._added[match.group()])
            pos = match.end()
        ids += [self._byte_ids[b] for b in text[pos:].encode()]
        return ids

    # --- helpers --------------------------------------------------------------------------------

    async def _wait_for_token(self, started: float, index: int) -> None:
        """Sleep until token ``index`` is due (absolute schedule, so rounding does not drift); yield
        to the loop even when instant, so concurrent requests interleave as in a batching engine."""
        due = started + self.ttft_s + (index / self.tokens_per_s if self.tokens_per_s > 0 else 0.0)
        wait = due - time.monotonic()
        if wait <= 0.0 and index % self.yield_every:
            return
        await asyncio.sleep(max(0.0, wait))

    def _top_logprobs(self, prefix: Sequence[int], chosen: int, chosen_lp: float, k: int) -> TopLogprobs:
        """A deterministic top-k holding ``chosen``: the others share the remaining mass by halves
        (p_rest/2, p_rest/4, …), so the list is a valid part of a distribution."""
        if k <= 0:
            return ()
        rest = max(1.0 - math.exp(chosen_lp), 1e-9)
        others: list[tuple[float, int]] = []
        seen = {chosen}
        salt = 0
        while len(others) < min(k - 1, self._vocab_size - 1):
            token = int(_hash_unit(*prefix[-_SCORER_WINDOW:], chosen, salt) * self._vocab_size)
            salt += 1
            if token not in seen:
                seen.add(token)
                others.append((math.log(rest * 0.5 ** (len(others) + 1)), token))
        return tuple(sorted([(chosen_lp, chosen), *others], key=lambda pair: -pair[0]))
