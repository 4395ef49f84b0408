"""routes.read_body reads the ASGI messages itself (no Starlette stream generator): the same body, limit, 408,
and hang-up as before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from openclaw_rl.errors import ClientGone, PayloadTooLarge, RequestTimeout
from openclaw_rl.routes import read_body


def request(messages: list[dict[str, Any]], headers: list[tuple[bytes, bytes]] | None = None,
            then_wait: bool = False) -> Request:
    pending = list(messages)

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        if then_wait:
            await asyncio.Event().wait()  # a client that stops sending
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers or [],
             "query_string": b""}
    return Request(scope, receive)


def read(req: Request, limit: int = 100, timeout_s: float = 5.0) -> bytes:
    return asyncio.run(read_body(req, limit, timeout_s))


def test_a_body_in_pieces_is_joined() -> None:
    parts = [{"type": "http.request", "body": b"ab", "more_body": True},
             {"type": "http.request", "body": b"", "more_body": True},
             {"type": "http.request", "body": b"cd", "more_body": False}]
    assert read(request(parts)) == b"abcd"
    assert read(request([{"type": "http.request"}])) == b""  # no body key, no more_body: empty and complete


def test_a_body_over_the_limit_is_refused_as_it_arrives() -> None:
    parts = [{"type": "http.request", "body": b"x" * 60, "more_body": True},
             {"type": "http.request", "body": b"x" * 60, "more_body": True}]
    with pytest.raises(PayloadTooLarge):
        read(request(parts, then_wait=True))  # refused at 120 bytes: the rest is never waited for
    with pytest.raises(PayloadTooLarge):  # a declared length over the limit: refused before reading
        read(request([], [(b"content-length", b"101")], then_wait=True))


def test_a_client_gone_mid_body_and_a_slow_body() -> None:
    with pytest.raises(ClientGone):
        read(request([{"type": "http.request", "body": b"ab", "more_body": True}]))
    with pytest.raises(RequestTimeout):
        read(request([{"type": "http.request", "body": b"ab", "more_body": True}], then_wait=True), timeout_s=0.01)
