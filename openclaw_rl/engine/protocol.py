"""Wire schemas of SGLang's native API (0.5.23) for the embedded engine server.

Stage: HTTP body → **protocol** → engine server → model core. ``GenerateRequest.to_items`` turns one
``/generate`` body (single prompt, batch, ``n`` samples) into validated per-sample ``GenerationItem``s,
raising ``EngineRequestError`` with SGLang's own message wherever the golden transcripts show one.
The builders at the end produce SGLang's response dicts with SGLang's key order; they are plain dicts
because they sit on the streaming hot path. Nothing here samples, decodes or touches a model.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

try:
    import orjson
except ImportError:  # pragma: no cover - a declared dependency
    orjson = None  # type: ignore[assignment]

from openclaw_rl.engine.model import SamplingConfig

SGLANG_VERSION = "0.5.23"
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default when sampling_params omits it
FLUSH_CACHE_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
# A weight update under running requests (not paused, or paused in place): SGLang's failure message.
FLUSH_REFUSED = ("Weights were updated, but the cache was not flushed because requests are still running or "
                 "queued. Retract or finish them, then call /flush_cache.")

# Fields of SGLang's GenerateReqInput that would change what is computed and that this engine cannot
# serve: rejected with a 400 naming the field rather than silently ignored.
_UNSUPPORTED_FIELDS = ("input_embeds", "image_data", "video_data", "audio_data", "token_ids_logprob",
                       "custom_logit_processor", "return_hidden_states", "session_params")


class EngineRequestError(ValueError):
    """A request SGLang answers with 400 ``{"error": {"message": ...}}`` (or, streaming, an error event)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class OutOfVocabIds(EngineRequestError):
    """Input ids outside the embedding table. Real SGLang crashes on them; the server decides."""


# --- requests -----------------------------------------------------------------------------------
# https://docs.sglang.ai/basic_usage/sampling_params.html


