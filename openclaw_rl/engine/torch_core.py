"""``TorchModel``: the real engine core, a continuous-batching KV-cache sampler over a HF causal LM.

Stage: engine server → **torch core** → token ids with log-probs. Concurrent ``generate`` calls are
merged by one scheduler task into shared forward passes: new prompts are prefilled (equal lengths
together, no padding), then every active request advances by one token per batched decode step over
a left-padded KV cache with an explicit attention mask and per-row position ids (the torch work runs
in one worker thread, up to ``LOOKAHEAD`` steps per hand-off, so the event loop never blocks). It
computes in fp32, so its log-probs match a trainer's plain full forward to ~1e-6. A prompt that
shares a long head with a recent one (OpenClaw's ~15K-token system prompt and tools, on every turn)
prefills only its new tail on top of the cached KV of that head (``prefix_cache.PrefixCache``; cleared
by every weight update and by ``flush_cache``). It knows nothing about text, chat templates or stop
rules (the server owns those). The batch's rows and KV bookkeeping are ``torch_batch``, one step's
sampling ``sampling``, checkpoints and weight matching ``torch_weights``; this module schedules and runs
the forward passes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import AsyncGenerator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from openclaw_rl.engine.model import InputScores, SamplingConfig, TokenStep
from openclaw_rl.engine.prefix_cache import PrefixCache
from openclaw_rl.engine.sampling import sample_rows, top_pairs
from openclaw_rl.engine.torch_batch import KVBatch, Request
from openclaw_rl.engine.torch_weights import config_eos, forward_kwargs, match_state_dict, read_checkpoint

__all__ = ["LOOKAHEAD", "TorchModel", "forward_kwargs", "read_checkpoint"]  # the last two: torch_weights'

logger = logging.getLogger(__name__)

LOOKAHEAD = 2
"""Steps a request may have computed but not yet pulled; beyond that it sits out decode steps (its
cache column is masked), so a paused or slow consumer never makes the core run ahead of it."""
_GREEDY_BELOW = 1e-6


class TorchModel:
    """An ``EngineModel`` over a Hugging Face causal LM, computing in fp32 on CPU.

    Args:
        model: the LM (the core owns it; converted to fp32 and eval mode).
        tokenizer_vocab_size: ``len(tokenizer)``; sampled logits at ids at or above it are masked, so a
            padded embedding never yields undecodable ids (default: the embedding size, no mask). A
            trainer recomputing rollout log-probs must mask the same ids to agree exactly.
        eos_token_ids: default: the model's generation config and config eos ids.
        max_batch: requests decoded together; later ones wait for a free slot.
        context_length: default: ``config.max_position_embeddings``.
        seed: seeds the per-request generators of requests that carry no ``sampling_seed``.
        prefix_cache_entries: recent prompts whose KV is kept for prefix reuse (0: no prefix cache).
    """

    def __init__(self, model: Any, *, tokenizer_vocab_size: int | None = None,
                 eos_token_ids: Sequence[int] | None = None, max_batch: int = 8,
                 context_length: int | None = None, seed: int = 0, prefix_cache_entries: int = 4):
        self.model = model.float().eval()
        self._cache_kw, self._keep_kw = forward_kwargs(self.model)
        self._vocab_size = int(self.model.get_input_embeddings().num_embeddings)
        self._token_limit = min(tokenizer_vocab_size or self._vocab_size, self._vocab_size)
        self._eos = frozenset(eos_token_ids if eos_token_ids is not None else config_eos(self.model))
        config = self.model.config
        self._context_length = int(context_length or getattr(config, "max_position_embeddings", 0) or 4096)
        self.max_batch = max_batch
        self._weight_version = "default"
        self.weight_updates = 0
        self._seeds = random.Random(seed)
        self._lock = threading.Lock()  # held for a whole scheduler tick, a score pass or a weight copy
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch-core")
        # batch state, touched only by the scheduler's ticks (in the worker thread, under the lock)
        self._batch = KVBatch()
        self.prefixes = PrefixCache(prefix_cache_entries)  # under the lock; cleared whenever weights change
        # event-loop state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._waiting: list[Request] = []
        self.idle_waits = 0  # times the scheduler planned, found nothing to run and waited: a settled core
        self.adapters: Any = None  # an ``adapters.AdapterBank`` once ``enable_lora`` ran (SGLang's --enable-lora)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, max_batch: int = 8, context_length: int | None = None,
                        seed: int = 0, tokenizer_vocab_size: int | None = None,
                        prefix_cache_entries: int = 4) -> TorchModel:
        """Load a checkpoint directory; the tokenizer there is read only to learn its size."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if tokenizer_vocab_size is None:
            tokenizer_vocab_size = len(AutoTokenizer.from_pretrained(path))
        model = AutoModelForCausalLM.from_pretrained(path)
        return cls(model, tokenizer_vocab_size=tokenizer_vocab_size, max_batch=max_batch,
                   context_length=context_length, seed=seed, prefix_cache_entries=prefix_cache_entries)

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

    @property
    def num_requests(self) -> int:
        """Requests holding a batch slot or waiting for one; closed generators leave at the next tick."""
        return len(self._batch.rows) + len(self._waiting)

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> AsyncGenerator[TokenStep, None]:
        if not prompt_ids:
            raise ValueError("TorchModel.generate needs at least one prompt token")
        req = self._new_request(prompt_ids, sampling)
        self._submit(req)
        try:
            for _ in range(sampling.max_new_tokens):
                step = await req.outbox.get()
                if isinstance(step, BaseException):
                    raise step
                self._wake()  # the pull may make the row ready again
                yield step
        finally:
            req.closed = True  # the scheduler drops the row (and its cache) before its next tick
            self._wake()

    async def score(self, ids: Sequence[int], start: int, top_k: int) -> InputScores:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._score, list(ids), start, top_k)

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None) -> None:
        state = await asyncio.to_thread(read_checkpoint, model_path)
        await asyncio.to_thread(self.load_state_dict, state, weight_version, source=model_path)

    def flush_cache(self) -> None:
        """Drop the prefix cache (running requests keep their own KV until they finish)."""
        with self._lock:
            self.prefixes.clear()

    def close(self) -> None:
        """Stop the worker thread once its current job is done (the core is unusable afterwards)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    # --- LoRA adapters (engine/adapters.py) ------------------------------------------------------

    def enable_lora(self, config: Any) -> None:
        """Serve LoRA adapters of `config`'s shape next to the base model (SGLang's ``--enable-lora``)."""
        from openclaw_rl.engine.adapters import AdapterBank

        with self._lock:
            if self.adapters is None:
                self.adapters = AdapterBank(self.model, config)

    def adapter_names(self) -> list[str] | None:
        """The adapters served now; None when LoRA is not enabled."""
        return None if self.adapters is None else self.adapters.names()

    def load_adapter(self, name: str, state: Mapping[str, torch.Tensor], version: str) -> None:
        """Add or replace one adapter between two forward passes; requests already running with it continue
        with the new weights from their next token, as a full weight update does."""
        if self.adapters is None:
            raise ValueError("LoRA is not enabled on this engine")
        with self._lock, torch.no_grad():
            self.adapters.load(name, state, version)

    def unload_adapter(self, name: str) -> None:
        if self.adapters is None:
            raise ValueError("LoRA is not enabled on this engine")
        with self._lock:
            self.adapters.unload(name)

    def _version_of(self, req: Request, version: str) -> str:
        if req.adapter == "__base__" or self.adapters is None:
            return version
        return self.adapters.versions.get(req.adapter, version)

    # --- weights --------------------------------------------------------------------------------

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], version: str | None = None, *,
                        source: str = "state_dict") -> None:
        """Copy new weights in place between two forward passes (waits for at most one); thread-safe.

        Every shape is checked before anything is copied, so a checkpoint of another architecture is
        refused with a ``ValueError`` and the old weights keep serving (real SGLang dies here). Tied
        weights need only one of their names. ``version`` None keeps the current label.
        """
        pairs = match_state_dict(self.model, state_dict, source, peft=self.adapters is not None)
        with self._lock, torch.no_grad():
            for target, tensor in pairs:
                target.copy_(tensor)
            self.prefixes.clear()  # cached KV was computed by the old weights
            self.weight_updates += 1
            if version is not None:
                self._weight_version = str(version)

    # --- scheduling (event loop) ----------------------------------------------------------------

    def _new_request(self, prompt_ids: Sequence[int], s: SamplingConfig) -> Request:
        seed = s.seed if s.seed is not None else self._seeds.getrandbits(63)
        bias_items = [(int(t), float(b)) for t, b in s.logit_bias.items() if 0 <= int(t) < self._vocab_size]
        bias = None
        if bias_items:
            bias = (torch.tensor([t for t, _ in bias_items]), torch.tensor([b for _, b in bias_items]))
        greedy = s.temperature < _GREEDY_BELOW
        truncates = not greedy and (s.top_k > 0 or s.top_p < 1.0 or s.min_p > 0.0)
        if s.adapter is not None and (self.adapters is None or s.adapter not in self.adapters.versions):
            raise ValueError(f"LoRA adapter {s.adapter!r} is not loaded")
        return Request(list(prompt_ids), s, torch.Generator().manual_seed(seed), asyncio.Queue(), bias,
                       1.0 if greedy else float(s.temperature), greedy, truncates, s.adapter or "__base__")

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    def _submit(self, req: Request) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._task is not None and not self._task.done() and self._loop is not None and self._loop.is_running():
                raise RuntimeError("TorchModel is already serving requests on another event loop")
            with self._lock:  # requests of a finished loop can never be pulled again: drop them
                self._batch.reset()
            self._waiting.clear()
            self._loop, self._wakeup, self._task = loop, asyncio.Event(), None
        self._waiting.append(req)
        self._wake()
        if self._task is None:
            self._task = loop.create_task(self._schedule())

    async def _schedule(self) -> None:
        """Runs while any request exists: plan a tick (leaves, joins, ready rows), run it in the worker
        thread, deliver its steps. Exits when idle; the next submit starts it again."""
        assert self._loop is not None and self._wakeup is not None
        try:
            batch = self._batch
            while batch.rows or self._waiting:
                self._wakeup.clear()
                leaving = [r for r in batch.rows if r.closed]
                self._waiting = [r for r in self._waiting if not r.closed]
                free = self.max_batch - len(batch.rows) + len(leaving)
                joining, self._waiting = self._waiting[:free], self._waiting[free:]
                ready = [r for r in batch.rows if not r.closed and r.produced < r.sampling.max_new_tokens
                         and r.outbox.qsize() < LOOKAHEAD]
                if not (leaving or joining or ready):
                    self.idle_waits += 1
                    await self._wakeup.wait()
                    continue
                # Every ready row may take this many steps without exceeding LOOKAHEAD or its budget.
                burst = min((min(LOOKAHEAD - r.outbox.qsize(), r.sampling.max_new_tokens - r.produced)
                             for r in ready), default=1)
                try:
                    steps = await self._loop.run_in_executor(self._executor, self._tick, leaving, joining, ready,
                                                             burst)
                except Exception as exc:  # a failed forward fails its requests, not the server
                    logger.exception("engine tick failed; failing %d requests", len(batch.rows) + len(joining))
                    failed = [*batch.rows, *joining]
                    with self._lock:
                        self._batch.reset()
                    for req in failed:
                        req.outbox.put_nowait(exc)
                    continue
                for req, step in steps:
                    req.outbox.put_nowait(step)
                await asyncio.sleep(0)  # let consumers pull first, so the next tick can be a burst
        finally:
            self._task = None

    # --- ticks (worker thread) ------------------------------------------------------------------

    def _tick(self, leaving: list[Request], joining: list[Request], ready: list[Request],
              burst: int = 1) -> list[tuple[Request, TokenStep]]:
        """Leaves, ``burst`` decode steps of the ready rows, then the joins' prefill. The lock is held
        per forward pass, so a weight update lands between two steps and never mid-forward."""
        out: list[tuple[Request, TokenStep]] = []
        with torch.inference_mode():
            for i in range(burst if ready else 1):
                with self._lock:
                    if i == 0 and leaving:
                        self._batch.remove(leaving)
                    if ready:
                        out += self._decode(ready, self._weight_version)
            if joining:
                with self._lock:
                    out += self._prefill(joining, self._weight_version)
        return out

    def _forward(self, ids: torch.Tensor, cache: Any, rows: Sequence[Request], **kwargs: Any) -> torch.Tensor:
        if self._keep_kw:
            kwargs[self._keep_kw] = 1
        kwargs.update(input_ids=ids, use_cache=True, **{self._cache_kw: cache})
        if self.adapters is not None:  # one adapter (or __base__) per row, mixed in one batch
            return self.adapters.forward([r.adapter for r in rows], **kwargs).logits[:, -1]
        return self.model(**kwargs).logits[:, -1]

    def _prefill(self, joining: list[Request], version: str) -> list[tuple[Request, TokenStep]]:
        """A prompt with a cached head prefills its tail alone on top of that head's KV; the others
        prefill in groups of equal length (no padding). Every prompt's KV is then cached and merged
        into the batch."""
        out = []
        by_length: dict[int, list[Request]] = {}
        for req in joining:
            # the last token must be fed; an adapter's KV is its own, so only base rows share cached heads
            hit = self.prefixes.lookup(req.prompt, len(req.prompt) - 1) if req.adapter == "__base__" else None
            if hit is None:
                by_length.setdefault(len(req.prompt), []).append(req)
                continue
            cache = DynamicCache(hit[1])
            logits = self._forward(torch.tensor([req.prompt[hit[0]:]]), cache, [req])
            out += self._joined(logits, [req], cache, version)
        for group in by_length.values():
            cache = DynamicCache()
            logits = self._forward(torch.tensor([r.prompt for r in group]), cache, group)
            out += self._joined(logits, group, cache, version)
        return out

    def _joined(self, logits: torch.Tensor, group: list[Request], cache: Any,
                version: str) -> list[tuple[Request, TokenStep]]:
        """Sample the first tokens of freshly prefilled rows, cache their prompts' KV, merge them."""
        length = len(group[0].prompt)
        kv = [(item[0], item[1]) for item in cache]
        for i, req in enumerate(group):
            req.pos = length
            if req.adapter != "__base__":
                continue
            self.prefixes.store(req.prompt, kv if len(group) == 1 else
                                [(k[i:i + 1].clone(), v[i:i + 1].clone()) for k, v in kv])
        steps = self._emit(logits, group, version)
        self._batch.merge(kv, group, length)
        return steps

    def _decode(self, ready: list[Request], version: str) -> list[tuple[Request, TokenStep]]:
        """One token for every ready row; rows that are not ready feed a masked dummy column."""
        batch = self._batch
        rows, step = batch.rows, batch.step(ready)
        if step is None:  # the batch was reset (its event loop ended) mid-burst
            return []
        is_ready = step.is_ready
        logits = self._forward(step.ids, batch.cache, rows, attention_mask=batch.mask, position_ids=step.positions)
        if not all(is_ready):
            logits = logits[[i for i, ok in enumerate(is_ready) if ok]]
        chosen = [r for r, ok in zip(rows, is_ready) if ok]
        for req in chosen:
            req.pos += 1
        return self._emit(logits, chosen, version)

    def _emit(self, logits: torch.Tensor, reqs: list[Request], version: str) -> list[tuple[Request, TokenStep]]:
        tokens, logprobs, tops = sample_rows(logits, reqs, self._token_limit)
        for req, token in zip(reqs, tokens):
            req.pending = token
            req.produced += 1
        return [(r, TokenStep(t, lp, top, self._version_of(r, version)))
                for r, t, lp, top in zip(reqs, tokens, logprobs, tops)]

    # --- scoring (worker thread) ----------------------------------------------------------------

    def _score(self, ids: list[int], start: int, top_k: int) -> InputScores:
        """One forward pass, plain ``log_softmax`` (no temperature, no bias, no vocabulary mask), with
        logits only for the scored positions and the one after the input."""
        keep = len(ids) - start + 1
        kwargs: dict[str, Any] = {self._keep_kw: keep} if self._keep_kw else {}
        with self._lock, torch.inference_mode():
            # a cached head may stand in for the ids before the first scored row (position start - 1)
            hit = self.prefixes.lookup(ids, min(start, len(ids)) - 1) if start > 0 else None
            if hit is not None:
                kwargs[self._cache_kw] = DynamicCache(hit[1])
            tail = ids[hit[0]:] if hit is not None else ids
            logits = self.model(input_ids=torch.tensor([tail]), use_cache=hit is not None,
                                **kwargs).logits[0, -keep:]
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # row j: the distribution of ids[start + j]
        targets = torch.tensor(ids[start:], dtype=torch.long).unsqueeze(1)
        token_lps = logprobs[:-1].gather(1, targets).squeeze(1).tolist()
        if top_k <= 0:
            return InputScores(token_lps, [], ())
        values, indices = logprobs.topk(min(top_k, logprobs.shape[-1]), dim=-1)
        tops = [top_pairs(v, i) for v, i in zip(values.tolist(), indices.tolist())]
        return InputScores(token_lps, tops[:-1], tops[-1])

