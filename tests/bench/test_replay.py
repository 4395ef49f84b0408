"""The bench's direct floor (``replay.py``) answers each body with the very bytes its upstream answered,
asks the upstream once per body, sends streams as events (chunked when paced), and forgets what it learnt
when the mock's answers change. In one event loop: a tiny upstream, the replay server, the load client."""

from __future__ import annotations

import asyncio
import json

from openclaw_rl.bench import replay
from openclaw_rl.bench.loadclient import LoadClient
from openclaw_rl.servers import free_port

EVENTS = [b'data: {"text":"a","meta_info":{"completion_tokens":1}}\n\n',
          b'data: {"text":"b","meta_info":{"completion_tokens":2}}\n\n', b"data: [DONE]\n\n"]


async def _upstream(asked: list[bytes], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
            body = await reader.readexactly(length)
            asked.append(body)
            out = b"".join(EVENTS) if json.loads(body).get("stream") else b'{"text":"ab","n":%d}' % len(asked)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(out), out))
            await writer.drain()
    except asyncio.IncompleteReadError:
        writer.close()


async def _scenario() -> None:
    asked: list[bytes] = []
    up_port, port = free_port("127.0.0.1"), free_port("127.0.0.1")
    upstream = await asyncio.start_server(lambda r, w: _upstream(asked, r, w), "127.0.0.1", up_port)
    server = asyncio.ensure_future(replay.serve("127.0.0.1", port, f"http://127.0.0.1:{up_port}"))
    url = f"http://127.0.0.1:{port}"
    try:
        async with LoadClient(30.0) as load:
            for _ in range(100):  # until the replay server listens
                try:
                    await load.post(f"{url}/bench/latency", b"{}", {})
                    break
                except Exception:
                    await asyncio.sleep(0.05)
            plain, stream = b'{"input_ids":[1,2]}', b'{"input_ids":[1,2],"stream":true}'
            assert await replay.prime(load, url, [plain, plain, stream]) == 2
            assert await load.post(f"{url}/generate", plain, {}) == b'{"text":"ab","n":1}'  # learnt, not asked again
            assert await load.post(f"{url}/generate", stream, {}) == b"".join(EVENTS)
            assert len(asked) == 2
            await load.post(f"{url}/bench/latency", b'{"ttft_ms": 1, "tokens_per_s": 10000}', {})
            lines = [line async for line in load.post_lines(f"{url}/generate", stream, {})]
            assert b"\n".join(lines) + b"\n" == b"".join(EVENTS)  # paced: chunked, the same bytes
            assert await load.post(f"{url}/generate", plain, {}) == b'{"text":"ab","n":1}'
            await load.post(f"{url}/bench/latency", b'{"reply_tokens": 8}', {})  # the mock changed: ask again
            assert await load.post(f"{url}/generate", plain, {}) == b'{"text":"ab","n":3}'
    finally:
        server.cancel()
        upstream.close()


def test_replay_serves_the_upstream_bytes_once_learnt():
    asyncio.run(_scenario())
