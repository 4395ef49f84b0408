"""Serve one chat completion: identify the turn, render, generate, parse, answer, and hand it on.

Stage: routes → **serving** → sessions. For a main-line request the exact prompt ids and the sampled
ids + log-probs go to the session tracker; the client gets an OpenAI response, streamed token by token
when it asked for ``stream`` (upstream faked streaming by sending the whole answer at the end). Every
path out of a request (success, backend error, client hang-up) settles its turn exactly once.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from array import array
from collections.abc import AsyncIterator
from typing import Any

from . import codec
from .backend import GenerateResult, PolicyBackend
from .chat import ChatRenderer, normalize_messages
from .config import ProxySettings
from .errors import BadRequest, OpenClawError, error_body
from .gate import SubmissionGate
from .identity import classify_turn, next_state_of, resolve_identity, session_done
from .metrics import ProxyMetrics
from .parsers import OutputParser
from .protocol import ChatCompletionRequest, completion_chunk, completion_response, usage
from .sessions import SessionTracker
from .turns import DropReason, Generation, Turn

log = logging.getLogger(__name__)


def sse(obj: Any) -> bytes:
    return b"data: " + codec.dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class ChatService:
    def __init__(self, cfg: ProxySettings, renderer: ChatRenderer, parser: OutputParser, backend: PolicyBackend,
                 tracker: SessionTracker, gate: SubmissionGate, metrics: ProxyMetrics, keep_messages: bool):
        self.cfg, self.renderer, self.parser, self.backend = cfg, renderer, parser, backend
        self.tracker, self.gate, self.metrics = tracker, gate, metrics
        self.keep_messages = keep_messages or bool(cfg.record_dir)
        self._warned: set[str] = set()

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    def _sampling_params(self, req: ChatCompletionRequest, main: bool) -> tuple[dict[str, Any], float | None]:
        params: dict[str, Any] = {"max_new_tokens": min(req.max_new_tokens() or self.cfg.max_new_tokens,
                                                        self.cfg.max_new_tokens_cap)}
        temperature = req.temperature
        if main and self.cfg.rollout_temperature is not None:
            if req.temperature is not None and req.temperature != self.cfg.rollout_temperature:
                self._warn_once("temperature", "client temperature %s overridden by rollout temperature %s on "
                                "main-line turns, so rollout log-probs match the trainer's", req.temperature,
                                self.cfg.rollout_temperature)
            temperature = self.cfg.rollout_temperature
            params.update(top_p=1.0, top_k=-1, min_p=0.0)
        elif req.top_p is not None:
            params["top_p"] = req.top_p
        if temperature is not None:
            params["temperature"] = temperature
        if req.stop:
            params["stop"] = req.stop_list()
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(req, name):
                params[name] = getattr(req, name)
        return params, temperature

    async def complete(self, req: ChatCompletionRequest, headers: dict[str, str],
                       namespace: str) -> dict[str, Any] | AsyncIterator[bytes]:
        main = classify_turn(self.cfg.turn_classifier, headers, req) == "main"
        self.metrics.turns.labels("main" if main else "side").inc()
        identity = resolve_identity(self.cfg.identity, headers, req)
        if identity.source in ("none", "prefix"):
            self._warn_once("identity", "requests arrive without a session identity; sessions are grouped by "
                            "conversation prefix. For OpenClaw set compat.sendSessionAffinityHeaders: true on the "
                            "model entry (see README).")
        await self.gate.admit()
        key = f"{namespace}\x1f{identity.session_id}"
        messages = normalize_messages(req.messages)
        prompt_text, prompt_ids = self.renderer.render(messages, req.tools, cache_key=key)
        params, temperature = self._sampling_params(req, main)
        payload = {"input_ids": prompt_ids, "sampling_params": params, "return_logprob": True}
        done = session_done(headers, req)
        turn = None
        if main:
            turn = Turn(session_key=key, session_id=identity.session_id, index=0,
                        prompt_ids=array("i", prompt_ids),
                        messages=messages if self.keep_messages else None,
                        tools=[t.model_dump(exclude_none=True) for t in req.tools] if req.tools and self.keep_messages
                        else None,
                        sampling_temperature=temperature, prompt_text=prompt_text if self.cfg.record_dir else None,
                        traceparent=headers.get("traceparent"))
            turn = self.tracker.begin(turn, next_state_of(req.messages))
        ctx = _Reply(req, self, turn, key if done else None, len(prompt_ids), self.renderer.opens_thinking(prompt_text),
                     hashlib.sha1(key.encode("utf-8", "surrogatepass")).hexdigest()[:16])
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
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.tools_enabled = bool(req.tools) and req.tool_choice != "none"
        self.settled = False

    def _settle(self, result: GenerateResult | None, reason: DropReason | None = None, detail: str = "") -> None:
        if self.settled:
            return
        self.settled = True
        if self.turn is not None:
            if result is not None:
                try:
                    gen = Generation.from_lists(result.output_ids, result.logprobs, result.text,
                                                result.finish_reason or "stop", result.weight_version)
                except ValueError as e:
                    self.svc.metrics.inexact.inc()
                    self.svc.tracker.fail(self.turn, DropReason.TOKENS_INVALID, str(e))
                else:
                    self.svc.tracker.complete(self.turn, gen)
            else:
                self.svc.tracker.fail(self.turn, reason or DropReason.GENERATION_FAILED, detail)
        if self.end_key:
            self.svc.tracker.end_session(self.end_key)

    def _finish_reason(self, result: GenerateResult, has_tool_calls: bool) -> str:
        if result.finish_reason == "length":
            return "length"
        return "tool_calls" if has_tool_calls else "stop"

    def _logprobs(self, result: GenerateResult) -> dict[str, Any] | None:
        if not self.req.logprobs:
            return None
        tok = self.svc.renderer.tokenizer
        return {"content": [{"token": tok.decode([i]), "logprob": lp, "bytes": list(tok.decode([i]).encode()),
                             "top_logprobs": []} for i, lp in zip(result.output_ids, result.logprobs)]}

    async def once(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            result = await self.svc.backend.generate(payload, self.routing_key)
        except OpenClawError as e:
            self._settle(None, DropReason.GENERATION_FAILED, e.message)
            raise
        except BaseException:
            self._settle(None, DropReason.CLIENT_DISCONNECTED)
            raise
        self._settle(result)
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
        chunks = self.svc.backend.generate_stream(payload, self.routing_key)
        try:
            first = await chunks.__anext__()  # errors before the first token still get a real HTTP status
        except StopAsyncIteration:
            self._settle(None, DropReason.GENERATION_FAILED, "empty stream")
            raise BadRequest("policy backend returned an empty stream") from None
        except OpenClawError as e:
            self._settle(None, DropReason.GENERATION_FAILED, e.message)
            raise
        except BaseException:
            self._settle(None, DropReason.CLIENT_DISCONNECTED)
            raise
        return self._events(first, chunks)

    async def _events(self, first: GenerateResult, chunks: AsyncIterator[GenerateResult]) -> AsyncIterator[bytes]:
        parser = self.svc.parser.streaming(self.tools_enabled, self.opens_thinking)
        mk = dict(completion_id=self.id, model=self.model, created=self.created)
        last = first
        try:
            yield sse(completion_chunk(**mk, delta={"role": "assistant", "content": ""}))
            for delta in parser.feed(first.text):
                yield sse(completion_chunk(**mk, delta=delta))
            async for snap in chunks:
                last = snap
                for delta in parser.feed(snap.text):
                    yield sse(completion_chunk(**mk, delta=delta))
            self._settle(last)
            for delta in parser.finish(last.text):
                yield sse(completion_chunk(**mk, delta=delta))
            yield sse(completion_chunk(**mk, delta={}, finish_reason=self._finish_reason(last, bool(parser.tool_calls))))
            if self.req.stream_options and self.req.stream_options.include_usage:
                yield sse(completion_chunk(**mk, delta=None, usage_=usage(self.prompt_tokens, len(last.output_ids))))
        except OpenClawError as e:
            self._settle(None, DropReason.GENERATION_FAILED, e.message)
            yield sse(error_body(e))
        except BaseException:
            self._settle(None, DropReason.CLIENT_DISCONNECTED)
            raise
        yield SSE_DONE
