"""A stream's first event that arrives in the same read as the response head is handed over at once.

Stage: engine → proxy (``rawstream.StreamClient.post``, ``PolicyBackend._stream_raw``). ``post`` waits for the
head and marked the connection's bytes as seen (``fresh = False``) after the read that completed it, so body
bytes of that same read (the first token's event, when the server writes the head with it, or a busy loop
reads both at once) waited for the *next* read: the next event, ``stream_interval`` decode steps later, or,
with a pause in the generation, the stall timeout (a 504 for a reply that had started). The first snapshot
is never held (docs/deployment.md "Stream gathering window").
"""

from __future__ import annotations

import asyncio
import random

import httpx
from support import generate_request_or_404
from test_sse_in_place import HEAD, compact, synthetic

from openclaw_rl.backend import PolicyBackend


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def test_the_first_event_sent_with_the_head_is_not_held_for_the_next_read() -> None:
    events = [b"data: " + compact(c) + b"\n\n" for c in synthetic(2, random.Random(2))]

    async def main() -> list[str]:
        got_first = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if not await generate_request_or_404(reader, writer):  # the backend's mode probe
                return
            writer.write(HEAD + _chunk(events[0]))  # the head and the first event in one write
            await writer.drain()
            await got_first.wait()  # the rest only once the client has the first snapshot
            writer.write(_chunk(events[1]) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        texts = []
        try:
            async with httpx.AsyncClient() as http:
                backend = PolicyBackend(http, f"http://127.0.0.1:{port}", timeout_s=5.0)
                backend.declared_mode = "cumulative"
                async for snap in backend.generate_stream({"input_ids": [1, 2]}, None, 0.05):
                    texts.append(snap.text)
                    got_first.set()
        finally:
            got_first.set()
            server.close()
            await server.wait_closed()
        return texts

    texts = asyncio.run(main())
    assert texts[0] and texts[-1] == synthetic(2, random.Random(2))[-1]["text"]
