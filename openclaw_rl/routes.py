"""The proxy's request-side route code, shared by the one-process proxy and the ``--workers`` HTTP workers.

Stage: client → **routes** → serving. Bodies are read and size-checked before parsing; the chat route
refuses a request the spool cannot take before the policy spends a generation on it; every error leaves
as OpenAI's error JSON with a 4xx/5xx status (``errors.py``). ``server.make_app`` (one process) and
``workers/app.py`` (a worker process, its tracker in the owner process) build their apps from these.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from . import codec
from .config import ProxySettings
from .errors import (
    BadRequest,
    ClientGone,
    NotDurable,
    OpenClawError,
    Overloaded,
    PayloadTooLarge,
    RequestTimeout,
    error_body,
    internal_error_body,
)
from .loopwait import until_disconnect
from .metrics import ProxyMetrics
from .protocol import TOOLS_CACHE, ChatCompletionRequest, FeedbackRequest, has_lone_surrogate
from .serving import ChatService
from .toolcache import ToolsCache

log = logging.getLogger(__name__)

_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _is_branch_tag(part: Any) -> bool:
    """pydantic's name for a union member in an error's path ("str", "list[union[TextPart,OtherPart]]"):
    not a field of the request. Fields are lower snake_case; members are types."""
    return isinstance(part, str) and ("[" in part or part[:1].isupper() or part in _TYPE_TAGS)


def validation_message(e: ValidationError) -> tuple[str, str | None]:
    """The first error, said of the field. Where a union's first member only says "should be a valid
    string", the member that matched the input's type says more (``content: []``: at least 1 item)."""
    errors = e.errors()
    first = errors[0]
    if first["type"].endswith("_type"):
        first = next((x for x in errors if not x["type"].endswith("_type")
                      and tuple(x["loc"][:-1]) == tuple(first["loc"][:-1])), first)
    param = ".".join(str(p) for p in first.get("loc", ()) if not _is_branch_tag(p)) or None
    return f"invalid request: {first.get('msg')}" + (f" (at {param})" if param else ""), param


async def read_body(request: Request, limit: int, timeout_s: float, declared: str | None = None) -> bytes:
    """The body, size-checked as it arrives and read within ``timeout_s`` (a slow body gets 408).
    ``declared``: its Content-Length header when the caller has looked it up already. Read from the ASGI
    messages (nothing in the app reads a body before its route does)."""
    if declared is None:
        declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the {limit}-byte limit")
    body = bytearray()
    receive = request.receive

    async def read() -> None:  # Starlette's ``request.stream()`` without its async generator (~3 µs a request)
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            if message["type"] != "http.request":
                continue
            body.extend(message.get("body", b""))
            if len(body) > limit:
                raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
            if not message.get("more_body", False):
                return
    try:
        await within(read(), timeout_s)
    except (TimeoutError, asyncio.TimeoutError):
        raise RequestTimeout(f"request body not received within {timeout_s:g}s") from None
    except ClientDisconnect:
        log.info("client hung up on %s after %d bytes of its body", request.url.path, len(body))
        raise ClientGone("client disconnected before its request body was complete") from None
    return bytes(body)


_timeout = getattr(asyncio, "timeout", None)  # Python 3.11+


async def within(work: Any, timeout_s: float) -> Any:
    """``asyncio.wait_for(work, timeout_s)`` for a coroutine: in this task under a deadline
    (``asyncio.timeout``, Python 3.11+) rather than in a task of its own, with a waiter and callbacks."""
    if _timeout is None:  # pragma: no cover - Python 3.10
        return await asyncio.wait_for(work, timeout_s)
    async with _timeout(timeout_s):
        return await work


