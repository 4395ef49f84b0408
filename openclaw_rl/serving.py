"""Serve one chat completion: identify the turn, render, generate, parse, answer, and hand it on.

Stage: routes → **serving** → sessions. For a main-line request the exact prompt ids and the sampled
ids + log-probs go to the session tracker; the client gets an OpenAI response, streamed token by token
when it asked for ``stream`` (upstream faked streaming by sending the whole answer at the end). Every
path out of a request (success, backend error, client hang-up) settles its turn exactly once, and a
settling that raises drops the turn with a reason instead of wedging its session.

Rendering and tokenising run on a dedicated thread, never on the event loop, so one huge request
cannot stall other requests or ``/healthz``; prompts over ``BULK_BYTES`` get a second thread (and skip
the prefix cache) so they cannot hold up ordinary turns either. A turn is committed to the spool
before the last byte of its reply is sent (the final chunk, or the whole non-streaming body).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from array import array
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from . import codec
from .backend import GenerateResult, PolicyBackend, check_output_values
from .chat import ChatRenderer, normalize_messages, side_cache_key
from .config import ProxySettings
from .engines import routing_key
from .errors import (
    BackendUnavailable,
    BadRequest,
    ContextLengthExceeded,
    GenerationAborted,
    NotDurable,
    OpenClawError,
    error_body,
    internal_error_body,
)
from .gate import SubmissionGate
from .identity import classify_turn, next_state_of, resolve_identity, session_done
from .ids import UniqueIds
from .idstext import IdsText, text_problem
from .loopwait import thread_result
from .metrics import ProxyMetrics, log_safe
from .parsers import OutputParser
from .protocol import ChatCompletionRequest, completion_chunk, completion_response, usage
from .sessions import SessionTracker
from .spool import SpoolMissing
from .threadname import name_os_thread
from .turns import DropReason, Generation, Turn
from .users.adapters import AdapterDirectory

log = logging.getLogger(__name__)


def sse(obj: Any) -> bytes:
    return b"data: " + codec.dumps(obj) + b"\n\n"


class ChunkBytes:
    """One reply's ``chat.completion.chunk`` events as SSE bytes. The fixed part of a content chunk
    (id, model, created, the choice's frame) is serialised once; each delta costs one small dump.
    The bytes are exactly ``sse(completion_chunk(...))``'s (checked by the tests)."""

    def __init__(self, completion_id: str, model: str, created: int):
        self.mk = dict(completion_id=completion_id, model=model, created=created)
        head = sse(completion_chunk(**self.mk, delta={}))
        cut = head.index(b'"delta":') + len(b'"delta":')
        self._open, self._close = head[:cut], head[cut + 2:]  # around the empty delta "{}"

    def role(self) -> bytes:
        return self.chunk(delta={"role": "assistant", "content": ""})

    def deltas(self, deltas: list[dict[str, Any]]) -> bytes:
        return b"".join([self._open + codec.dumps(d) + self._close for d in deltas])

    def chunk(self, **fields: Any) -> bytes:
        return sse(completion_chunk(**self.mk, **fields))


SSE_DONE = b"data: [DONE]\n\n"
BULK_BYTES = 1 << 20  # request bodies above this render on their own thread, without the prefix cache
DURABLE_WAIT_S = 30.0  # the longest a reply waits for its turn's commit; then it is refused (503), never a 200
_PENALTIES = ("presence_penalty", "frequency_penalty")  # client knobs that reshape the sampled distribution


class ChatService:
    def __init__(self, cfg: ProxySettings, renderer: ChatRenderer, parser: OutputParser, backend: PolicyBackend,
                 tracker: SessionTracker, gate: SubmissionGate, metrics: ProxyMetrics, keep_messages: bool):
        self.cfg, self.renderer, self.parser, self.backend = cfg, renderer, parser, backend
        self.tracker, self.gate, self.metrics = tracker, gate, metrics
        self.keep_messages = keep_messages or bool(cfg.record_dir)
        self.adapters: AdapterDirectory | None = AdapterDirectory() if cfg.per_user_adapters else None
        self._warned: set[str] = set()
        self.ids = UniqueIds()  # completion ids: unique, not secrets (ids.py)
        self.context_length: int | None = cfg.context_length or None  # learned from the server when 0
        # The longest vocabulary entry in UTF-8 bytes: no token covers more, so text of B bytes has at least
        # B / this many tokens. Lets a prompt that cannot fit be refused before it is rendered at all.
        vocab = renderer.tokenizer.get_vocab() if hasattr(renderer.tokenizer, "get_vocab") else {}
        self.max_token_bytes = max((len(t.encode("utf-8", "surrogatepass")) for t in vocab), default=0)
        # One thread owns the renderer's prefix cache (no locking needed); bulk prompts get their own.
        self._render_pool = ThreadPoolExecutor(1, thread_name_prefix="openclaw-render", initializer=name_os_thread)
        self._bulk_pool = ThreadPoolExecutor(1, thread_name_prefix="openclaw-render-bulk", initializer=name_os_thread)

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    def max_new_tokens(self, requested: int | None, prompt_tokens: int) -> int:
        """The client's value (or the default), clamped to the cap and to the room the context leaves.
        A prompt that leaves no room is OpenAI's ``context_length_exceeded`` 400."""
        max_new = min(requested or self.cfg.max_new_tokens, self.cfg.max_new_tokens_cap)
        context = self.context_length
        if context:
            if prompt_tokens >= context:
                raise ContextLengthExceeded(
                    f"This model's maximum context length is {context} tokens. However, your messages resulted in "
                    f"{prompt_tokens} tokens. Please reduce the length of the messages.", param="messages")
            max_new = min(max_new, context - prompt_tokens)
        return max_new

    def _sampling_params(self, req: ChatCompletionRequest, main: bool,
                         prompt_tokens: int = 0) -> tuple[dict[str, Any], float | None]:
        params: dict[str, Any] = {"max_new_tokens": self.max_new_tokens(req.max_new_tokens(), prompt_tokens)}
        temperature = req.temperature
        if main and self.cfg.rollout_temperature is not None:
            if req.temperature is not None and req.temperature != self.cfg.rollout_temperature:
                self._warn_once("temperature", "client temperature %s overridden by rollout temperature %s on "
                                "main-line turns, so rollout log-probs match the trainer's", req.temperature,
                                self.cfg.rollout_temperature)
            temperature = self.cfg.rollout_temperature
            params.update(top_p=1.0, top_k=-1, min_p=0.0)
            penalties = [name for name in _PENALTIES if getattr(req, name)]
            if penalties:  # they reshape the distribution as top_p would: the trainer's log-probs would differ
                self._warn_once("penalties", "client %s dropped on main-line turns, so rollout log-probs match "
                                "the trainer's", " and ".join(penalties))
        else:
            if req.top_p is not None:
                params["top_p"] = req.top_p
            for name in _PENALTIES:
                if getattr(req, name):
                    params[name] = getattr(req, name)
        if temperature is not None:
            params["temperature"] = temperature
        if req.stop:
            params["stop"] = req.stop_list()
        if self.renderer.format.markup_is_special:  # e.g. Mistral's [THINK] / [TOOL_CALLS]: the parsers need them
            params["skip_special_tokens"] = False
        return params, temperature

    def close(self) -> None:
        self._render_pool.shutdown(wait=False, cancel_futures=True)
        self._bulk_pool.shutdown(wait=False, cancel_futures=True)

    def _prepare(self, req: ChatCompletionRequest, cache_key: str | None
                 ) -> tuple[list[dict[str, Any]], str, array]:
        messages = normalize_messages(req.messages)
        if self.context_length and self.max_token_bytes:
            text_bytes = sum(len(m["content"].encode("utf-8", "surrogatepass")) for m in messages)
            at_least = text_bytes // self.max_token_bytes
            if at_least >= self.context_length:
                raise ContextLengthExceeded(
                    f"This model's maximum context length is {self.context_length} tokens. However, your messages "
                    f"resulted in at least {at_least} tokens. Please reduce the length of the messages.",
                    param="messages")
        prompt_text, prompt_ids = self.renderer.render_ids(messages, req.tools, cache_key=cache_key, plain=True)
        return messages, prompt_text, prompt_ids

    async def complete(self, req: ChatCompletionRequest, headers: dict[str, str],
                       namespace: str, body_bytes: int = 0) -> dict[str, Any] | AsyncIterator[bytes]:
        main = classify_turn(self.cfg.turn_classifier, headers, req) == "main"
        identity = resolve_identity(self.cfg.identity, headers, req)  # a 400 here: no turn, nothing counted
        self.metrics.turns.labels("main" if main else "side").inc()
        if identity.source in ("none", "prefix"):
            self._warn_once("identity", "requests arrive without a session identity; sessions are grouped by "
                            "conversation prefix. For OpenClaw set compat.sendSessionAffinityHeaders: true on the "
                            "model entry (see README).")
        await self.gate.admit()
        key = f"{namespace}\x1f{identity.session_id}"
        bulk = body_bytes > BULK_BYTES
        # side turns (heartbeats, memory flushes: another conversation on the same session id) cache their
        # prefix under their own key, so they never replace the main line's
        cache_key = None if bulk else key if main else side_cache_key(key)
        messages, prompt_text, prompt_ids = await thread_result(
            (self._bulk_pool if bulk else self._render_pool).submit(self._prepare, req, cache_key))
        params, temperature = self._sampling_params(req, main, len(prompt_ids))
        payload = {"input_ids": prompt_ids, "sampling_params": params, "return_logprob": True}
        adapter = self.adapters.served(namespace) if self.adapters is not None else None
        if adapter is not None:  # the user's own adapter (users/adapters.py); the base model until it exists
            payload["lora_path"] = adapter.name
        if req.top_logprobs:
            payload["top_logprobs_num"] = req.top_logprobs
        done = session_done(headers, req)
        turn = None
        if main:
            turn = Turn(session_key=key, session_id=identity.session_id, index=0,
                        prompt_ids=prompt_ids,
                        messages=messages if self.keep_messages else None,
                        tools=[t.model_dump(exclude_none=True) for t in req.tools] if req.tools and self.keep_messages
                        else None,
                        sampling_temperature=temperature, prompt_text=prompt_text if self.cfg.record_dir else None,
                        traceparent=headers.get("traceparent"))
            turn = self.tracker.begin(turn, next_state_of(req.messages))
        ctx = _Reply(req, self, turn, key if done else None, len(prompt_ids), self.renderer.opens_thinking(prompt_text),
                     routing_key(key))
        # an external SGLang labels LoRA tokens with the base's version: a versioned name says the adapter's (the
        # embedded engine labels each token itself, which stays right when the adapter is replaced mid-request)
        ctx.adapter_version = adapter.version if adapter is not None and adapter.versioned_name else None
        if req.stream:
            return await ctx.stream(payload)
        return await ctx.once(payload)


class _Reply:
    """One request's answer; settles its turn exactly once."""

    def __init__(self, req: ChatCompletionRequest, svc: ChatService, turn: Turn | None, end_session_key: str | None,
                 prompt_tokens: int, opens_thinking: bool, routing_key: str):
        self.req, self.svc, self.turn, self.end_key = req, svc, turn, end_session_key
        self.routing_key = routing_key
        self.prompt_tokens, self.opens_thinking = prompt_tokens, opens_thinking
        self.model = req.model or svc.cfg.served_model_name
        self.id = f"chatcmpl-{svc.ids.hex()}"
        self.created = int(time.time())
        self.tools_enabled = bool(req.tools) and req.tool_choice != "none"
        self.settled = False
        self.durable: Future | None = None
        self.adapter_version: str | None = None  # the user's adapter version this turn was sampled with

    def _settle(self, result: GenerateResult | None, reason: DropReason | None = None, detail: str = "") -> None:
        if self.settled:
            return
        self.settled = True
        try:
            if self.turn is not None:
                if result is not None:
                    # SGLang labels a LoRA request with the base model's version: the adapter's is the one that counts
                    version = result.weight_version
                    if self.adapter_version is not None and not str(version or "").startswith("mixed:"):
                        version = self.adapter_version
                    gen = Generation.from_lists(result.output_ids, result.logprobs, result.text,
                                                result.finish_reason or "stop", version)
                    self.durable = self.svc.tracker.complete(self.turn, gen)
                else:
                    self.svc.tracker.fail(self.turn, reason or DropReason.GENERATION_FAILED, detail)
        except Exception as e:  # a bug or a value nobody foresaw: this turn is lost, its session is not
            log.exception("settling turn %s of session %s failed", getattr(self.turn, "index", "?"),
                          log_safe(getattr(self.turn, "session_id", "?")))
            if self.turn is not None:
                self.svc.tracker.fail(self.turn, DropReason.SETTLE_FAILED, repr(e))
        finally:
            if self.end_key:
                self.svc.tracker.end_session(self.end_key)

    def _settle_failed(self, error: BaseException) -> None:
        """Drop the turn of a request that failed before its answer: the backend's error, or the client gone."""
        if isinstance(error, GenerationAborted):
            self._settle(None, DropReason.ABORTED, error.message)
        elif isinstance(error, OpenClawError):
            self._settle(None, DropReason.GENERATION_FAILED, error.message)
        else:
            self._settle(None, DropReason.CLIENT_DISCONNECTED)

    @contextlib.contextmanager
    def _settled_on_error(self) -> Iterator[None]:
        try:
            yield
        except BaseException as e:
            self._settle_failed(e)
            raise

    def _ids_text(self, payload: dict[str, Any]) -> IdsText:
        """The text of this reply's output ids, decoded as the server decodes them (its skip_special_tokens)."""
        skip = bool((payload.get("sampling_params") or {}).get("skip_special_tokens", True))
        return IdsText(self.svc.renderer.decoder(skip), payload.get("input_ids"))

    def _check_text(self, result: GenerateResult, ids_text: IdsText, final: bool) -> None:
        """The client sees only text of the ids that train (idstext.py): other text drops the turn as
        ``backend_invalid_output`` and the client gets a 502 (or, streaming, an error event)."""
        try:
            text = ids_text.update(result.output_ids)
        except Exception as e:  # noqa: BLE001 - ids the tokenizer cannot decode (e.g. beyond 64 bits)
            problem: str | None = f"its output ids do not decode: {e!r}"
        else:
            trim = 0  # counts only in the final check: not worked out for every streamed snapshot
            if final:
                trim = max((len(s.encode("utf-8")) for s in self.req.stop_list()), default=0) + self.svc.max_token_bytes
            problem = text_problem(result.text, text, final=final, stopped=result.finish_reason == "stop",
                                   trim_bytes=trim)
        if problem is not None:
            self.svc.metrics.inexact.inc()
            self._settle(None, DropReason.BACKEND_INVALID, problem)
            raise BackendUnavailable(f"policy backend answered invalid output: {problem}")

    def _check_values(self, result: GenerateResult) -> None:
        """A final answer with untrainable values: the turn is dropped and the client gets a 502."""
        problem = check_output_values(result, self.svc.renderer.vocab_size)
        if problem is not None:
            self.svc.metrics.inexact.inc()
            self._settle(None, DropReason.BACKEND_INVALID, problem)
            raise BackendUnavailable(f"policy backend answered invalid values: {problem}")

    async def _wait_durable(self) -> None:
        """Hold the reply's last byte until the turn is committed (a crash after it cannot lose the turn).
        A commit that fails or takes over ``DURABLE_WAIT_S`` refuses the reply (NotDurable, 503): the turn
        is dropped as ``not_durable``, the client, which never saw the answer, may retry."""
        fut, self.durable = self.durable, None
        if fut is None:
            return
        try:
            await thread_result(fut, DURABLE_WAIT_S)
            return
        except (TimeoutError, asyncio.TimeoutError):
            reason, detail = "timeout", f"not committed within {DURABLE_WAIT_S:g}s"
        except SpoolMissing as e:
            reason, detail = "spool_missing", str(e)
        except Exception as e:  # the writer logged it and holds the turn in memory, retrying
            reason, detail = "write_failed", f"{type(e).__name__}: {e}"
        self.svc.metrics.not_durable.labels(reason).inc()
        if self.turn is not None:
            self.svc.tracker.fail(self.turn, DropReason.NOT_DURABLE, detail)
        raise NotDurable(f"the proxy could not save this turn to its spool ({detail}); the reply is withheld, "
                         "retry shortly", headers={"Retry-After": "5"})

    def _finish_reason(self, result: GenerateResult, has_tool_calls: bool) -> str:
        if result.finish_reason == "length":
            return "length"
        return "tool_calls" if has_tool_calls else "stop"

    def _logprobs(self, result: GenerateResult) -> dict[str, Any] | None:
        if not self.req.logprobs:
            return None
        if self.req.top_logprobs and result.top_logprobs is None and result.output_ids:
            self.svc._warn_once("top_logprobs", "the policy backend sent no top log-probs (does it take "
                                "top_logprobs_num?): replies carry empty top_logprobs lists")
        return {"content": self._logprob_entries(result.output_ids, result.logprobs, result.top_logprobs)}

    def _logprob_entries(self, ids: list[int], logprobs: list[float],
                         tops: list[list[tuple[float, int]]] | None = None) -> list[dict[str, Any]]:
        """OpenAI's ``logprobs.content`` entries of these tokens (``top_logprobs`` cut to the request's k)."""
        renderer, k = self.svc.renderer, self.req.top_logprobs or 0

        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            return {"token": renderer.tokenizer.decode([token_id]), "logprob": logprob,
                    "bytes": renderer.token_bytes(token_id)}

        return [{**entry(i, lp), "top_logprobs": [entry(t, tlp) for tlp, t in top[:k]]}
                for i, lp, top in zip(ids, logprobs, tops or [()] * len(ids))]

    async def once(self, payload: dict[str, Any]) -> dict[str, Any]:
        with self._settled_on_error():
            result = await self.svc.backend.generate(payload, self.routing_key)
        self._check_values(result)
        self._check_text(result, self._ids_text(payload), final=True)
        self._settle(result)
        await self._wait_durable()
        parsed = self.svc.parser.parse(result.text, self.tools_enabled, self.opens_thinking)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content if (parsed.content or not
                                                                                       parsed.tool_calls) else None}
        if parsed.reasoning is not None:
            message["reasoning_content"] = parsed.reasoning
        if parsed.tool_calls:
            message["tool_calls"] = parsed.tool_calls
        return completion_response(completion_id=self.id, model=self.model, message=message,
                                   finish_reason=self._finish_reason(result, bool(parsed.tool_calls)),
                                   usage_=usage(self.prompt_tokens, len(result.output_ids)),
                                   logprobs=self._logprobs(result), created=self.created)

    async def stream(self, payload: dict[str, Any]) -> AsyncIterator[bytes]:
        chunks = self.svc.backend.generate_stream(payload, self.routing_key, self.svc.cfg.stream_gather_ms / 1000)
        with self._settled_on_error():  # errors before the first token still get a real HTTP status
            first = await anext(chunks, None)
        if first is None:
            self._settle(None, DropReason.GENERATION_FAILED, "empty stream")
            raise BadRequest("policy backend returned an empty stream")
        return self._events(first, chunks, self._ids_text(payload))

    async def _events(self, first: GenerateResult, chunks: AsyncIterator[GenerateResult],
                      ids_text: IdsText) -> AsyncIterator[bytes]:
        """The client's SSE bytes: one write per backend snapshot (the backend coalesces the tokens that
        arrive within ``stream_gather_ms`` of a snapshot into the next one), chunk bytes from templates."""
        parser = self.svc.parser.streaming(self.tools_enabled, self.opens_thinking)
        out = ChunkBytes(self.id, self.model, self.created)
        last = first
        sent = 0  # tokens whose log-probs went out (logprobs=true: a chunk of their own after each snapshot's text)

        def logprob_chunk(snap: GenerateResult) -> bytes:
            nonlocal sent
            if not self.req.logprobs or len(snap.output_ids) <= sent:
                return b""
            entries = self._logprob_entries(snap.output_ids[sent:], snap.logprobs[sent:])
            sent = len(snap.output_ids)
            return out.chunk(delta={}, logprobs={"content": entries})

        try:
            self._check_text(first, ids_text, final=False)
            yield out.role() + out.deltas(parser.feed(first.text)) + logprob_chunk(first)
            async for snap in chunks:
                last = snap
                self._check_text(snap, ids_text, final=False)  # before any of it is sent
                data = out.deltas(parser.feed(snap.text)) + logprob_chunk(snap)
                if data:
                    yield data
            self._check_values(last)
            self._check_text(last, ids_text, final=True)
            self._settle(last)
            tail = out.deltas(parser.finish(last.text))
            await self._wait_durable()
            tail += out.chunk(delta={}, finish_reason=self._finish_reason(last, bool(parser.tool_calls)))
            if self.req.stream_options and self.req.stream_options.include_usage:
                tail += out.chunk(delta=None, usage_=usage(self.prompt_tokens, len(last.output_ids)))
            yield tail + SSE_DONE
            return
        except OpenClawError as e:
            self._settle_failed(e)
            yield sse(error_body(e))
        except Exception as e:  # a bug: the stream still ends properly (error event + [DONE])
            log.exception("streaming a reply failed")
            self._settle(None, DropReason.SETTLE_FAILED, repr(e))
            yield sse(internal_error_body())
        except BaseException as e:
            self._settle_failed(e)
            raise
        yield SSE_DONE
