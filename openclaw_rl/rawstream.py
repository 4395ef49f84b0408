"""A minimal HTTP/1.1 client for the proxy's backend calls: SGLang's ``/generate`` streams at memory speed,
and the plain ``/generate`` calls (policy and judge) at a fraction of httpx's per-request CPU.

Stage: backend → **raw stream** → SGLang. SGLang's default stream is cumulative: an 8,192-token reply
is ~1.1 GB of JSON. Through httpx (httpcore + h11) those bytes cost ~3 ns each on the proxy's CPU,
ten times what the kernel needs (measured: 3.0 s vs 0.38 s for 1.15 GB), and that transport cost
alone made a streamed turn's CPU grow with the square of its length. Here the kernel writes straight
into a fixed buffer (``asyncio.BufferedProtocol``), the chunked framing is removed while the payload
is copied once into the body buffer, and ``SSEReader`` finds events in that buffer in place.

The same connections carry whole (non-streamed) requests (``request``): httpx spends ~1 ms of Python per
call on its pool, its event hooks and h11 (a third of a whole turn's CPU at ~1K-token histories, measured
with ``bench --profile-proxy X.pstat``). Scope is deliberately small: plain ``http://`` (``https`` stays on httpx), one request per connection
at a time, keep-alive reuse for ``keepalive_s`` (shorter than uvicorn's and SGLang's 5 s, so a request
never races the server closing an idle connection), bounded buffering (reading pauses while the
consumer lags). Everything else about the request (timeouts, errors, headers) is the caller's.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

_READ_BYTES = 256 * 1024
_MAX_HEAD = 64 * 1024
_PAUSE_AT = 64 * 1024 * 1024  # unconsumed body bytes at which reading pauses


class ResponseError(Exception):
    """The server's bytes are not an HTTP/1.1 response we can read."""


