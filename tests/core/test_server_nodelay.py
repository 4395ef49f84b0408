"""An in-process server (``servers.BackgroundServer`` on a socket from ``bind_free_socket``) answers
without Nagle's delay: its connections have TCP_NODELAY, as uvicorn's own listeners' do.

asyncio sets TCP_NODELAY only on sockets whose ``proto`` is IPPROTO_TCP, and accepted sockets copy the
listener's; ``first_bindable`` created its sockets with proto 0, so every response's body (uvicorn writes
head and body apart) waited for the client's delayed ACK: ~44 ms a request instead of ~1 (the fuzz test's
544 requests took 24 s of wall time for 1.5 CPU-s), in the tests and in ``openclaw-rl local``'s policy and
judge servers alike. Checked on the server's own connection, not by timing.
"""

from __future__ import annotations

import socket

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from openclaw_rl.servers import BackgroundServer, bind_free_socket


async def hello(request):
    return PlainTextResponse("hi")


def test_a_background_servers_connections_have_tcp_nodelay():
    sock = bind_free_socket("127.0.0.1")
    sock.close()
    assert sock.proto == socket.IPPROTO_TCP
    with BackgroundServer(Starlette(routes=[Route("/", hello)])) as server, httpx.Client(trust_env=False) as http:
        assert http.get(f"{server.url}/").text == "hi"  # the keep-alive connection stays open
        conns = list(server._server.server_state.connections)
        assert conns, "the server has no open connection"
        for conn in conns:
            sock = conn.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
