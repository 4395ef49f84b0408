"""Backend answers are size-capped (capped.py): a policy, judge or teacher server that sends too much is
cut off where the cap is passed, and the call fails as a backend error, counted.

Stage: backend / judge → capped. The caps are small here (100 KB) so the oversized answers stay cheap.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from support import fault_backend, metric

from openclaw_rl.backend import PolicyBackend, post_whole
from openclaw_rl.capped import StreamBudget
from openclaw_rl.config import JudgeSettings
from openclaw_rl.errors import BackendResponseTooLarge
from openclaw_rl.judge import JudgeClient
from openclaw_rl.rawstream import ResponseTooLarge, StreamClient

CAP = 100_000
BODY = {"messages": [{"role": "user", "content": "hello"}]}


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
def test_an_oversized_policy_answer_is_a_502_and_a_counted_drop(make_proxy, tokenizer, stream):
    with fault_backend(tokenizer=tokenizer) as backend:
        proxy, url = make_proxy(backend.url, proxy_max_response_bytes=CAP)
        backend.plan = [{"text": "x" * (2 * CAP), "ids": [2]}, {}]  # one event: the oversized one comes first
        r = httpx.post(f"{url}/v1/chat/completions", json={**BODY, "stream": stream}, timeout=30,
                       headers={"X-Session-Id": "s"})
        assert r.status_code == 502, r.text[:300]
        assert "openclaw_proxy_max_response_bytes" in r.json()["error"]["message"]
        assert metric(proxy, "openclaw_turns_dropped_total", reason="generation_failed") == 1
        r = httpx.post(f"{url}/v1/chat/completions", json={**BODY, "stream": stream}, timeout=30,
                       headers={"X-Session-Id": "s2"})
        assert r.status_code == 200  # the next answer, within the cap, is served
        assert len(backend.calls) == 2  # refused at once, never retried (not even without stream_interval)


class _Endless:
    """A raw HTTP server whose answer is a chunked body of ``chunks`` x 64 KiB; counts what it could send."""

    def __init__(self, chunks: int, content_length: int | None = None):
        self.chunks, self.content_length, self.sent = chunks, content_length, 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        head = f"Content-Length: {self.content_length}" if self.content_length else "Transfer-Encoding: chunked"
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{head}\r\n\r\n".encode())
        piece = b"x" * 65536
        try:
            for _ in range(self.chunks):
                writer.write(piece if self.content_length else b"10000\r\n" + piece + b"\r\n")
                await writer.drain()
                self.sent += len(piece)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


@pytest.mark.parametrize("content_length", [None, 10**9], ids=["chunked", "declared"])
def test_the_raw_client_stops_reading_at_the_cap(content_length):
    async def main() -> tuple[Exception | None, int]:
        srv = _Endless(chunks=4096, content_length=content_length)  # 256 MiB if it were all read
        server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = StreamClient(f"http://127.0.0.1:{port}")
        try:
            await client.request("/generate", b"{}", {}, 30.0, max_body=CAP)
            error = None
        except ResponseTooLarge as e:
            error = e
        client.close()
        server.close()
        return error, srv.sent

    error, sent = asyncio.run(main())
    assert error is not None
    assert sent < 64 * 1024 * 1024  # the connection was closed long before the server ran out of body


def test_httpx_whole_answers_are_read_no_further_than_the_cap():
    pulled = []

    async def body():
        for _ in range(1000):  # 64 MB if it were all read
            pulled.append(1)
            yield b"y" * 65536

    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body()))

    async def main() -> None:
        async with httpx.AsyncClient(transport=transport) as http:
            with pytest.raises(BackendResponseTooLarge, match="judge /generate: an answer of more than 100000 bytes, over the cap"):
                await post_whole(None, http, "https://judge", "/generate", b"{}", {}, 5.0, timeout_message="t",
                                 unreachable="u", max_bytes=CAP, what="judge /generate", setting="s")

    asyncio.run(main())
    assert len(pulled) <= 3


def test_an_oversized_judge_answer_is_a_failed_vote_and_a_failed_teacher_call(tokenizer):
    votes = []
    answer = json.dumps({"text": "\\boxed{1}" + " " * (2 * CAP), "meta_info": {}}).encode()
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=answer))

    async def main():
        async with httpx.AsyncClient(transport=transport) as http:
            judge = JudgeClient(http, JudgeSettings(url="http://judge", votes=2, max_response_bytes=CAP),
                                tokenizer=tokenizer, on_vote=votes.append)
            judgement = await judge.prm("resp", {"role": "user", "content": "thanks"})
            with pytest.raises(BackendResponseTooLarge, match="openclaw_judge_max_response_bytes"):
                await judge.teacher_log_probs([1, 2, 3], [4, 5])
            return judgement

    judgement = asyncio.run(main())
    assert judgement.failed and votes == ["failed", "failed"]


def test_an_incremental_stream_is_capped_in_total_a_cumulative_one_per_event():
    budget = StreamBudget(CAP)
    budget.events([(0, 40_000), (40_000, 80_000)], cumulative=False)
    with pytest.raises(BackendResponseTooLarge, match="events totalling 120000 bytes"):
        budget.events([(80_000, 120_000)], cumulative=False)
    cumulative = StreamBudget(CAP)
    for size in (40_000, 80_000, 99_000):  # each repeats the one before: only the latest counts
        cumulative.events([(0, size)], cumulative=True)
    with pytest.raises(BackendResponseTooLarge, match="an event of 100001 bytes"):
        cumulative.events([(0, CAP + 1)], cumulative=True)
    with pytest.raises(BackendResponseTooLarge, match="unfinished event"):
        cumulative.unfinished(CAP + 1)


def test_an_incremental_https_stream_over_the_cap_fails_before_it_is_all_read():
    event = {"text": "z" * 30_000, "output_ids": [65], "meta_info": {
        "finish_reason": None, "prompt_tokens": 1, "completion_tokens": 0,
        "output_token_logprobs": [[-0.1, 65, None]]}}
    sent = []

    async def sse():
        for k in range(1, 200):
            sent.append(k)
            yield b"data: " + json.dumps({**event, "meta_info": {**event["meta_info"], "completion_tokens": k}}
                                         ).encode() + b"\n\n"

    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=sse()) if request.url.path ==
                                    "/generate" else httpx.Response(404))

    async def main() -> None:
        async with httpx.AsyncClient(transport=transport) as http:
            backend = PolicyBackend(http, "https://policy", max_response_bytes=CAP)
            with pytest.raises(BackendResponseTooLarge, match="events totalling"):
                async for _ in backend.generate_stream({"input_ids": [1], "sampling_params": {}}):
                    pass
            await backend._probe  # the background /get_server_info probe, before the client closes

    asyncio.run(main())
    assert len(sent) < 10
