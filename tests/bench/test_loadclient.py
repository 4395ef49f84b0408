"""The benchmarks' lean load client (``openclaw_rl.bench.loadclient``): what it reads must be what was sent.

A raw asyncio server answers with hand-written HTTP/1.1 responses, so each framing the client must
handle (Content-Length, chunked with and without trailers, ``Connection: close``, a body to the end of
the connection, an error status, a server that stops answering) is exercised byte for byte. Then the
side-by-side benchmark's real target, the mock SGLang engine app under uvicorn, is read through it and
through httpx, which must agree.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from openclaw_rl.bench.loadclient import HTTPStatusError, LoadClient, LoadClientError

CANNED = {
    "/length": b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world",
    "/chunked": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"7\r\ndata: a\r\n9;ext=1\r\n\ndata: b\n\r\n3\r\nc\nd\r\n0\r\n\r\n"),
    "/trailer": (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                 b"3\r\nabc\r\n0\r\nX-Checksum: 1\r\n\r\n"),
    "/close": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
    "/eof": b"HTTP/1.0 200 OK\r\n\r\nto the end",
    "/error": b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 10\r\n\r\nspool full",
    "/broken": b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\ntoo short",
    "/garbage": b"not http at all\r\n\r\n",
}


class RawServer:
    """Answers each request (read whole, by its Content-Length) with CANNED[path]; counts connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[tuple[str, dict[str, str], bytes]] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                self.requests.append((path, headers, body))
                if path == "/hang":  # never answer: wait for the client to give up and close
                    await reader.read()
                    break
                writer.write(CANNED[path])
                await writer.drain()
                if path in ("/close", "/eof", "/broken", "/garbage"):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _with_server(check) -> None:
    raw = RawServer()
    server = await asyncio.start_server(raw.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with LoadClient(timeout_s=1.0) as client:
            await check(client, f"http://127.0.0.1:{port}", raw)
    finally:
        server.close()
        await server.wait_closed()


def test_each_framing_reads_back_exactly_and_keep_alive_is_reused() -> None:
    async def check(client: LoadClient, base: str, raw: RawServer) -> None:
        body = b'{"x": "caf\xc3\xa9"}'
        assert await client.post(f"{base}/length", body, {"X-Session-Id": "s1"}) == b"hello world"
        assert raw.requests[-1] == ("/length", {"host": base[7:], "content-length": str(len(body)),
                                                "x-session-id": "s1"}, body)
        lines = [line async for line in client.post_lines(f"{base}/chunked", b"{}", {})]
        assert lines == [b"data: a", b"data: b", b"c", b"d"]  # lines split across chunks are joined
        assert await client.post(f"{base}/trailer", b"", {}) == b"abc"
        assert raw.connections == 1  # three exchanges, one keep-alive connection
        assert await client.post(f"{base}/close", b"", {}) == b"ok"
        assert await client.post(f"{base}/length", b"", {}) == b"hello world"
        assert raw.connections == 2  # the server closed the first: a new one, no error
        assert await client.post(f"{base}/eof", b"", {}) == b"to the end"
        assert await client.post(f"{base}/length", b"", {}) == b"hello world"
        assert raw.connections == 3

    asyncio.run(_with_server(check))


def test_errors_are_raised_and_never_reuse_a_broken_connection() -> None:
    async def check(client: LoadClient, base: str, raw: RawServer) -> None:
        with pytest.raises(HTTPStatusError) as status:
            await client.post(f"{base}/error", b"", {})
        assert status.value.status == 503 and status.value.body == b"spool full"
        assert await client.post(f"{base}/length", b"", {}) == b"hello world"  # the error's body was read
        assert raw.connections == 1
        for path in ("/broken", "/garbage"):
            with pytest.raises(LoadClientError):
                await client.post(f"{base}{path}", b"", {})
            assert await client.post(f"{base}/length", b"", {}) == b"hello world"
        assert raw.connections == 3
        with pytest.raises(LoadClientError):  # the 1 s deadline closes the connection
            await client.post(f"{base}/hang", b"", {})
        with pytest.raises(LoadClientError):
            await client.post("http://127.0.0.1:9/none", b"", {})  # nothing listens on port 9

    asyncio.run(_with_server(check))


def test_a_stream_left_early_closes_its_connection() -> None:
    async def check(client: LoadClient, base: str, raw: RawServer) -> None:
        lines = client.post_lines(f"{base}/chunked", b"", {})
        assert await anext(lines) == b"data: a"
        await lines.aclose()
        assert not client._open  # closed at once, not left to the garbage collector
        assert await client.post(f"{base}/length", b"", {}) == b"hello world"
        assert raw.connections == 2

    asyncio.run(_with_server(check))


def test_the_mock_engine_reads_the_same_through_httpx_and_the_load_client(tmp_path: Path) -> None:
    """/generate, plain and streamed (SGLang's SSE over chunked encoding), as the benchmark sends it."""
    from openclaw_rl.bench import mock
    from openclaw_rl.bench.mock import build_mock_app, ensure_tokenizer
    from openclaw_rl.server import load_tokenizer
    from openclaw_rl.servers import BackgroundServer

    tokenizer = load_tokenizer(str(ensure_tokenizer(tmp_path / "cache")), "--tokenizer")
    ids = tokenizer.encode("hello there", add_special_tokens=False)
    case = mock.Case([{"role": "user", "content": "hello there"}], ids, None)

    def tokens(event: bytes) -> tuple[str, list[list]] | bytes:
        """(text, [log-prob, id] pairs) of a reply or stream event; the rest (ids, timings) varies."""
        if not event.startswith((b"{", b"data: {")):
            return event
        out = json.loads(event.removeprefix(b"data: "))
        return out["text"], [pair[:2] for pair in out["meta_info"]["output_token_logprobs"]]

    async def both(url: str) -> None:
        async with LoadClient() as client, httpx.AsyncClient(trust_env=False) as http:
            for stream in (False, True):
                body = mock.generate_body(case, 24, stream)
                if stream:
                    ours = [line async for line in client.post_lines(url, body, mock.JSON_HEADERS)]
                    async with http.stream("POST", url, content=body, headers=mock.JSON_HEADERS) as r:
                        theirs = [line.encode() async for line in r.aiter_lines()]
                    assert ours[-2:] == [b"data: [DONE]", b""] and not any(ours[1::2])  # events, blank lines
                    assert [tokens(x) for x in ours] == [tokens(x) for x in theirs] and len(theirs) > 6
                else:
                    ours_body = await client.post(url, body, mock.JSON_HEADERS)
                    theirs_body = (await http.post(url, content=body, headers=mock.JSON_HEADERS)).content
                    assert tokens(ours_body) == tokens(theirs_body) and len(tokens(ours_body)[1]) == 25

    with BackgroundServer(build_mock_app(tokenizer, reply_tokens=24)) as server:
        asyncio.run(both(f"{server.url}/generate"))


def test_the_mock_can_pad_its_bodies_and_report_text_that_is_not_its_ids(tmp_path: Path) -> None:
    """The load test's hostile backends (``mock-sglang --pad-bytes / --mismatch-text``), switched at run time."""
    from openclaw_rl.bench import mock
    from openclaw_rl.bench.mock import MISMATCH_PREFIX, build_mock_app, ensure_tokenizer
    from openclaw_rl.server import load_tokenizer
    from openclaw_rl.servers import BackgroundServer

    tokenizer = load_tokenizer(str(ensure_tokenizer(tmp_path / "cache")), "--tokenizer")
    ids = tokenizer.encode("hello there", add_special_tokens=False)
    body = mock.generate_body(mock.Case([{"role": "user", "content": "hello"}], ids, None), 8, False)
    with BackgroundServer(build_mock_app(tokenizer, reply_tokens=8)) as server:
        plain = httpx.post(f"{server.url}/generate", content=body, headers=mock.JSON_HEADERS).json()
        httpx.post(f"{server.url}/bench/latency", json={"pad_bytes": 100_000, "mismatch_text": True})
        r = httpx.post(f"{server.url}/generate", content=body, headers=mock.JSON_HEADERS)
        out = r.json()
        assert len(r.content) > 100_000 and out["mock_padding"] == "x" * 100_000
        assert out["text"] == MISMATCH_PREFIX + plain["text"]
        assert out["meta_info"]["output_token_logprobs"] == plain["meta_info"]["output_token_logprobs"]
        streamed = httpx.post(f"{server.url}/generate", content=mock.generate_body(
            mock.Case([{"role": "user", "content": "hello"}], ids, None), 8, True), headers=mock.JSON_HEADERS)
        events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
        assert events and all(e["text"].startswith(MISMATCH_PREFIX) for e in events)
        votes = json.loads(body)
        votes["sampling_params"]["n"] = 3  # the judge's call: a list of 3, the first one padded
        out = httpx.post(f"{server.url}/generate", json=votes).json()
        assert len(out) == 3 and out[0]["mock_padding"] == "x" * 100_000 and "mock_padding" not in out[1]
