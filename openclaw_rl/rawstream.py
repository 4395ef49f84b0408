"""A minimal HTTP/1.1 client for the proxy's backend calls: SGLang's ``/generate`` streams at memory speed,
and the plain ``/generate`` calls (policy and judge) at a fraction of httpx's per-request CPU.

Stage: backend → **raw stream** → SGLang. SGLang's default stream is cumulative: an 8,192-token reply
is ~1.1 GB of JSON. Through httpx (httpcore + h11) those bytes cost ~3 ns each on the proxy's CPU,
ten times what the kernel needs (measured: 3.0 s vs 0.38 s for 1.15 GB), and that transport cost
alone made a streamed turn's CPU grow with the square of its length. Here the kernel writes straight
into the body buffer (``asyncio.BufferedProtocol``), the chunked framing is taken out in place (at
event boundaries it is overwritten, so the payload is never moved or copied: each byte is written
once, by the kernel), and ``SSEReader`` finds events in that buffer in place.

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
from collections import deque
from urllib.parse import urlsplit

from .loopwait import await_within

_MIN_FREE = 64 * 1024  # free space offered to each read
_START_CAP = 256 * 1024
_NEVER = float("inf")
_MAX_HEAD = 64 * 1024
_PAUSE_AT = 64 * 1024 * 1024  # unconsumed body bytes at which reading pauses
_NL = 0x0A
ALIGNED_MIN = 2048  # chunk payloads at least this large that start a line are listed in ``aligned``




class ResponseError(Exception):
    """The server's bytes are not an HTTP/1.1 response we can read."""


class ResponseTooLarge(ResponseError):
    """A whole response's body passed the connection's ``max_body`` (reading stopped there)."""


def _chunk_size(line: bytes) -> int:
    """A chunked body's size line (hex, extensions after ``;`` ignored); ValueError when it is not one."""
    return int(line.split(b";", 1)[0].strip(), 16)