class SamplingParams(BaseModel):
    """``sampling_params`` of one prompt. Unknown keys (penalties, regex, json_schema …) are ignored."""

    model_config = ConfigDict(extra="ignore")

    max_new_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    logit_bias: dict[str, float] | None = None
    sampling_seed: int | None = None
    stream_interval: int | None = None  # tokens per stream event; None or 0: the server's --stream-interval

    @classmethod
    def parse(cls, raw: dict[str, Any] | None) -> SamplingParams:
        """Validate one dict; explicit ``null`` values mean "default", as SGLang's kwargs do."""
        try:
            params = cls.model_validate({k: v for k, v in (raw or {}).items() if v is not None})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise EngineRequestError(f"Invalid sampling_params.{where}: {first['msg']}.") from None
        params.verify()
        return params

    def verify(self) -> None:
        if self.temperature < 0.0:
            raise EngineRequestError(f"temperature must be non-negative, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise EngineRequestError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise EngineRequestError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.top_k < 1 and self.top_k != -1:
            raise EngineRequestError(f"top_k must be -1 (disable), or at least 1, got {self.top_k}.")
        if self.max_new_tokens is not None and self.max_new_tokens < 0:
            raise EngineRequestError(f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
        if self.n < 1:
            raise EngineRequestError(f"n must be at least 1, got {self.n}.")
        for key in self.logit_bias or {}:
            if not key.lstrip("-").isdigit():
                raise EngineRequestError(f"logit_bias keys must be token ids, got {key!r}.")

    @property
    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(s for s in stops if s)


@dataclass(frozen=True, slots=True)
class GenerationItem:
    """One sequence to produce: a prompt after tokenisation, batching and ``n`` expansion."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    """Effective budget: the request's value, or SGLang's default capped by the context."""
    return_logprob: bool
    logprob_start_len: int
    """-1 (default): no input log-probs; k >= 0: entries for ids[k:], the first one null."""
    top_logprobs_num: int
    return_text_in_logprobs: bool
    lora: str | None = None
    """SGLang's ``lora_path``: the adapter name this output is sampled with (None: the base model)."""

    @property
    def stop_token_ids(self) -> frozenset[int]:
        return frozenset(self.params.stop_token_ids or ())

    @property
    def stop_window(self) -> int:
        """Output tokens whose decoded tail can contain a stop string: every token is >= 1 byte."""
        return max((len(s.encode()) for s in self.params.stop_strings), default=0) + 1

    def sampling_config(self) -> SamplingConfig:
        p = self.params
        bias = {int(k): v for k, v in (p.logit_bias or {}).items()}
        return SamplingConfig(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, min_p=p.min_p,
                              max_new_tokens=self.max_new_tokens, logit_bias=bias,
                              top_logprobs_num=self.top_logprobs_num, seed=p.sampling_seed, adapter=self.lora)


class GenerateRequest(BaseModel):
    """Body of ``POST /generate`` (SGLang's GenerateReqInput). Unknown keys are tolerated, as SGLang does."""

    model_config = ConfigDict(extra="allow")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False

    @property
    def is_batch(self) -> bool:
        """Several prompts: ``input_ids`` as a list of lists (it wins over ``text``), or ``text`` as a list."""
        if self.input_ids is not None:
            return bool(self.input_ids) and isinstance(self.input_ids[0], list)
        return isinstance(self.text, list)

    @property
    def returns_list(self) -> bool:
        """SGLang answers a list for a batch of prompts and for ``n > 1``, an object otherwise."""
        sp = self.sampling_params
        first = sp[0] if isinstance(sp, list) and sp else sp
        n = first.get("n") if isinstance(first, dict) else None
        return self.is_batch or (isinstance(n, int) and n > 1)

    def to_items(self, encode: Callable[[str], list[int]], *, context_length: int,
                 vocab_size: int) -> list[GenerationItem]:
        """Validate in SGLang's order (inputs, sampling params, context, logprob_start_len) and expand
        ``n`` prompt-major. Out-of-vocabulary ids are checked last: SGLang validates everything else
        before its scheduler crashes on them."""
        prompts = self._prompts(encode)
        count = len(prompts)
        sampling = [SamplingParams.parse(raw) for raw in _per_prompt(self.sampling_params, count, "sampling_params")]
        return_logprob = _per_prompt(self.return_logprob, count, "return_logprob")
        start_lens = _per_prompt(self.logprob_start_len, count, "logprob_start_len")
        top_nums = _per_prompt(self.top_logprobs_num, count, "top_logprobs_num")
        # A client rid names one output; n > 1 or an unlisted batch gets fresh ids, as SGLang.
        rids = _per_prompt(self.rid, count, "rid") if isinstance(self.rid, list) or count == 1 else [None] * count
        loras = _per_prompt((self.model_extra or {}).get("lora_path"), count, "lora_path")
        if any(x is not None and not isinstance(x, str) for x in loras):
            raise EngineRequestError("lora_path must be an adapter name (a string), or a list of them per prompt.")
        items = []
        for i, (ids, params) in enumerate(zip(prompts, sampling)):
            max_new = _max_new_tokens(len(ids), params.max_new_tokens, context_length)
            lsl = -1 if start_lens[i] is None else start_lens[i]
            if return_logprob[i] and lsl > len(ids):
                raise EngineRequestError(
                    f"req.logprob_start_len={lsl} is higher than the number of input tokens "
                    f"len(req.origin_input_ids)={len(ids)}. Please use a smaller logprob_start_len.")
            for _ in range(params.n):
                items.append(GenerationItem(
                    rid=rids[i] if rids[i] and params.n == 1 else uuid.uuid4().hex, input_ids=ids, params=params,
                    max_new_tokens=max_new, return_logprob=bool(return_logprob[i]), logprob_start_len=lsl,
                    top_logprobs_num=max(0, top_nums[i] or 0), return_text_in_logprobs=self.return_text_in_logprobs,
                    lora=loras[i] or None))
        for ids in prompts:
            bad = next((t for t in ids if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise OutOfVocabIds(f"Token id {bad} is out of the vocabulary (size {vocab_size}).")
        return items

    def _prompts(self, encode: Callable[[str], list[int]]) -> list[list[int]]:
        extra = self.model_extra or {}
        unsupported = next((name for name in _UNSUPPORTED_FIELDS if extra.get(name)), None)
        if self.input_ids is None and self.text is None:
            if unsupported == "input_embeds":
                raise EngineRequestError("input_embeds is not supported by this engine; send input_ids or text.")
            raise EngineRequestError("Either text, input_ids or input_embeds should be provided.")
        if unsupported is not None:
            raise EngineRequestError(f"{unsupported} is not supported by this engine.")
        # Both given: SGLang uses input_ids (golden `error_both_inputs` is a 200).
        if self.input_ids is not None:
            prompts = self.input_ids if self.is_batch else [self.input_ids]
        else:
            prompts = [encode(t) for t in ([self.text] if isinstance(self.text, str) else self.text)]
        if not prompts or any(not p for p in prompts):
            raise EngineRequestError("The input must contain at least one token.")
        return prompts  # type: ignore[return-value]


def _per_prompt(value: Any, count: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != count:
            raise EngineRequestError(f"{name} has {len(value)} entries but the batch has {count} prompts.")
        return value
    return [value] * count


def _max_new_tokens(input_len: int, requested: int | None, context_length: int) -> int:
    if input_len >= context_length:
        raise EngineRequestError(f"The input ({input_len} tokens) is longer than the model's context "
                                 f"length ({context_length} tokens).")
    if requested is None:
        return min(DEFAULT_MAX_NEW_TOKENS, context_length - input_len)
    if input_len + requested > context_length:
        raise EngineRequestError(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
            f"You requested a total of {input_len + requested} tokens: {input_len} tokens from the input "
            f"messages and {requested} tokens for the completion. Please reduce the number of tokens in "
            f"the input messages or the completion to fit within the limit.")
    return requested


class UpdateWeightsFromDiskRequest(BaseModel):
    """Body of ``POST /update_weights_from_disk``; of SGLang's other keys only ``flush_cache`` (default true)
    is read (load_format … are ignored)."""

    model_config = ConfigDict(extra="allow")
    model_path: str
    weight_version: str | None = None


# --- responses ----------------------------------------------------------------------------------


def finish_length(length: int) -> dict[str, Any]:
    return {"type": "length", "length": length}


def finish_stop(matched: int | str) -> dict[str, Any]:
    return {"type": "stop", "matched": matched}


def finish_abort() -> dict[str, Any]:
    """SGLang's finish reason of a request ended by ``/pause_generation`` in its default ``abort`` mode (or
    an abort of all requests): no status code, unlike an abort that is an error."""
    return {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def weight_version_segments(versions: Sequence[str], current: str) -> list[dict[str, Any]]:
    """Runs of equal versions over the output tokens, as ``[{"version", "start", "end"}]``."""
    if not versions:
        return [{"version": current, "start": 0, "end": 0}]
    segments: list[dict[str, Any]] = []
    for i, version in enumerate(versions):
        if segments and segments[-1]["version"] == version:
            segments[-1]["end"] = i + 1
        else:
            segments.append({"version": version, "start": i, "end": i + 1})
    return segments


def meta_info(*, rid: str, finish_reason: dict[str, Any] | None, prompt_tokens: int, weight_version: str,
              completion_tokens: int, logprobs: dict[str, Any] | None = None,
              weight_versions: list[dict[str, Any]] | None = None, e2e_latency: float | None = None,
              sent_to_client: bool = False) -> dict[str, Any]:
    """``meta_info`` in SGLang's key order. ``logprobs`` holds the five logprob keys (already ordered)
    when ``return_logprob`` is set; ``weight_versions``/``e2e_latency`` only appear on a finished
    output; ``response_sent_to_client_ts`` on non-stream outputs and the first stream chunk."""
    meta: dict[str, Any] = {"id": rid, "finish_reason": finish_reason, "prompt_tokens": prompt_tokens,
                            "weight_version": weight_version, "num_retractions": 0}
    if logprobs is not None:
        meta.update(logprobs)
    meta.update(reasoning_tokens=0, completion_tokens=completion_tokens, cached_tokens=0)
    if weight_versions is not None:
        meta["weight_versions"] = weight_versions
    meta.update(cached_tokens_details=None, dp_rank=None)
    if e2e_latency is not None:
        meta["e2e_latency"] = e2e_latency
    if sent_to_client:
        meta["response_sent_to_client_ts"] = time.time()
    return meta


def logprob_fields(input_logprobs: list[Any], output_logprobs: list[Any], input_top: list[Any] | None,
                   output_top: list[Any] | None, length: int | None = None) -> dict[str, Any]:
    """The logprob block of ``meta_info``; the top lists only when ``top_logprobs_num > 0``.
    ``length`` is the count so far when ``output_logprobs`` is an incremental chunk's slice."""
    fields = {"input_token_logprobs": input_logprobs, "output_token_logprobs": output_logprobs,
              "output_token_logprobs_length": len(output_logprobs) if length is None else length}
    if input_top is not None and output_top is not None:
        fields.update(input_top_logprobs=input_top, output_top_logprobs=output_top)
    return fields


def error_body(message: str) -> dict[str, Any]:
    """Non-stream validation error (400): only ``message`` inside ``error``, as SGLang."""
    return {"error": {"message": message}}


# The keys SGLang 0.5.23 accepts in ``sampling_params``, in the order its "unknown field" 400 lists them.
SAMPLING_FIELDS = ("max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
                   "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
                   "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
                   "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed",
                   "custom_params", "beam_width", "watermark", "choice")


def unknown_field_body(field: str, known: Sequence[str]) -> dict[str, Any]:
    """SGLang 0.5.23's 400 for a ``sampling_params`` key it does not know (streamed or not: a plain JSON
    body, before any stream starts); ``error`` is a string here, not an object."""
    expected = ", ".join(f"`{k}`" for k in known)
    return {"error": f"unknown field `{field}`, expected one of {expected}"}


def stream_error_body(message: str) -> dict[str, Any]:
    """Validation error of a streaming request, sent as a data event on an HTTP 200 stream."""
    return {"error": {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}}


def invalid_body(message: str) -> dict[str, Any]:
    """Undecodable or ill-typed JSON body: SGLang's OpenAI-style envelope, no ``error`` key."""
    return {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}


def compact_json(obj: Any) -> bytes:
    """SGLang's wire JSON (orjson): compact, UTF-8 kept, non-finite floats as null. orjson when it is
    installed (a cumulative stream serialises O(n^2) triples), else the same bytes shape from ``json``."""
    if orjson is not None:
        try:
            return orjson.dumps(obj)
        except TypeError:
            pass
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(obj), ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "surrogatepass")


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def sse_event(obj: Any) -> bytes:
    return b"data: " + compact_json(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


# --- info endpoints -----------------------------------------------------------------------------


def model_info_body(*, model_path: str, served_model_name: str, weight_version: str) -> dict[str, Any]:
    """``/get_model_info``: SGLang's keys; ``embedding`` is reduced to the flags a client might read."""
    return {"model_path": model_path, "served_model_name": served_model_name, "tokenizer_path": model_path,
            "is_generation": True, "preferred_sampling_params": None, "weight_version": weight_version,
            "load_format": "auto", "reasoning_parser": None, "tool_call_parser": None,
            "disaggregation_mode": "null", "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
            "embedding": {"family": "none", "task": "none", "enabled": False}}


def server_info_body(*, model_path: str, served_model_name: str, context_length: int,
                     max_total_num_tokens: int, incremental_streaming_output: bool = False,
                     stream_interval: int = 1, prefix_cache: dict[str, int] | None = None,
                     max_lora_rank: int | None = None) -> dict[str, Any]:
    """``/get_server_info``: a small subset of SGLang's 556 server args plus its status keys; with
    ``prefix_cache``, the embedded core's prefix-cache counters (not an SGLang key; benchmarks read them)."""
    return {**({"prefix_cache": prefix_cache} if prefix_cache is not None else {}),
            "model_path": model_path, "tokenizer_path": model_path, "served_model_name": served_model_name,
            "skip_tokenizer_init": False, "context_length": None, "max_total_tokens": max_total_num_tokens,
            "stream_interval": stream_interval, "incremental_streaming_output": incremental_streaming_output,
            "is_embedding": False, "status": "ready", "max_total_num_tokens": max_total_num_tokens,
            "max_req_input_len": context_length - 1, "internal_states": [{}], "version": SGLANG_VERSION,
            "frontend": "python", "enable_lora": True if max_lora_rank else None, "max_lora_rank": max_lora_rank}


def models_body(*, served_model_name: str, model_path: str, created: int, context_length: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": served_model_name, "object": "model", "created": created,
                                        "owned_by": "sglang", "root": model_path, "parent": None,
                                        "max_model_len": context_length}]}


def update_weights_body(success: bool, message: str) -> dict[str, Any]:
    return {"success": success, "message": message, "num_paused_requests": 0}
