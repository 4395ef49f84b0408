"""A minimal streaming relay: the floor a Python proxy's CPU per streamed event is measured against.

Stage: benchmark harness (``scripts/bench_stream_events.py --floor``). It does the least any proxy that
reads SGLang's stream must do per event, in the cheapest way Python allows: one uvloop process, a TCP
connection in from the same paced policy mock the proxy reads (``POST /generate``, ``stream: true``, the
same ``stream_interval``), each SSE event de-chunked, decoded with orjson (text, ids, log-prob triples
taken out) and written to the client as one OpenAI ``chat.completion.chunk`` (HTTP chunked, at once: no
gathering window). Nothing else: no template, no session, no check of the text against the ids, no spool,
no metrics, no ASGI layers. What the proxy spends per event above this relay is what its own features and
its layers cost; what this relay spends is what reading, parsing and writing one event costs a Python
process on the machine (its wake-up included). A benchmark tool: it serves one request at a time, trusts
its peers, and is never part of the proxy. Options for finding where the proxy's extra CPU goes
(``scripts/bench_stream_ab.py``): ``--preload`` imports the proxy's modules first, ``--buffered`` reads
through ``asyncio.BufferedProtocol``, ``--rawstream`` reads with the proxy's own reader.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import time
from typing import Any
from urllib.parse import urlsplit

import orjson

from openclaw_rl.rawstream import StreamConnection
from openclaw_rl.sglang_stream import SSEReader

_HEAD_END = b"\r\n\r\n"
_RESPONSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                  b"connection: keep-alive\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    """``data`` as one HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Upstream(asyncio.Protocol):
    """The mock's streamed ``/generate`` answer: chunked framing taken out, each ``data:`` event relayed."""

    def __init__(self, relay: _Client) -> None:
        self.relay = relay
        self.raw = bytearray()  # received, framing not yet taken out
        self.body = bytearray()  # de-chunked, events not yet complete
        self.head_done = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.raw += data
        raw = self.raw
        if not self.head_done:
            i = raw.find(_HEAD_END)
            if i < 0:
                return
            del raw[:i + 4]
            self.head_done = True
        pos = 0
        while True:  # chunk-size line, payload, CRLF
            nl = raw.find(b"\r\n", pos)
            if nl < 0:
                break
            size = int(raw[pos:nl].split(b";", 1)[0], 16)
            if len(raw) < nl + 2 + size + 2:
                break
            self.body += raw[nl + 2:nl + 2 + size]
            pos = nl + 2 + size + 2
        del raw[:pos]
        body, start = self.body, 0
        while True:
            end = body.find(b"\n\n", start)
            if end < 0:
                break
            if body.startswith(b"data: ", start):
                self.relay.event(body[start + 6:end])
            start = end + 2
        del body[:start]

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.upstream_gone()


class _BufferedUpstream(_Upstream, asyncio.BufferedProtocol):
    """``_Upstream`` read as the proxy's ``rawstream`` reads: the kernel writes into a buffer the protocol
    offers (``get_buffer``/``buffer_updated``) instead of handing over a new ``bytes`` per read (``--buffered``)."""

    def __init__(self, relay: _Client) -> None:
        super().__init__(relay)
        self._in = bytearray(256 * 1024)

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self._in)

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._in[:nbytes])  # type: ignore[arg-type]


class _RawstreamUpstream(StreamConnection):
    """The mock read by the proxy's own reader (``rawstream.StreamConnection``, ``SSEReader``): the framing
    blanked in place, the events found in the buffer, each relayed as the others do (``--rawstream``)."""

    def __init__(self, relay: _Client) -> None:
        super().__init__()
        self.relay, self.sse = relay, True
        self.reader = SSEReader(self)

    def buffer_updated(self, nbytes: int) -> None:
        super().buffer_updated(nbytes)
        for start, end in self.reader.push():
            self.relay.event(self.buf[start:end])
        if self.reader.done:
            self.relay.event(bytearray(b"[DONE]"))
        self.reader.consume()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.relay.upstream_gone()


