"""The stream bench's floor relay (``stream_floor.py``) turns each SGLang event of its upstream's chunked
``/generate`` stream into one OpenAI chunk for its client, and ends the reply with the usage and ``[DONE]``.
In one event loop: a tiny chunked upstream, the relay, an httpx client."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from openclaw_rl.bench import stream_floor
from openclaw_rl.servers import free_port

EVENTS = [{"text": "Hel", "output_ids": [1, 2], "meta_info": {"output_token_logprobs": [[-0.1, 1, None], [-0.2, 2, None]],
                                                                "finish_reason": None}},
          {"text": "lo", "output_ids": [3], "meta_info": {"output_token_logprobs": [[-0.3, 3, None]],
                                                          "finish_reason": {"type": "stop"}}}]


async def _upstream(asked: list[dict], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    asked.append(json.loads(await reader.readexactly(length)))
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for event in [b"data: " + json.dumps(e).encode() + b"\n\n" for e in EVENTS] + [b"data: [DONE]\n\n"]:
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    await reader.read()  # until the relay closes its side
    writer.close()


async def _scenario(buffered: bool = False, rawstream: bool = False) -> None:
    asked: list[dict] = []
    up_port, port = free_port("127.0.0.1"), free_port("127.0.0.1")
    upstream = await asyncio.start_server(lambda r, w: _upstream(asked, r, w), "127.0.0.1", up_port)
    relay = asyncio.ensure_future(stream_floor.serve(port, f"http://127.0.0.1:{up_port}", 8, buffered, rawstream))
    try:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            for _ in range(100):  # until the relay listens
                try:
                    _, probe = await asyncio.open_connection("127.0.0.1", port)
                    probe.close()
                    break
                except OSError:
                    await asyncio.sleep(0.02)
            body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}
            lines = []
            async with http.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                lines = [line async for line in r.aiter_lines() if line]
        assert asked[0]["stream"] is True and asked[0]["sampling_params"]["stream_interval"] == 8
        assert asked[0]["sampling_params"]["max_new_tokens"] == 5
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line[6:]) for line in lines[:-1]]
        content = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])
        assert content == "Hello"
        assert chunks[-1]["usage"]["completion_tokens"] == 3
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    finally:
        relay.cancel()
        upstream.close()


@pytest.mark.parametrize("buffered, rawstream", [(False, False), (True, False), (False, True)],
                         ids=["protocol", "buffered", "rawstream"])
def test_the_floor_relays_each_event_as_one_openai_chunk(buffered: bool, rawstream: bool) -> None:
    """``--buffered`` (a BufferedProtocol read) and ``--rawstream`` (the proxy's own reader) too, for
    ``bench_stream_ab.py --floor-buffered`` / ``--floor-rawstream``."""
    asyncio.run(_scenario(buffered, rawstream))
