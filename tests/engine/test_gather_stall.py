"""A stream that stalls while its reader gathers still fails as a stall (504), whatever the gathering window.

Stage: engine → proxy (``PolicyBackend._stream_raw``). After a snapshot with text the reader gathers for
``proxy_stream_gather_ms`` (``RawConnection.wait_gathered``, up to twice that when no bytes come); only then
does it wait ``timeout_s`` for more bytes. A window of ``inf`` (or longer than the policy timeout) had a
stalled backend hold the client's reply forever (or for twice the window) instead of a 504 after the
policy timeout.
"""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from support import generate_request_or_404
from test_sse_in_place import HEAD, compact, synthetic

from openclaw_rl.backend import PolicyBackend
from openclaw_rl.errors import BackendTimeout


@pytest.mark.parametrize("gather_s", [float("inf"), 1e6])
def test_a_backend_that_stalls_while_the_reader_gathers_is_a_timeout(gather_s: float) -> None:
    first = b"data: " + compact(synthetic(3, random.Random(2))[0]) + b"\n\n"

    async def main() -> None:
        release = asyncio.Event()
        sent = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if not await generate_request_or_404(reader, writer):  # the backend's mode probe
                return
            writer.write(HEAD + b"%x\r\n" % len(first) + first + b"\r\n")  # one event with text, then nothing
            await writer.drain()
            sent.set()
            await release.wait()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with httpx.AsyncClient() as http:
            backend = PolicyBackend(http, f"http://127.0.0.1:{port}", timeout_s=0.2)
            backend.declared_mode = "cumulative"
            snapshots = []

            async def read() -> None:
                async for snap in backend.generate_stream({"input_ids": [1, 2]}, None, gather_s):
                    snapshots.append(snap)

            try:
                with pytest.raises(BackendTimeout) as info:
                    # the guard only turns a hang into a failure: the stall is reported after ~2 x timeout_s
                    await asyncio.wait_for(read(), 10)
            finally:
                release.set()
                server.close()
                await server.wait_closed()
        assert sent.is_set() and snapshots and snapshots[0].text, info.value

    asyncio.run(main())
