"""The one rollout bridge between Slime's hooks and the proxy runtime; every mode's hooks call it.

Slime loads hooks by dotted path and calls them with its ``args``, so the proxy must live in a
module-level object: ``_RUNTIMES`` is that single, documented exception to "no global state" (one
runtime per process, created on the first rollout call, exactly like upstream's worker). The hooks:

* ``rollout(args, rollout_id, evaluation, mode)``: acknowledge the batches whose training is durable
  (:func:`durable_step`), open the gate, wait for ``args.rollout_batch_size`` samples, close the gate,
  return ``RolloutFnTrainOutput``;
* ``eval_generate`` / ``eval_reward``: Slime's ``--custom-generate-function-path`` and
  ``--custom-rm-path`` for its eval datasets (upstream §4.6), without re-tokenising sampled text.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
from typing import Any

import httpx

from openclaw_rl.config import load_settings, load_yaml
from openclaw_rl.runtime import ProxyRuntime

from .samples import RolloutFnTrainOutput, Sample, to_slime_groups

log = logging.getLogger(__name__)

_RUNTIMES: dict[str, ProxyRuntime] = {}
_LOCK = threading.Lock()
_TOKENIZERS: dict[str, Any] = {}
_CLIENTS: dict[int, httpx.AsyncClient] = {}  # one pooled client per event loop (eval hooks)


def settings_from_args(args: Any, mode: str):
    extra = load_yaml(args.openclaw_config) if getattr(args, "openclaw_config", None) else {}
    settings = load_settings({**extra, "mode": mode}, slime_args=args)
    if settings.proxy.per_user_adapters:
        from openclaw_rl.launch.refusals import PER_USER_ON_SLIME

        raise RuntimeError(PER_USER_ON_SLIME)
    return settings


def get_runtime(args: Any, mode: str) -> ProxyRuntime:
    with _LOCK:
        runtime = _RUNTIMES.get(mode)
        if runtime is None or not runtime.server.running:
            runtime = _RUNTIMES[mode] = ProxyRuntime(settings_from_args(args, mode))
            atexit.register(runtime.stop)
        return runtime


def shutdown_runtimes() -> None:
    """Stop every runtime of this process (tests; Slime exits through atexit)."""
    with _LOCK:
        for runtime in _RUNTIMES.values():
            runtime.stop()
        _RUNTIMES.clear()


def durable_step(args: Any, rollout_id: int) -> int | None:
    """The last rollout id whose batch may leave the spool when Slime asks for batch ``rollout_id``.

    ``train_async.py`` calls ``generate(k + 1)`` *before* step k trains, so when ``generate(j)`` starts,
    steps <= j - 2 have trained (step j - 1 may be training now). Slime saves after step s when
    ``(s + 1) % save_interval == 0`` (and at the last rollout), synchronously unless ``--async-save``.
    Under ``--async-save`` (both Slimes' ``save_model``) a save first finalizes the previous one, blocking
    (Megatron writes the tracker file ``--load`` reads only then), and the driver waits for ``save_model``:
    checkpoint s is complete once save s + save_interval has started, one interval later.
    With ``--save`` a batch is acknowledged only once a checkpoint holds its step, so a relaunch
    (``--load`` = ``--save``) resumes from that checkpoint and the unacknowledged batches after it are
    handed back and trained again: a crash costs recomputation, never samples. Without ``--save``
    there is nothing durable to wait for and a batch is acknowledged once its step has trained.
    """
    trained = rollout_id - 2
    if trained < 0:
        return None
    interval = getattr(args, "save_interval", None)
    if not getattr(args, "save", None) or not interval:
        return trained
    if getattr(args, "async_save", False):
        trained -= int(interval)  # an async checkpoint is complete once the next one has been requested
    saved = (trained + 1) // int(interval) * int(interval) - 1
    return saved if saved >= 0 else None


def rollout(args: Any, rollout_id: int, evaluation: bool, mode: str) -> Any:
    if evaluation:
        from slime.rollout.sglang_rollout import eval_rollout
        from slime.utils.async_utils import run

        output, _ = run(eval_rollout(args, rollout_id))
        return output
    runtime = get_runtime(args, mode)
    done = durable_step(args, rollout_id)
    if done is not None:
        runtime.ack_through(done)
    n = int(args.rollout_batch_size) * int(getattr(args, "n_samples_per_prompt", 1) or 1)
    batch = runtime.collect(n, step=rollout_id)
    log.info("rollout %d: %d samples in %.1fs (%s)", rollout_id, len(batch.samples),
             batch.metrics.get("rollout/batch_fill_seconds", 0.0), mode)
    opd = runtime.settings.opd
    topk = opd.distill_topk if opd.teacher_source == "trainer" else 0  # the top-K the actor's teacher computes
    return RolloutFnTrainOutput(samples=to_slime_groups(batch.samples, topk), metrics=batch.metrics)


# --- eval path ------------------------------------------------------------------------------------


def _tokenizer(path: str) -> Any:
    if path not in _TOKENIZERS:
        from transformers import AutoTokenizer

        _TOKENIZERS[path] = AutoTokenizer.from_pretrained(path)
    return _TOKENIZERS[path]


def _client() -> httpx.AsyncClient:
    loop = asyncio.get_running_loop()
    if id(loop) not in _CLIENTS:
        _CLIENTS[id(loop)] = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0), trust_env=False)
    return _CLIENTS[id(loop)]


async def eval_generate(args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False) -> Sample:
    """Generate one eval response token-exactly through the policy's /generate."""
    settings = settings_from_args(args, "rl")
    tok = _tokenizer(settings.proxy.tokenizer)
    messages = sample.prompt if isinstance(sample.prompt, list) else [{"role": "user", "content": str(sample.prompt)}]
    prompt_ids = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tok.encode(prompt_ids, add_special_tokens=False)
    resp = await _client().post(f"{settings.proxy.policy_url.rstrip('/')}/generate",
                                json={"input_ids": prompt_ids, "sampling_params": sampling_params, "return_logprob": True})
    resp.raise_for_status()
    data = resp.json()
    meta = data["meta_info"]
    triples = meta.get("output_token_logprobs") or []
    output_ids = [int(t) for t in data["output_ids"]]
    if [int(t[1]) for t in triples] != output_ids:
        raise RuntimeError("policy /generate returned log-probs that do not match its output ids")
    sample.tokens = prompt_ids + output_ids
    sample.response = data.get("text", "")
    sample.response_length = len(output_ids)
    sample.rollout_log_probs = [float(t[0]) for t in triples]
    sample.loss_mask = [1] * len(output_ids)
    fr = (meta.get("finish_reason") or {}).get("type")
    sample.status = Sample.Status.TRUNCATED if fr == "length" else Sample.Status.COMPLETED
    return sample


async def eval_reward(args: Any, sample_or_samples: Sample | list[Sample], **kwargs: Any) -> Any:
    """Upstream's reward_func: the stored reward's ``score`` (0.0 when there is none)."""
    def score(s: Sample) -> dict[str, float]:
        return {"score": float(s.reward.get("score", 0.0)) if isinstance(s.reward, dict) else 0.0}

    if isinstance(sample_or_samples, list):
        return [score(s) for s in sample_or_samples]
    return score(sample_or_samples)
