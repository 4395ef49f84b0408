"""Wire schemas of the OpenAI-compatible surface (pydantic), in the order of OpenAI's API reference.

Stage: client → **protocol** → serving. Requests are validated here, before any backend work.
Unknown top-level fields are accepted and ignored (OpenClaw forwards arbitrary ``extra_body`` keys);
fields that would change semantics and that we cannot honour are rejected with a 400 naming the field:
``logit_bias`` (a bias would sample away from the policy being trained), ``top_logprobs`` on a streamed
request (a stream carries each token's own log-prob, in a chunk after the text of its snapshot),
structured output, ``n`` above 1. ``seed`` is accepted and not forwarded: OpenAI itself promises no determinism for it.
``tool_choice`` must name a tool the request offers; ``required`` and a named function are not enforced
(constrained decoding would make the sampled tokens something else than the policy's own samples).
Responses are plain dicts built by the small ``*_response``/``*_chunk`` helpers at the end: they are on
the hot path, and pydantic adds nothing to data we construct ourselves.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from . import codec
from .unicode_text import has_lone_surrogate  # re-exported: routes.py and older imports take it from here

# https://platform.openai.com/docs/api-reference/chat/create


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["text"]
    text: str


class OtherPart(BaseModel):
    """image_url, input_audio, file, …: accepted, dropped before templating (text-only policies)."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str

    @field_validator("type")
    @classmethod
    def _not_text(cls, v: str) -> str:
        if v == "text":
            raise ValueError("a text part needs a string 'text' field")
        return v


ContentPart = TextPart | OtherPart


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str
    arguments: str | dict[str, Any] = "{}"

    @field_validator("arguments")
    @classmethod
    def _decodes_to_unicode(cls, v: str | dict[str, Any]) -> str | dict[str, Any]:
        """A JSON ``arguments`` string is decoded for the chat template (chat.py): an escape inside it
        (``"{\\"p\\": \\"\\\\ud800\\"}"``) would decode to a lone surrogate after the body's check."""
        if isinstance(v, str) and ("\\ud" in v or "\\uD" in v):
            try:
                decoded = json.loads(v)
            except (json.JSONDecodeError, RecursionError):
                return v  # not JSON: rendered as the string itself
            if has_lone_surrogate(decoded):
                raise ValueError("tool call arguments decode to a lone UTF-16 surrogate (\\ud800-\\udfff): "
                                 "not valid Unicode")
        return v


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


MAX_SESSION_ID_CHARS = 512
"""The longest session id accepted, in a chat request (any resolver) and in ``/v1/feedback``."""