def header_dict(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """``dict(request.headers)`` built in one pass over the ASGI headers (names as the server lower-cased
    them, values latin-1; a repeated header keeps its first value, as Starlette's ``Headers[name]`` does):
    Starlette's mapping scans the whole list for each name."""
    out: dict[str, str] = {}
    for name, value in raw:
        key = name.decode("latin-1")
        if key not in out:
            out[key] = value.decode("latin-1")
    return out


INLINE_PARSE_BYTES = 64 * 1024  # bodies above this are parsed and validated on a worker thread


def parse_json_body(body: bytes) -> Any:
    try:
        data, unicode_ok = codec.loads_unicode(body)
    except (*codec.DecodeError, RecursionError) as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    # escapes (\\ud800) and, through json's surrogatepass, raw CESU-8 bytes (ED A0 80) can smuggle them in
    if not unicode_ok and has_lone_surrogate(data):
        raise BadRequest("request body contains a lone UTF-16 surrogate (\\ud800-\\udfff): not valid Unicode")
    return data


async def read_json_body(request: Request, limit: int, timeout_s: float = 60.0) -> Any:
    body = await read_body(request, limit, timeout_s)
    if len(body) > INLINE_PARSE_BYTES:
        return await asyncio.to_thread(parse_json_body, body)
    return parse_json_body(body)


def parse_chat_request(raw: Any, max_messages: int, tools: ToolsCache | None = None) -> ChatCompletionRequest:
    """Cheap bounds first (the message count), then the schema; ``tools``: the route's cache of tool
    lists already validated (``toolcache.py``), which changes no outcome, only the CPU."""
    if not isinstance(raw, dict):
        raise BadRequest("request body must be a JSON object")
    messages = raw.get("messages")
    if isinstance(messages, list) and len(messages) > max_messages:
        raise BadRequest(f"too many messages: {len(messages)} (this proxy accepts at most {max_messages})",
                         param="messages")
    try:
        return ChatCompletionRequest.model_validate(raw, context=None if tools is None else {TOOLS_CACHE: tools})
    except ValidationError as e:
        message, param = validation_message(e)
        raise BadRequest(message, param=param) from None


def spool_refusal(overloaded: bool, overflow: int, problem: str | None, metrics: ProxyMetrics) -> OpenClawError | None:
    """503 while the spool and its overflow are full, or while commits fail (counted): refused before the
    policy spends a generation that could not be saved."""
    if overloaded:
        metrics.backpressure.inc()
        return Overloaded(f"the spool is full and {overflow} samples wait in memory; retry when the trainer has "
                          "caught up", headers={"Retry-After": "30"})
    if problem is not None:
        metrics.not_durable.labels("spool_failing").inc()
        return NotDurable(f"the proxy cannot save turns to its spool now ({problem}); retry shortly",
                          headers={"Retry-After": "5"})
    return None


def chat_endpoint(p: ProxySettings, service: ChatService, users: Any, auth: Any, metrics: ProxyMetrics,
                  refusal: Callable[[], OpenClawError | None]) -> Callable[[Request], Any]:
    """``POST /v1/chat/completions``: authenticate, refuse what the spool cannot take, read and parse the
    body (big ones on a thread), serve it; a client gone before a non-streamed answer gets nothing (499).
    The route owns the cache of the tool lists it has validated (``toolcache.py``)."""
    tools = ToolsCache()

    async def chat_completions(request: Request) -> Any:
        headers = header_dict(request.scope["headers"])
        namespace = users.user(auth.namespace(headers.get("authorization")), headers)
        refused = refusal()
        if refused is not None:
            raise refused
        body = await read_body(request, p.max_body_bytes, p.body_timeout_s, headers.get("content-length", ""))
        if len(body) > INLINE_PARSE_BYTES:
            req = await asyncio.to_thread(lambda: parse_chat_request(parse_json_body(body), p.max_messages, tools))
        else:
            req = parse_chat_request(parse_json_body(body), p.max_messages, tools)
        work = service.complete(req, headers, namespace, len(body))
        # not streamed: a hang-up cancels the backend call nobody waits for (its turn settles as
        # client_disconnected); the body is read, so the next ASGI message can only be the disconnect
        result = await (work if req.stream else until_disconnect(request.receive, work))
        if result is None:  # the client hung up; nobody reads this
            return Response(status_code=499)
        if isinstance(result, dict):
            return Response(codec.dumps(result), media_type="application/json")
        return StreamingResponse(result, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    return chat_completions


async def read_feedback(request: Request, p: ProxySettings) -> FeedbackRequest:
    raw = await read_json_body(request, 64 * 1024, p.body_timeout_s)
    try:
        return FeedbackRequest.model_validate(raw)
    except ValidationError as e:
        message, param = validation_message(e)
        raise BadRequest(message, param=param) from None


def install_error_handlers(app: FastAPI) -> None:
    """Known errors as their status and OpenAI's error JSON; anything else logged and a bare 500 body."""

    @app.exception_handler(OpenClawError)
    async def _known(request: Request, exc: OpenClawError) -> JSONResponse:
        return JSONResponse(error_body(exc), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = {"error": {"message": str(exc.detail), "type": "invalid_request_error", "param": None,
                          "code": exc.status_code}}
        return JSONResponse(body, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unknown(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse(internal_error_body(), status_code=500)