class StreamConnection(asyncio.BufferedProtocol):
    """One connection; ``body`` holds the de-chunked response bytes not yet consumed by the caller."""

    def __init__(self) -> None:
        self._raw = bytearray(_READ_BYTES)
        self._mv = memoryview(self._raw)
        self.transport: asyncio.Transport | None = None
        self.head = bytearray()
        self.body = bytearray()
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = True
        self.complete = False  # the whole response body has arrived
        self.closed = False
        self.error: BaseException | None = None
        self.fresh = False  # bytes arrived since the caller last looked
        self.idle_since = 0.0
        self._state = "head"
        self._left = 0  # bytes left in the current chunk (or the whole body, with Content-Length)
        self._line = bytearray()
        self._paused = False
        self._waiter: asyncio.Future | None = None
        self._end_waiter: asyncio.Future | None = None

    # --- asyncio protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._mv

    def buffer_updated(self, nbytes: int) -> None:
        try:
            self._parse(self._raw, self._mv, nbytes)
        except (ResponseError, ValueError) as e:
            self.error = ResponseError(f"malformed HTTP response: {e}")
            self.close()
        self.fresh = True
        if len(self.body) > 2 * _PAUSE_AT and self.transport is not None and not self._paused:
            self.transport.pause_reading()
            self._paused = True
        self._wake()

    def eof_received(self) -> bool:
        if self._state == "close":
            self.complete = True
        self.closed = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if exc is not None and self.error is None:
            self.error = exc
        self._wake()

    # --- for the caller --------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.complete or self.closed or self.error is not None

    async def wait(self, timeout: float) -> None:
        """Until new bytes, the end of the response, or an error (raises TimeoutError after ``timeout``)."""
        if self.fresh or self.finished:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self._waiter, timeout)
        finally:
            self._waiter = None

    async def wait_finished(self, timeout: float) -> None:
        """Until the response is complete (or failed), or ``timeout`` has passed: no wake-up per read."""
        if self.finished:
            return
        self._end_waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self._end_waiter, timeout)
        except (TimeoutError, asyncio.TimeoutError):
            pass
        finally:
            self._end_waiter = None

    def maybe_resume(self, pending: int) -> None:
        """Call after consuming from ``body``: reading resumes once the backlog is small again."""
        if self._paused and pending < _PAUSE_AT // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    # --- parsing ---------------------------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if self._end_waiter is not None and self.finished and not self._end_waiter.done():
            self._end_waiter.set_result(None)

    def _parse(self, buf: bytes | bytearray, data: memoryview, n: int) -> None:
        """Consume ``buf[:n]`` (``data`` is a view of ``buf``): head, then the body, de-chunked into ``body``."""
        pos = 0
        while pos < n and not self.complete:
            state = self._state
            if state == "head":
                self.head += data[pos:n]
                end = self.head.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.head) > _MAX_HEAD:
                        raise ResponseError("response head too large")
                    return
                rest = bytes(self.head[end + 4:])
                del self.head[end:]
                self._read_head()
                buf, data, pos, n = rest, memoryview(rest), 0, len(rest)
            elif state == "chunk_size":
                pos = self._take_line(buf, data, pos, n)
                if pos < 0:
                    return
                size = int(bytes(self._line).split(b";", 1)[0].strip(), 16)
                self._line.clear()
                self._left, self._state = size, ("chunk" if size else "trailer")
            elif state in ("chunk", "length"):
                take = min(self._left, n - pos)
                self.body += data[pos:pos + take]
                pos += take
                self._left -= take
                if not self._left:
                    if state == "length":
                        self.complete = True
                    else:
                        self._state, self._left = "chunk_end", 2
            elif state == "chunk_end":
                skip = min(self._left, n - pos)
                pos += skip
                self._left -= skip
                if not self._left:
                    self._state = "chunk_size"
            elif state == "trailer":
                pos = self._take_line(buf, data, pos, n)
                if pos < 0:
                    return
                if not bytes(self._line).strip():
                    self.complete = True
                self._line.clear()
            else:  # "close": the body runs to the end of the connection
                self.body += data[pos:n]
                return

    def _take_line(self, buf: bytes | bytearray, data: memoryview, pos: int, n: int) -> int:
        """Append ``buf[pos:n]`` up to the next newline to ``_line``; the position after the newline, or
        -1 when the line goes on in the next read (everything up to ``n`` is then kept)."""
        nl = buf.find(b"\n", pos, n)
        self._line += data[pos:n if nl < 0 else nl]
        return -1 if nl < 0 else nl + 1

    def _read_head(self) -> None:
        lines = bytes(self.head).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ResponseError(f"bad status line {lines[0][:80]!r}")
        self.status = int(parts[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        connection = self.headers.get("connection", "").lower()
        self.keep_alive = "close" not in connection and (parts[0] != "HTTP/1.0" or "keep-alive" in connection)
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            self._state = "chunk_size"
        elif "content-length" in self.headers:
            self._left = int(self.headers["content-length"])
            self._state = "length"
            self.complete = self._left == 0
        else:
            self._state, self.keep_alive = "close", False


class StreamClient:
    """Connections to one ``http://host:port`` server, reused while idle for less than ``keepalive_s``."""

    def __init__(self, url: str, *, connect_timeout_s: float = 10.0, keepalive_s: float = 2.0, max_idle: int = 64):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"StreamClient serves plain http:// URLs, not {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.base_path = parts.path.rstrip("/")
        self.connect_timeout_s, self.keepalive_s, self.max_idle = connect_timeout_s, keepalive_s, max_idle
        self._idle: list[StreamConnection] = []

    async def _connect(self) -> StreamConnection:
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(loop.create_connection(StreamConnection, self.host, self.port),
                                         self.connect_timeout_s)
        return conn

    def _reusable(self) -> StreamConnection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.close()
        return None

    async def post(self, path: str, body: bytes, headers: dict[str, str], timeout_s: float) -> StreamConnection:
        """Send a POST and wait for the response head; a reused connection that the server had closed is
        retried once on a fresh one. Raises OSError / TimeoutError / ResponseError."""
        head = [f"POST {self.base_path}{path} HTTP/1.1", f"Host: {self.host}:{self.port}",
                f"Content-Length: {len(body)}"]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"header {name!r} contains a line break")
            head.append(f"{name}: {value}")
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        for attempt in (0, 1):
            conn = self._reusable() if attempt == 0 else None
            reused = conn is not None
            conn = conn or await self._connect()
            try:
                conn.transport.write(request)  # type: ignore[union-attr]
                while conn.status == 0 and not conn.finished:
                    await conn.wait(timeout_s)
                    conn.fresh = False
            except BaseException:  # cancelled (the client hung up) or timed out: the backend must see it
                conn.close()
                raise
            if conn.status:
                return conn
            conn.close()
            if not reused:
                raise conn.error or ResponseError("connection closed before a response")
        raise ResponseError("unreachable")  # pragma: no cover

    async def request(self, path: str, body: bytes, headers: dict[str, str], timeout_s: float) -> tuple[int, bytes]:
        """A whole POST: (status, body). ``timeout_s`` bounds each wait for bytes, as httpx's read timeout
        does. Raises OSError / TimeoutError / ResponseError (a connection that ends before the body's end
        too); the connection is kept for reuse only after a complete response."""
        conn = await self.post(path, body, headers, timeout_s)
        try:
            while not conn.finished:
                await conn.wait(timeout_s)
                conn.fresh = False
            if not conn.complete:
                raise conn.error if isinstance(conn.error, OSError | ResponseError) else \
                    ResponseError(f"connection closed before the response's end ({conn.error!r})")
            return conn.status, bytes(conn.body)
        finally:
            self.release(conn)

    def release(self, conn: StreamConnection) -> None:
        """Keep a connection whose response was read completely; close any other."""
        if conn.complete and conn.keep_alive and not conn.closed and len(self._idle) < self.max_idle:
            conn.status, conn.headers, conn.complete, conn.fresh = 0, {}, False, False
            conn.body.clear()  # what is left belongs to the finished response (the blank line after [DONE])
            conn.head.clear()
            conn._state = "head"  # noqa: SLF001 (the protocol's own reset)
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
