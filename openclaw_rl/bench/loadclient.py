"""The benchmarks' load generator: a lean HTTP/1.1 client for the measured requests only.

Why: a benchmark here runs its load generator, the mocks and the proxies on the same cores, so whatever
CPU the client spends is taken from what it measures. httpx's ``AsyncClient`` cost 4-8 ms of CPU per
turn (more than the proxy under test at c=16: 7.8 against 6.4 ms in one side-by-side run), which capped
every proxy's throughput, ours more than upstream's. This client keeps keep-alive connections per host
and parses only what a benchmark reads: the status line, ``Content-Length`` or chunked bodies, and the
lines of an event stream. Everything else a benchmark does (health checks, knobs) still goes through
httpx. It is not a general client: no TLS, no redirects, no proxies, loopback servers only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class LoadClientError(Exception):
    """A failed benchmark request: connection lost, malformed response, time-out or an HTTP error status."""


class HTTPStatusError(LoadClientError):
    def __init__(self, status: int, body: bytes):
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status, self.body = status, body


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.transport.abort()


class LoadClient:
    """POST requests over pooled keep-alive connections, each bounded by ``timeout_s`` in all."""

    def __init__(self, timeout_s: float = 300.0):
        self.timeout_s = timeout_s
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()

    async def __aenter__(self) -> LoadClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> bytes:
        """The response body; raises ``HTTPStatusError`` for a status of 400 or more."""
        chunks = [chunk async for chunk in self._exchange(url, body, headers)]
        return b"".join(chunks)

    async def post_lines(self, url: str, body: bytes, headers: dict[str, str]) -> AsyncIterator[bytes]:
        """The response body's lines (without their ``\\n``) as they arrive, e.g. server-sent events."""
        pending = b""
        exchange = self._exchange(url, body, headers)
        try:
            async for chunk in exchange:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line
        finally:  # a reader that stops early closes the connection now, not when the generator is collected
            await exchange.aclose()
        if pending:
            yield pending

    async def _exchange(self, url: str, body: bytes, headers: dict[str, str]) -> AsyncIterator[bytes]:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        conn = await self._connection(host, port)
        # One timer per request closes the connection at the deadline: pending reads then fail.
        timer = asyncio.get_running_loop().call_later(self.timeout_s, conn.close)
        reusable = False
        try:
            conn.writer.write(request)
            status, keep_alive, length, chunked = await self._head(conn.reader)
            error = bytearray() if status >= 400 else None
            async for chunk in self._body(conn.reader, length, chunked, keep_alive):
                if error is None:
                    yield chunk
                else:
                    error += chunk
            reusable = keep_alive and (chunked or length is not None)
            if error is not None:
                raise HTTPStatusError(status, bytes(error))
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            raise LoadClientError(f"{type(e).__name__}: {e}") from e
        finally:
            timer.cancel()
            if reusable and not conn.writer.transport.is_closing():
                self._idle.setdefault((host, port), []).append(conn)
            else:  # an unfinished or unparseable exchange leaves the connection in an unknown state
                conn.close()
                self._open.discard(conn)

    async def _connection(self, host: str, port: int) -> _Connection:
        idle = self._idle.get((host, port))
        while idle:
            conn = idle.pop()
            if not conn.writer.transport.is_closing() and not conn.reader.at_eof():
                return conn
            self._open.discard(conn)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), self.timeout_s)
        except (OSError, asyncio.TimeoutError) as e:
            raise LoadClientError(f"cannot connect to {host}:{port}: {e!r}") from e
        conn = _Connection(reader, writer)
        self._open.add(conn)
        return conn

    @staticmethod
    async def _head(reader: asyncio.StreamReader) -> tuple[int, bool, int | None, bool]:
        """(status, keep-alive, Content-Length or None, chunked) of the response's head."""
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        version, status = lines[0].split(" ", 2)[:2]
        keep_alive, length, chunked = version == "HTTP/1.1", None, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding":
                chunked = "chunked" in value
            elif name == "connection":
                keep_alive = value != "close" if version == "HTTP/1.1" else value == "keep-alive"
        return int(status), keep_alive, length, chunked

    @staticmethod
    async def _body(reader: asyncio.StreamReader, length: int | None, chunked: bool,
                    keep_alive: bool) -> AsyncIterator[bytes]:
        if chunked:
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields, if any
                        pass
                    return
                yield (await reader.readexactly(size + 2))[:-2]
        elif length is not None:
            if length:
                yield await reader.readexactly(length)
        elif not keep_alive:  # the body runs to the end of the connection
            yield await reader.read()