Finite = Annotated[float, Field(allow_inf_nan=False)]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | Annotated[list[ContentPart], Field(min_length=1)] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        if self.content is None and self.role in ("system", "developer", "user", "tool"):
            raise ValueError(f"a '{self.role}' message needs 'content'")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a 'tool' message needs the 'tool_call_id' of the call it answers")
        if self.role == "assistant" and self.content is None and not self.tool_calls:
            # OpenAI accepts this, templates render it as empty; keep it but make it explicit.
            self.content = ""
        return self

    def text(self) -> str:
        """The message's text: a string as is, a part list as its text parts joined by spaces."""
        if isinstance(self.content, str):
            return self.content
        if not self.content:
            return ""
        return " ".join(p.text for p in self.content if isinstance(p, TextPart))


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)  # shared by requests: ``Tool``
    name: Annotated[str, Field(min_length=1, max_length=256)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


def _json_of(value: dict[str, Any]) -> bytes:
    """``value``'s JSON if it reads back as the same value, types included, else ``b""``: an int beyond
    64 bits (orjson reads it as a float), NaN, a tuple (made in Python, not parsed) do not."""
    try:
        data = codec.dumps(value)
        back = codec.loads(data)
    except (TypeError, ValueError):
        return b""
    return data if back == value and codec.dumps(back) == data else b""


class Tool(BaseModel):
    """Frozen: requests that send the same tool list share its instances (``toolcache.py``)."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    type: Literal["function"] = "function"
    function: FunctionDefinition
    _dumped: bytes = PrivateAttr(default=b"")  # its JSON, once ``keep_dump`` has made it (b"": none)

    def keep_dump(self) -> None:
        """Keep this (frozen) tool's ``model_dump(exclude_none=True)`` as JSON, for a tool that requests
        share (``toolcache.py``): left empty where the JSON does not read back as the same value."""
        self.__pydantic_private__["_dumped"] = _json_of(super().model_dump(exclude_none=True))

    def model_dump(self, *, exclude_none: bool = False, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        """pydantic's ``model_dump``; after ``keep_dump``, ``model_dump(exclude_none=True)`` (the renderer's
        call, and a kept turn's) is parsed from the kept JSON: the same value, a fresh dict each call, for ~2/3
        of the CPU (17 against 25 µs for the bench's twelve tools, ``scripts/bench_loop_bits.py``)."""
        if exclude_none is True and not kwargs:
            dumped = self.__pydantic_private__["_dumped"]  # a slot: ``self._dumped`` goes through __getattr__
            if dumped:
                return codec.loads(dumped)  # type: ignore[no-any-return]
        return super().model_dump(exclude_none=exclude_none, **kwargs)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Tool:
        """pydantic's ``model_copy``; a copy with other fields (``update``) has no kept JSON (it dumps them)."""
        copied = super().model_copy(update=update, deep=deep)
        if update:
            copied.__pydantic_private__["_dumped"] = b""
        return copied

    def __eq__(self, other: object) -> bool:
        """pydantic's equality but for the kept JSON, a cache of the fields (pydantic compares private
        attributes): a kept tool equals the same tool validated afresh."""
        if isinstance(other, Tool):
            return (type(self) is type(other) and self.__dict__ == other.__dict__
                    and self.__pydantic_extra__ == other.__pydantic_extra__)
        return super().__eq__(other)



def _keep_dumps(tools: list[Tool]) -> None:
    for tool in tools:
        tool.keep_dump()


TOOLS_CACHE = "openclaw_tools_cache"
"""The validation-context key of a ``toolcache.ToolsCache``: ``ChatCompletionRequest.model_validate(raw,
context={TOOLS_CACHE: cache})`` validates a tool list it has seen once (routes.parse_chat_request)."""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    model: str | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2, allow_inf_nan=False)
    logit_bias: dict[str, Finite] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2, allow_inf_nan=False)
    response_format: dict[str, Any] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    reasoning_effort: str | None = None
    prompt_cache_key: str | None = None

    # --- openclaw extensions (upstream OpenClaw-RL's body fields; headers take precedence) -------------
    session_id: str | None = None
    turn_type: str | None = None
    session_done: bool | int | str | None = None

    @field_validator("n")
    @classmethod
    def _single_choice(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported: every choice would be a separate training turn")
        return v

    @field_validator("tools", mode="wrap")
    @classmethod
    def _tools_once(cls, v: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        cache = info.context.get(TOOLS_CACHE) if isinstance(info.context, dict) else None
        return handler(v) if cache is None else cache.validate(v, handler, _keep_dumps)

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop sequences")
        if v == "" or (isinstance(v, list) and "" in v):
            raise ValueError("a stop sequence cannot be empty")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v:
            raise ValueError("logit_bias is not supported by the training proxy: it would sample away from the "
                             "policy being trained")
        return v

    @field_validator("response_format")
    @classmethod
    def _plain_text_only(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type", "text") != "text":
            raise ValueError("structured output (response_format) is not supported by the training proxy")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if isinstance(v, str) and v not in ("auto", "none", "required"):
            raise ValueError("tool_choice must be 'auto', 'none', 'required' or a function object")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if self.top_logprobs and self.stream:
            raise ValueError("top_logprobs come with non-streamed replies only (stream=false); a stream carries each "
                             "token's own log-prob")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        choice = self.tool_choice
        if choice not in (None, "auto", "none"):
            offered = {t.function.name for t in self.tools or []}
            if not offered:
                raise ValueError("tool_choice other than 'auto' or 'none' needs 'tools'")
            named = ((choice.get("function") or {}).get("name") if isinstance(choice, dict) else None)
            if isinstance(choice, dict) and named not in offered:
                raise ValueError(f"tool_choice names a function the request's tools do not offer: {named!r}")
        return self

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class FeedbackRequest(BaseModel):
    """``POST /v1/feedback``: an explicit rating of a session's latest turn (openclaw-rl extension)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    session_id: Annotated[str, Field(min_length=1, max_length=MAX_SESSION_ID_CHARS)]
    rating: Literal[1, -1, 0]
    text: Annotated[str, Field(max_length=32_000)] | None = None


# --- responses -------------------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens}
    if reasoning_tokens:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


def completion_response(*, completion_id: str, model: str, message: dict[str, Any], finish_reason: str,
                        usage_: dict[str, Any], logprobs: dict[str, Any] | None = None,
                        created: int | None = None) -> dict[str, Any]:
    return {
        "id": completion_id, "object": "chat.completion", "created": created or int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}],
        "usage": usage_,
    }


def completion_chunk(*, completion_id: str, model: str, created: int, delta: dict[str, Any] | None,
                     finish_reason: str | None = None, usage_: dict[str, Any] | None = None,
                     logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    choices = [] if delta is None else [
        {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]
    chunk: dict[str, Any] = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                             "model": model, "choices": choices}
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk


def models_response(model: str, max_model_len: int | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": model, "object": "model", "created": 0, "owned_by": "openclaw-rl"}
    if max_model_len:
        entry["max_model_len"] = max_model_len
    return {"object": "list", "data": [entry]}