class StreamConnection(asyncio.BufferedProtocol):
    """One connection. The kernel writes straight into ``buf``; ``buf[lo:end]`` holds the response body
    bytes not yet consumed by the caller (``base`` counts the bytes dropped from ``buf``'s front, so a
    reader can keep offsets that survive compaction).

    Chunked framing is removed in place. With ``sse`` set (an event stream with status 200), a chunk
    boundary that falls at a line start (what every SSE server writes: one event per chunk) is not cut
    out but overwritten with newlines (blank lines, which an SSE reader skips): the payload is never
    moved, so each byte of a long stream is written once, by the kernel. Any other boundary is cut out
    by moving the rest of that read (exact either way)."""

    def __init__(self) -> None:
        self.buf = bytearray(_START_CAP)
        self.lo = self.end = self.base = 0
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.headers: dict[str, str] = {}
        self._head = bytearray()
        self.keep_alive = True
        self.sse = False  # the caller reads an event stream (see the class doc)
        self.max_body = 0  # a whole body (not a 200 event stream: its reader caps events) beyond this is
        # refused as soon as it passes it (ResponseTooLarge); 0 = no cap
        self.complete = False  # the whole response body has arrived
        self.closed = False
        self.error: BaseException | None = None
        self.fresh = False  # bytes arrived since the caller last looked
        self.idle_since = 0.0
        self._state = "head"
        self._left = 0  # bytes left in the current chunk (or the whole body, with Content-Length)
        self._line = bytearray()
        self._at_line_start = True  # the last body byte kept was a newline (or there is none yet)
        self._paused = False
        self.moved = 0  # body bytes moved after the kernel wrote them (framing cut out mid-line)
        self.dropped = 0  # superseded body bytes dropped unread
        self.superseded = False
        """Set by the reader of a cumulative event stream: each complete ``data: {…}`` event makes the
        ones before it unneeded (it repeats them), so they may be dropped unread (``_make_room``)."""
        self.aligned: deque[tuple[int, int]] = deque()
        """Chunk payloads of ``ALIGNED_MIN`` bytes or more that start a line in an event stream, as
        (start, end) offsets from the body's start (index + ``base``): where one event per chunk is
        written, the event's line ends there."""
        self._waiter: asyncio.Future | None = None
        self._end_waiter: asyncio.Future | None = None
        self._gather_until = _NEVER  # wait_gathered: a read from this time (time.monotonic) on ends it

    # --- asyncio protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self.buf) - self.end < _MIN_FREE:
            self._make_room()
        return memoryview(self.buf)[self.end:]

    def _make_room(self) -> None:
        """Move the unconsumed bytes to the front (into a larger buffer when they fill more than an
        eighth of it, so moving stays a small fraction of what is received). With ``superseded``, the
        events before the last complete one are dropped first: a cumulative stream's reader that
        gathers for a while would otherwise have every event of the interval moved here."""
        if self.superseded:  # keep from the last complete event on (what a gathering reader waits for)
            limit = self.base + self.end
            for start, stop in reversed(self.aligned):  # not "[DONE]" nor a comment: an event's object
                if stop <= limit and self.buf.startswith(b"data: {", start - self.base):
                    if start - self.base > self.lo:
                        self.dropped += start - self.base - self.lo
                        self.lo = start - self.base
                    break
        lo, end = self.lo, self.end
        pending = end - lo
        cap = len(self.buf)
        while pending * 8 > cap or cap - pending < _MIN_FREE:
            cap *= 2
        if cap != len(self.buf):
            new = bytearray(cap)
            new[:pending] = memoryview(self.buf)[lo:end]
            self.buf = new
        elif pending:
            view = memoryview(self.buf)
            view[:pending] = view[lo:end]  # memmove
            view.release()
        self.base += lo
        self.lo, self.end = 0, pending

    def buffer_updated(self, nbytes: int) -> None:
        try:
            self._parse(self.end, self.end + nbytes)
            if self.max_body and self._state != "head" and self.base + self.end > self.max_body \
                    and not (self.sse and self.status == 200):  # base + end: body bytes so far (see _parse)
                raise ResponseTooLarge(f"response body passed {self.max_body} bytes")
        except ResponseTooLarge as e:
            self.error = e
            self.close()
        except (ResponseError, ValueError) as e:
            self.error = ResponseError(f"malformed HTTP response: {e}")
            self.close()
        self.fresh = True
        if self.end - self.lo > 2 * _PAUSE_AT and self.transport is not None and not self._paused:
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
    def body(self) -> bytes:
        """A copy of the unconsumed body bytes (for whole responses; streams read ``buf`` in place)."""
        return bytes(self.buf[self.lo:self.end])

    def consumed(self, upto: int) -> None:
        """The caller is done with the body up to the absolute offset ``upto`` (``base`` + index)."""
        self.lo = max(self.lo, upto - self.base)
        if self.lo == self.end:  # nothing pending: start over at the front (nothing to move)
            self.base += self.lo
            self.lo = self.end = 0
        if self._paused and self.end - self.lo < _PAUSE_AT // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    @property
    def finished(self) -> bool:
        return self.complete or self.closed or self.error is not None

    async def wait(self, timeout: float) -> None:
        """Until new bytes, the end of the response, or an error (raises TimeoutError after ``timeout``)."""
        if self.fresh or self.finished:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await await_within(self._waiter, timeout)
        finally:
            self._waiter = None

    async def wait_gathered(self, gather_s: float) -> None:
        """Until the response is complete (or failed), or the first read once ``gather_s`` has passed, or
        ``2 * gather_s`` at the latest (a backend that pauses). It was a timer at ``gather_s``, a wake-up of
        its own. A paced stream's bytes wake the proxy anyway; ending the gathering in
        the wake-up of a read, instead of at a timer that wakes it again, takes a paced stream's wake-ups
        from ~1.8 to ~1 per event (``scripts/bench_stream_events.py``). Text is held up to ``2 * gather_s``
        instead of ``gather_s``; the first snapshot and the end of a reply are never held."""
        if self.finished:
            return
        self._gather_until = time.monotonic() + gather_s
        self._end_waiter = asyncio.get_running_loop().create_future()
        try:
            await await_within(self._end_waiter, 2 * gather_s)
        except (TimeoutError, asyncio.TimeoutError):
            pass
        finally:
            self._end_waiter = None
            self._gather_until = _NEVER

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    def reset(self) -> None:
        """Ready for the next response on this connection (the previous one was read completely)."""
        self.status, self.headers, self.complete, self.fresh, self.sse = 0, {}, False, False, False
        self.max_body = 0
        self.superseded = False
        if len(self.buf) > 4 * _START_CAP:  # an idle connection keeps no long stream's buffer
            self.buf = bytearray(_START_CAP)
        self.lo = self.end = self.base = 0
        self._state, self._at_line_start = "head", True
        self.aligned.clear()
        self._head.clear()

    # --- parsing ---------------------------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if self._end_waiter is not None and not self._end_waiter.done() and (
                self.finished or self.fresh and time.monotonic() >= self._gather_until):
            self._end_waiter.set_result(None)

    def _parse(self, r: int, stop: int) -> None:
        """Take the new bytes ``buf[r:stop]`` (``r == end``): the head, then the body, de-chunked in place."""
        buf, w, gap = self.buf, r, -1  # w: where the next body byte goes; gap: start of kept framing
        blank = self.sse and self.status == 200
        while r < stop and not self.complete:
            state = self._state
            if blank and state == "chunk_size" and gap < 0 and w == r and self._at_line_start and not self._line:
                # the common read of an event stream: whole chunks, each an event ending in a newline. The same
                # bytes as the general path below (framing blanked in place, the CRLF after the chunk kept as
                # the next gap), without its per-state steps
                nl = buf.find(b"\n", r, stop)
                if nl >= 0:
                    size = _chunk_size(bytes(buf[r:nl]))
                    p = nl + 1
                    q = p + size
                    if size and q + 2 <= stop and buf[q - 1] == _NL:
                        n = p - r
                        buf[r:p] = b"\n" if n == 1 else b":" + b" " * (n - 2) + b"\n"
                        if size >= ALIGNED_MIN:
                            self.aligned.append((self.base + p, self.base + q))
                        gap, r = q, q + 2  # the chunk's CRLF: blanked with whatever framing follows it
                        w = r
                        continue
            if state == "head":  # copied out (it is small), so the body starts where it follows the head
                seen = len(self._head)
                self._head += buf[r:stop]
                i = self._head.find(b"\r\n\r\n", max(0, seen - 3))
                if i < 0:
                    if len(self._head) > _MAX_HEAD:
                        raise ResponseError("response head too large")
                    break
                self._read_head(bytes(self._head[:i]))
                self._head.clear()
                r = w = r + i + 4 - seen
                self.base += self.lo - r  # offsets stay continuous: the body's first byte is at index r
                self.lo = r
                blank = self.sse and self.status == 200
            elif state in ("chunk", "length", "close"):
                if gap >= 0:
                    w, gap = self._blank(gap, w), -1
                take = stop - r if state == "close" else min(self._left, stop - r)
                if w != r:
                    with memoryview(buf) as view:
                        view[w:w + take] = view[r:r + take]
                    self.moved += take
                w, r = w + take, r + take
                self._at_line_start = buf[w - 1] == _NL
                if state != "close":
                    self._left -= take
                    if not self._left:
                        if state == "length":
                            self.complete = True
                        else:
                            self._state, self._left = "chunk_end", 2
            else:  # framing: the CRLF after a chunk, a chunk-size line, the trailer
                if state == "chunk_end":
                    nxt = r + min(self._left, stop - r)
                    self._left -= nxt - r
                    if not self._left:
                        self._state = "chunk_size"
                else:
                    nl = buf.find(b"\n", r, stop)
                    nxt = stop if nl < 0 else nl + 1
                    self._line += buf[r:nxt if nl < 0 else nl]
                    if nl >= 0:
                        self._end_line(state)
                if blank and (gap >= 0 or self._at_line_start):
                    gap = w if gap < 0 else gap
                    w += nxt - r  # overwritten by _blank before the next body byte or the read's end
                    if state == "chunk_size" and self._state == "chunk" and self._left >= ALIGNED_MIN:
                        self.aligned.append((self.base + w, self.base + w + self._left))  # starts a line at w
                r = nxt
        if gap >= 0:
            w = self._blank(gap, w)
        self.end = w

    def _blank(self, gap: int, w: int) -> int:
        """Overwrite the framing kept in ``buf[gap:w]`` (at a line start) with one SSE comment line."""
        n = w - gap
        self.buf[gap:w] = b"\n" if n == 1 else b":" + b" " * (n - 2) + b"\n"
        self._at_line_start = True
        return w

    def _end_line(self, state: str) -> None:
        line = bytes(self._line)
        self._line.clear()
        if state == "chunk_size":
            size = _chunk_size(line)
            self._left, self._state = size, ("chunk" if size else "trailer")
        elif not line.strip():  # the blank line that ends the trailer
            self.complete = True

    def _read_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
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
            if self.max_body and self._left > self.max_body and not (self.sse and self.status == 200):
                raise ResponseTooLarge(f"response declares {self._left} bytes, over {self.max_body}")
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

    async def post(self, path: str, body: bytes, headers: dict[str, str], timeout_s: float, *,
                   sse: bool = False, max_body: int = 0) -> StreamConnection:
        """Send a POST and wait for the response head; a reused connection that the server had closed is
        retried once on a fresh one. ``sse``: the body is read as an event stream (``StreamConnection``'s
        doc); ``max_body``: ``StreamConnection.max_body``. Raises OSError / TimeoutError / ResponseError."""
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
            conn.sse, conn.max_body = sse, max_body
            try:
                conn.transport.write(request)  # type: ignore[union-attr]
                while conn.status == 0 and not conn.finished:
                    await conn.wait(timeout_s)
                    # body bytes that came in the head's read are new to the caller: a stream's first event
                    # sent with the head must not wait for the next read (the next event, or a stall timeout)
                    conn.fresh = conn.status != 0 and conn.end > conn.lo
            except BaseException:  # cancelled (the client hung up) or timed out: the backend must see it
                conn.close()
                raise
            if conn.status:
                return conn
            conn.close()
            if not reused:
                raise conn.error or ResponseError("connection closed before a response")
        raise ResponseError("unreachable")  # pragma: no cover

    async def request(self, path: str, body: bytes, headers: dict[str, str], timeout_s: float,
                      max_body: int = 0) -> tuple[int, bytes]:
        """A whole POST: (status, body). ``timeout_s`` bounds each wait for bytes, as httpx's read timeout
        does. Raises OSError / TimeoutError / ResponseError (a connection that ends before the body's end
        too; ``ResponseTooLarge`` past ``max_body`` bytes); the connection is kept for reuse only after a
        complete response."""
        conn = await self.post(path, body, headers, timeout_s, max_body=max_body)
        try:
            while not conn.finished:
                await conn.wait(timeout_s)
                conn.fresh = False
            if not conn.complete:
                raise conn.error if isinstance(conn.error, OSError | ResponseError) else \
                    ResponseError(f"connection closed before the response's end ({conn.error!r})")
            return conn.status, conn.body
        finally:
            self.release(conn)

    def release(self, conn: StreamConnection) -> None:
        """Keep a connection whose response was read completely; close any other."""
        if conn.complete and conn.keep_alive and not conn.closed and len(self._idle) < self.max_idle:
            conn.reset()  # what is left belongs to the finished response (the blank line after [DONE])
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
