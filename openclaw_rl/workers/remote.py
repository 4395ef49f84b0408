"""A worker's line to the owner: the session tracker's calls sent as records, the owner's answers awaited.

Stage: serving (worker) → **remote tracker** → owner. ``RemoteTracker`` has the four calls serving makes
on a ``SessionTracker`` (``begin``, ``complete``, ``fail``, ``end_session``) and sends each as a record;
``complete`` returns a future that the owner's ``Committed`` resolves, which serving awaits before the
reply's last byte exactly as it awaits the writer's commit future in one process. If the owner is gone,
every such future fails and the reply is refused (503), never sent as if saved.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Callable
from typing import Any

from ..errors import Forbidden, NotDurable, NotFound, OpenClawError, Unauthorized
from ..metrics import ProxyMetrics
from ..spool import SpoolMissing
from ..turns import DropReason, Generation, Turn, _b64
from . import wire
from .owner import families_of

log = logging.getLogger(__name__)


class CommitFailed(Exception):
    """The owner could not commit the turn (its writer's error), or the owner is gone."""


class OwnerGone(OpenClawError):
    status = 503
    error_type = "server_error"


_FORWARDED: dict[int, type[OpenClawError]] = {cls.status: cls for cls in (Unauthorized, Forbidden, NotFound, NotDurable)}
"""The owner's refusals a worker answers with the same status (401/403 of user admin, 404 of feedback or an
unknown user, 503 of a spool that cannot delete); any other owner error is ``OwnerGone``."""


class OwnerClient:
    """The worker's connection to the owner. ``state`` is the owner's last ``Status``; ``on_lost`` runs
    once when the connection ends (a worker process then exits: the supervisor starts another)."""

    def __init__(self, path: str, worker: int, metrics: ProxyMetrics, on_status: Callable[[wire.Status], None],
                 on_forget: Callable[[str], None], on_lost: Callable[[], None] = lambda: None):
        self.path, self.worker, self.metrics = path, worker, metrics
        self.on_status, self.on_forget, self.on_lost = on_status, on_forget, on_lost
        self.state: wire.Status | None = None
        self.link: wire.Link | None = None
        self._commits: dict[int, asyncio.Future] = {}
        self._answers: dict[int, asyncio.Future] = {}
        self._calls = itertools.count(1)
        self._reader: asyncio.Task | None = None
        self._closing = False  # this worker is stopping: the end of the connection is expected

    @property
    def gone(self) -> bool:
        return self.link is None or self.link.closed

    async def connect(self) -> None:
        reader, writer = await asyncio.open_unix_connection(self.path)
        self.link = wire.Link(reader, writer)
        self.link.send(wire.Hello(self.worker, os.getpid()))
        first = await wire.read_record(reader)
        if not isinstance(first, wire.Status):
            raise ConnectionError(f"the owner at {self.path} did not answer (got {type(first).__name__})")
        self._status(first)
        self._reader = asyncio.get_running_loop().create_task(self._read(reader))

    async def close(self) -> None:
        self._closing = True
        if self.link is not None:
            await self.link.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    def send(self, record: Any) -> bool:
        return self.link is not None and self.link.send(record)

    def _status(self, status: wire.Status) -> None:
        self.state = status
        self.on_status(status)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while (record := await wire.read_record(reader)) is not None:
                if isinstance(record, wire.Committed):
                    fut = self._commits.pop(record.turn_id, None)
                    if fut is not None and not fut.done():
                        if record.ok:
                            fut.set_result(None)
                        elif record.reason == "spool_missing":
                            fut.set_exception(SpoolMissing(record.detail))
                        else:
                            fut.set_exception(CommitFailed(record.detail))
                elif isinstance(record, wire.Answer):
                    fut = self._answers.pop(record.call, None)
                    if fut is not None and not fut.done():
                        fut.set_result(record)
                elif isinstance(record, wire.Status):
                    self._status(record)
                elif isinstance(record, wire.Forget):
                    self.on_forget(record.key)
                elif isinstance(record, wire.Collect):
                    self.send(wire.Answer(record.call, value=families_of(self.metrics.registry)))
        except wire.ProtocolError as e:
            log.error("the owner sent a bad record: %s", e)
        finally:
            if self.link is not None:
                self.link.closed = True
            for fut in [*self._commits.values(), *self._answers.values()]:
                if not fut.done():
                    fut.set_exception(CommitFailed("the owner process is gone"))
            self._commits.clear()
            self._answers.clear()
            if not self._closing:
                log.warning("worker %d: the owner's connection ended; this worker stops", self.worker)
                self.on_lost()

    def expect_commit(self, turn_id: int) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        if self.gone:
            fut.set_exception(CommitFailed("the owner process is gone"))
        else:
            self._commits[turn_id] = fut
        return fut

    async def call(self, what: str, timeout_s: float = 30.0, **args: Any) -> Any:
        """Ask the owner; its error comes back as the same status (404 for feedback without a turn)."""
        if self.gone:
            raise OwnerGone("this worker lost its owner process; retry")
        call = next(self._calls)
        fut = self._answers[call] = asyncio.get_running_loop().create_future()
        self.send(wire.Call(call, what, args))
        try:
            answer: wire.Answer = await asyncio.wait_for(fut, timeout_s)
        except CommitFailed:
            raise OwnerGone("this worker lost its owner process; retry") from None
        except asyncio.TimeoutError:
            self._answers.pop(call, None)
            raise OwnerGone(f"the owner did not answer within {timeout_s:g}s") from None
        if answer.error is not None:
            raise _FORWARDED.get(answer.status or 0, OwnerGone)(answer.error)
        return answer.value

    def refusal(self) -> OpenClawError | None:
        """The spool's state as the owner last told it (or the owner gone), for ``routes.spool_refusal``."""
        if self.gone:
            self.metrics.not_durable.labels("owner_gone").inc()
            return NotDurable("this worker lost its owner process and cannot save turns; retry",
                              headers={"Retry-After": "1"})
        return None


class RemoteTracker:
    """What serving calls on its tracker, sent to the owner's (see the module docstring)."""

    def __init__(self, client: OwnerClient):
        self.client = client
        self._ids: dict[int, int] = {}  # id(turn) → its turn_id on the wire, until it is settled
        self._next = itertools.count(1)

    def begin(self, turn: Turn, next_state: dict[str, str] | None) -> Turn:
        turn_id = next(self._next)
        self._ids[id(turn)] = turn_id
        self.client.send(wire.Begin(turn_id, turn.to_record(), next_state))
        return turn  # numbered by the owner; this copy keeps index 0

    def complete(self, turn: Turn, generation: Generation) -> asyncio.Future | None:
        turn_id = self._ids.get(id(turn))
        if turn_id is None:
            return None
        fut = self.client.expect_commit(turn_id)
        self.client.send(wire.Complete(turn_id, _b64(generation.response_ids), _b64(generation.response_logprobs),
                                       generation.text, generation.finish_reason, generation.weight_version))

        def settled(f: asyncio.Future) -> None:
            if not f.cancelled() and f.exception() is None:
                self._ids.pop(id(turn), None)
        fut.add_done_callback(settled)
        return fut

    def fail(self, turn: Turn, reason: DropReason, detail: str = "") -> None:
        turn_id = self._ids.pop(id(turn), None)
        if turn_id is not None:
            self.client.send(wire.Fail(turn_id, reason.value, detail))

    def end_session(self, key: str, why: str = "done") -> None:
        self.client.send(wire.EndSession(key))