class _Client(asyncio.Protocol):
    """One client connection: a chat request in, the relayed stream out (one request at a time)."""

    def __init__(self, upstream: tuple[str, int, str], interval: int, buffered: bool = False,
                 rawstream: bool = False) -> None:
        self.upstream, self.interval, self.buffered, self.rawstream = upstream, interval, buffered, rawstream
        self.transport: asyncio.Transport | None = None
        self.request = bytearray()
        self.up: _Upstream | None = None
        self.tokens = 0
        self.logprobs: list[float] = []
        self.done = False
        self.created = int(time.time())
        self.prefix = b""  # the fixed part of each chunk, up to its delta
        self.suffix = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.request += data
        i = self.request.find(_HEAD_END)
        if i < 0:
            return
        head = bytes(self.request[:i]).decode("latin-1").lower()
        length = next((int(line.split(":", 1)[1]) for line in head.split("\r\n")
                       if line.startswith("content-length:")), 0)
        if len(self.request) < i + 4 + length:
            return
        body = orjson.loads(bytes(self.request[i + 4:i + 4 + length]))
        del self.request[:i + 4 + length]
        asyncio.get_running_loop().create_task(self._start(body))

    async def _start(self, body: dict[str, Any]) -> None:
        host, port, path = self.upstream
        self.tokens, self.done, self.logprobs = 0, False, []
        rid = b"chatcmpl-floor"
        model = orjson.dumps(body.get("model") or "policy")
        self.prefix = (b'data: {"id":"' + rid + b'","object":"chat.completion.chunk","created":'
                       + str(self.created).encode() + b',"model":' + model + b',"choices":[{"index":0,"delta":')
        self.suffix = b',"logprobs":null,"finish_reason":null}]}\n\n'
        params = {"max_new_tokens": int(body.get("max_tokens") or 64), "temperature": 1.0, "top_p": 1.0,
                  "top_k": -1, "min_p": 0.0, "stream_interval": self.interval}
        payload = orjson.dumps({"input_ids": list(range(1, 33)), "sampling_params": params,
                                "return_logprob": True, "stream": True})
        loop = asyncio.get_running_loop()
        kind: Any = _RawstreamUpstream if self.rawstream else _BufferedUpstream if self.buffered else _Upstream
        _, self.up = await loop.create_connection(lambda: kind(self), host, port)
        assert self.up.transport is not None and self.transport is not None
        self.up.transport.write(b"POST %s HTTP/1.1\r\nhost: %s:%d\r\ncontent-type: application/json\r\n"
                                b"accept: text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
                                % (path.encode(), host.encode(), port, len(payload), payload))
        self.transport.write(_RESPONSE_HEAD + _chunk(self.prefix + b'{"role":"assistant","content":""}'
                                                      + self.suffix))

    def event(self, data: bytearray) -> None:
        """One SGLang event: decoded, its tokens taken, one OpenAI chunk written to the client."""
        assert self.transport is not None
        if data == b"[DONE]":
            self._finish()
            return
        obj = orjson.loads(data)
        meta = obj["meta_info"]
        ids, triples = obj["output_ids"], meta["output_token_logprobs"]
        if len(ids) != len(triples):
            raise ValueError("ids and log-probs differ in number")
        self.tokens += len(ids)
        self.logprobs += [t[0] for t in triples]  # what a trainer keeps (the proxy checks them against the ids)
        out = self.prefix + orjson.dumps({"content": obj["text"]}) + self.suffix
        if meta.get("finish_reason"):
            self.done = True
        self.transport.write(_chunk(out))

    def _finish(self) -> None:
        assert self.transport is not None
        tail = (self.prefix + b"{}" + self.suffix.replace(b'"finish_reason":null', b'"finish_reason":"stop"')
                + b'data: {"id":"chatcmpl-floor","object":"chat.completion.chunk","choices":[],"usage":'
                + orjson.dumps({"prompt_tokens": 32, "completion_tokens": self.tokens,
                                "total_tokens": 32 + self.tokens}) + b"}\n\ndata: [DONE]\n\n")
        self.transport.write(_chunk(tail) + b"0\r\n\r\n")
        if self.up is not None and self.up.transport is not None:
            self.up.transport.close()  # one request per upstream connection
        self.up = None

    def upstream_gone(self) -> None:
        """The mock closed the connection: nothing to do (the reply ended at ``[DONE]``; a bench tool trusts it)."""


async def serve(port: int, upstream_url: str, interval: int, buffered: bool = False, rawstream: bool = False) -> None:
    parts = urlsplit(upstream_url)
    upstream = (parts.hostname or "127.0.0.1", parts.port or 80, parts.path.rstrip("/") + "/generate")
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(upstream, interval, buffered, rawstream), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="the policy mock's URL")
    p.add_argument("--interval", type=int, default=8, help="tokens per SGLang stream event (stream_interval)")
    p.add_argument("--preload", default="", help="modules to import first, comma-separated (e.g. openclaw_rl.server: "
                   "the relay then carries the proxy's heap and code, to see what that alone costs per event)")
    p.add_argument("--buffered", action="store_true", help="read the mock as the proxy does (asyncio.BufferedProtocol)")
    p.add_argument("--rawstream", action="store_true", help="read the mock with the proxy's own reader (rawstream, SSEReader)")
    ns = p.parse_args(argv)
    for name in filter(None, ns.preload.split(",")):
        importlib.import_module(name)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it; plain asyncio otherwise
        asyncio.run(serve(ns.port, ns.upstream, ns.interval, ns.buffered, ns.rawstream))
    else:
        uvloop.run(serve(ns.port, ns.upstream, ns.interval, ns.buffered, ns.rawstream))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
