"""The owner ↔ worker protocol: typed records, one JSON document per length-prefixed frame on a Unix socket.

Stage: serving (worker) → **wire** → sessions (owner). Each record is a dataclass; a frame is a 4-byte
big-endian length and the record as orjson (``codec``, a declared dependency) with its type in ``"t"``.
Token ids and log-probs travel as base64 of their ``array`` bytes, the spool's own encoding of a waiting
turn (``Turn.to_record``): exact, and microseconds for 8K ids. A stream socket keeps one worker's records
in order, so a turn's ``Begin`` always reaches the owner before its ``Complete`` or ``Fail``.

Worker → owner: ``Hello`` once, then ``Begin`` / ``Complete`` / ``Fail`` / ``EndSession`` (the tracker's
calls), and ``Call`` (feedback, health, metrics, users, waiting). Owner → worker: ``Committed`` (the answer to a
``Complete``: the turn is in the spool, or why not), ``Answer`` (to a ``Call``), ``Status`` (the spool's
state and the policy's context length, pushed when they change), ``Forget`` (a session ended: drop its
cached prompt prefix) and ``Collect`` (send your metrics).
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from .. import codec

HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 30  # a record is at most one request's messages and ids: far below this


@dataclass(slots=True)
class Hello:
    tag: ClassVar[str] = "hello"
    worker: int
    pid: int


@dataclass(slots=True)
class Begin:
    """A main-line request arrived (``SessionTracker.begin``): the turn as ``Turn.to_record`` has it."""
    tag: ClassVar[str] = "begin"
    turn_id: int
    turn: dict[str, Any]
    next_state: dict[str, str] | None


@dataclass(slots=True)
class Complete:
    """The policy answered and the reply passed its checks (``SessionTracker.complete``); ``Committed``
    with the same ``turn_id`` answers it."""
    tag: ClassVar[str] = "complete"
    turn_id: int
    ids: str  # base64 of array('i')
    logprobs: str  # base64 of array('d')
    text: str
    finish_reason: str
    weight_version: str | None


@dataclass(slots=True)
class Fail:
    tag: ClassVar[str] = "fail"
    turn_id: int
    reason: str  # a DropReason value
    detail: str = ""


@dataclass(slots=True)
class EndSession:
    tag: ClassVar[str] = "end_session"
    key: str


@dataclass(slots=True)
class Call:
    """A question for the owner: ``feedback`` (args: key, rating, text), ``health``, ``metrics``, ``users``
    and ``delete_user`` (args: authorization, user), ``waiting`` (args: ns; the tracker's waiting turns
    that namespace may see, for a worker's dashboard: ``dashboard.data.waiting_from_tracker``'s rows, as
    previews; with session and turn, that turn's rows in full)."""
    tag: ClassVar[str] = "call"
    call: int
    what: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Committed:
    """The owner's word on a ``Complete``: ``ok`` once the turn is committed (or needs no commit: dropped,
    superseded), else ``reason`` (``spool_missing`` / ``write_failed``) and ``detail``."""
    tag: ClassVar[str] = "committed"
    turn_id: int
    ok: bool
    reason: str = ""
    detail: str = ""


@dataclass(slots=True)
class Answer:
    """The answer to a ``Call`` (or to a ``Collect``): a value, or an error (``status`` and message)."""
    tag: ClassVar[str] = "answer"
    call: int
    value: Any = None
    error: str | None = None
    status: int = 0


@dataclass(slots=True)
class Status:
    tag: ClassVar[str] = "status"
    overloaded: bool
    overflow: int
    problem: str | None
    context_length: int | None
    keep_messages: bool  # the owner's scorer (or its record dir) needs each turn's messages


@dataclass(slots=True)
class Forget:
    tag: ClassVar[str] = "forget"
    key: str


@dataclass(slots=True)
class Collect:
    tag: ClassVar[str] = "collect"
    call: int


Record = Hello | Begin | Complete | Fail | EndSession | Call | Committed | Answer | Status | Forget | Collect
KINDS: dict[str, type] = {cls.tag: cls for cls in (Hello, Begin, Complete, Fail, EndSession, Call, Committed, Answer,
                                                   Status, Forget, Collect)}


class ProtocolError(Exception):
    """A frame that is not a record of this protocol: the connection is closed."""


def encode(record: Any) -> bytes:
    doc = {"t": record.tag, **{f.name: getattr(record, f.name) for f in fields(record)}}
    body = codec.dumps(doc)
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> Any:
    try:
        doc = codec.loads(body)
        kind = KINDS[doc.pop("t")]
        return kind(**doc)
    except (*codec.DecodeError, KeyError, TypeError, AttributeError) as e:
        raise ProtocolError(f"not a record: {type(e).__name__}: {e}") from None


async def read_record(reader: asyncio.StreamReader) -> Any | None:
    """The next record, or None at a clean end of the stream (the peer closed or died)."""
    try:
        head = await reader.readexactly(HEADER.size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes")
    try:
        body = await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return decode(body)


class Link:
    """One end of a connection: ``send`` writes a frame now (records are small; the socket's buffer takes
    them), a writer that is gone drops the record and says so (``closed``)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.closed = False

    def send(self, record: Any) -> bool:
        if self.closed or self.writer.is_closing():
            self.closed = True
            return False
        try:
            self.writer.write(encode(record))
        except (ConnectionError, RuntimeError):
            self.closed = True
            return False
        return True

    async def close(self) -> None:
        self.closed = True
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
