"""The owner process of ``serve --workers N``: the one session tracker, judge and spool writer of all workers.

Stage: workers → **owner** → sessions → scorer → spool. The owner is a whole ``Proxy`` (``Proxy.build``:
it locks the spool, restores its waiting turns and runs the judge, the journal and the backend probes)
that serves no HTTP: its tracker is driven by the workers' records (``wire.py``) on its own event loop,
in the order each worker sent them, exactly as the one-process routes drive it. So a session's next
request pairs with its waiting turn whichever worker serves it, and one process writes the spool.

A ``Complete`` is answered with ``Committed`` once the writer's commit future is done: the worker sends
its reply's last byte only then (a 200 still means the turn is saved). When a worker's connection ends
(it exited or was killed), its turns still generating are dropped as ``client_disconnected``: their
clients saw a cut connection, and nothing of them was saved. Turns it had completed were saved whole
when their ``Complete`` arrived, as a one-process proxy killed after the commit keeps its turn.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from ..dashboard.data import waiting_from_tracker
from ..errors import OpenClawError
from ..server import Proxy
from ..spool import SpoolMissing
from ..turns import DropReason, Generation, Turn, _unb64
from ..users.deletion import delete_user_as, list_users_as
from . import wire

log = logging.getLogger(__name__)

COLLECT_TIMEOUT_S = 5.0  # a worker that does not send its metrics by then is left out of that scrape


@dataclass(eq=False)
class WorkerConn:
    link: wire.Link
    worker: int = -1
    pid: int = 0
    turns: dict[int, Turn] = field(default_factory=dict)  # begun, not yet failed or committed


class OwnerHub:
    """The owner's side of the workers' Unix socket (see the module docstring)."""

    def __init__(self, proxy: Proxy, workers: int):
        self.proxy, self.workers = proxy, workers
        self.conns: set[WorkerConn] = set()
        self.restarts = 0  # set by the supervisor
        self.connected = asyncio.Condition()  # notified when a worker connects or goes (tests wait on it)
        self._calls = itertools.count(1)
        self._collects: dict[int, asyncio.Future] = {}
        self._server: asyncio.AbstractServer | None = None
        self._status_task: asyncio.Task | None = None
        self._last_status: wire.Status | None = None
        self._status_changed = asyncio.Event()  # set where the state ``status()`` reads may have changed
        forget = proxy.tracker.on_end

        def on_end(key: str) -> None:  # a session ended: every worker drops its cached prompt prefix
            forget(key)
            self.broadcast(wire.Forget(key))
        proxy.tracker.on_end = on_end

    async def start(self, path: str) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=path)
        os.chmod(path, 0o600)
        loop = asyncio.get_running_loop()

        def writer_changed() -> None:  # on the writer thread: its problem or overflow changed
            try:
                loop.call_soon_threadsafe(self._status_changed.set)
            except RuntimeError:  # the loop is closed: no worker is left to tell
                pass
        self.proxy.writer.on_state_change = writer_changed
        self.proxy.probes.on_refresh = self._status_changed.set  # on this loop: a context length learned
        self._status_task = loop.create_task(self._push_status())

    async def close(self) -> None:
        """Stop taking workers; the connections still open are closed (call after the workers exited)."""
        self.proxy.writer.on_state_change = self.proxy.probes.on_refresh = None
        if self._status_task is not None:
            self._status_task.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self.conns):
            await conn.link.close()

    def broadcast(self, record: Any) -> None:
        for conn in list(self.conns):
            conn.link.send(record)

    def status(self) -> wire.Status:
        # the writer's refusal state: the overflow's length only while overloaded (below the bound it changes with
        # every write while the spool is full, and each distinct Status goes to every worker)
        problem, overloaded, overflow = self.proxy.writer.refusal_state()
        return wire.Status(overloaded=overloaded, overflow=overflow, problem=problem,
                           context_length=self.proxy.service.context_length,
                           keep_messages=self.proxy.service.keep_messages)

    async def _push_status(self) -> None:
        """Send every worker the new ``status()`` when it changed. Event-driven, no poll: each field has a
        hook that sets ``_status_changed`` (the writer's problem, overloaded and overflow while overloaded: its
        ``on_state_change``, from the writer thread; the policy's context length: the probes'
        ``on_refresh``; ``keep_messages`` is fixed at start), so an idle owner sleeps here."""
        while True:
            status = self.status()
            if status != self._last_status:
                self._last_status = status
                self.broadcast(status)
            await self._status_changed.wait()
            self._status_changed.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = WorkerConn(wire.Link(reader, writer))
        try:
            hello = await wire.read_record(reader)
            if not isinstance(hello, wire.Hello):
                raise wire.ProtocolError(f"expected hello, got {type(hello).__name__}")
            conn.worker, conn.pid = hello.worker, hello.pid
            conn.link.send(self.status())
            async with self.connected:
                self.conns.add(conn)
                self.connected.notify_all()
            while (record := await wire.read_record(reader)) is not None:
                try:
                    self._handle(conn, record)
                except (KeyError, TypeError, ValueError) as e:  # e.g. a drop reason this owner does not know
                    raise wire.ProtocolError(f"{type(record).__name__}: {type(e).__name__}: {e}") from None
        except wire.ProtocolError as e:
            log.error("worker %d (pid %d) sent a bad record, its connection is closed: %s", conn.worker, conn.pid, e)
        finally:
            self._lost(conn)
            await conn.link.close()
            async with self.connected:
                self.conns.discard(conn)
                self.connected.notify_all()

    def _handle(self, conn: WorkerConn, record: Any) -> None:
        tracker = self.proxy.tracker
        if isinstance(record, wire.Begin):
            conn.turns[record.turn_id] = tracker.begin(Turn.from_record(record.turn), record.next_state)
        elif isinstance(record, wire.Complete):
            self._complete(conn, record)
        elif isinstance(record, wire.Fail):
            turn = conn.turns.pop(record.turn_id, None)
            if turn is not None:
                tracker.fail(turn, DropReason(record.reason), record.detail)
        elif isinstance(record, wire.EndSession):
            tracker.end_session(record.key)
        elif isinstance(record, wire.Call):
            asyncio.get_running_loop().create_task(self._answer(conn, record))
        elif isinstance(record, wire.Answer):
            fut = self._collects.get(record.call)
            if fut is not None and not fut.done():
                fut.set_result(record.value)
        else:
            raise wire.ProtocolError(f"a worker does not send {type(record).__name__}")

    def _complete(self, conn: WorkerConn, record: wire.Complete) -> None:
        turn = conn.turns.get(record.turn_id)
        if turn is None:
            conn.link.send(wire.Committed(record.turn_id, False, "write_failed", "the owner knows no such turn"))
            return
        try:
            gen = Generation(_unb64("i", record.ids), _unb64("d", record.logprobs), record.text,
                             record.finish_reason, record.weight_version)
            durable = self.proxy.tracker.complete(turn, gen)
        except Exception as e:  # as serving's _settle: this turn is lost, its session is not
            log.exception("settling turn %d from worker %d failed", turn.index, conn.worker)
            conn.turns.pop(record.turn_id, None)
            self.proxy.tracker.fail(turn, DropReason.SETTLE_FAILED, repr(e))
            durable = None
        if durable is None:  # dropped or superseded: nothing to make durable (one process answers too)
            conn.turns.pop(record.turn_id, None)
            conn.link.send(wire.Committed(record.turn_id, True))
            return
        loop = asyncio.get_running_loop()
        durable.add_done_callback(lambda fut: loop.call_soon_threadsafe(self._committed, conn, record.turn_id, fut))

    def _committed(self, conn: WorkerConn, turn_id: int, fut: Future) -> None:
        error = fut.exception()
        if error is None:
            conn.turns.pop(turn_id, None)
            conn.link.send(wire.Committed(turn_id, True))
        else:  # the worker refuses its reply (503) and sends Fail(not_durable), as one process does
            reason = "spool_missing" if isinstance(error, SpoolMissing) else "write_failed"
            conn.link.send(wire.Committed(turn_id, False, reason, f"{type(error).__name__}: {error}"))

    def _lost(self, conn: WorkerConn) -> None:
        """A worker's connection ended: its turns still generating can never be answered."""
        for turn in conn.turns.values():
            if turn.generation is None:
                self.proxy.tracker.fail(turn, DropReason.CLIENT_DISCONNECTED,
                                        f"worker {conn.worker} (pid {conn.pid}) exited before the reply")
        if conn.turns:
            log.warning("worker %d (pid %d) gone with %d turns in flight", conn.worker, conn.pid, len(conn.turns))
        conn.turns.clear()

    async def _answer(self, conn: WorkerConn, call: wire.Call) -> None:
        try:
            value = await self._call(call)
        except OpenClawError as e:
            conn.link.send(wire.Answer(call.call, error=e.message, status=e.status))
        except Exception as e:  # noqa: BLE001 - answered as an error, never left waiting
            log.exception("answering a worker's %s call failed", call.what)
            conn.link.send(wire.Answer(call.call, error=f"{type(e).__name__}: {e}", status=500))
        else:
            conn.link.send(wire.Answer(call.call, value=value))

    async def _call(self, call: wire.Call) -> Any:
        if call.what == "feedback":
            a = call.args
            turn, how = self.proxy.tracker.feedback(a["key"], a["rating"], a["text"])
            return [turn, how]
        if call.what == "health":
            return {**self.proxy.health(), "workers": {"configured": self.workers, "connected": len(self.conns),
                                                       "restarts": self.restarts}}
        if call.what == "metrics":
            return (await self.metrics()).decode()
        if call.what == "waiting":  # a worker's dashboard: the live list, as one process's dashboard shows it
            a = call.args
            if a.get("session") is not None:  # the turn page: that turn's rows in full
                return waiting_from_tracker(self.proxy.tracker, a.get("ns"), turn=(a["session"], a["turn"]))
            return waiting_from_tracker(self.proxy.tracker, a.get("ns"), preview=True)
        if call.what == "users":
            return await list_users_as(self.proxy, call.args["authorization"])
        if call.what == "delete_user":
            return await delete_user_as(self.proxy, call.args["user"], call.args["authorization"])
        raise wire.ProtocolError(f"unknown call {call.what!r}")

    async def metrics(self) -> bytes:
        """The owner's metrics with every worker's counters and histograms added in (gauges are the owner's
        state: sessions, spool, backends)."""
        self.proxy.refresh_gauges()
        loop = asyncio.get_running_loop()
        waits = []
        for conn in list(self.conns):
            call = next(self._calls)
            self._collects[call] = fut = loop.create_future()
            waits.append((call, fut))
            conn.link.send(wire.Collect(call))
        try:
            parts = []
            if waits:
                done, _ = await asyncio.wait([f for _, f in waits], timeout=COLLECT_TIMEOUT_S)
                parts = [f.result() for f in done if f.result() is not None]
        finally:
            for call, _ in waits:
                self._collects.pop(call, None)
        return merge_metrics(self.proxy.metrics.registry, parts)


def merge_metrics(own: CollectorRegistry, workers: list[list[Any]]) -> bytes:
    """The exposition text of ``own`` with the workers' families (``families_of``) added sample by sample;
    their gauges and ``_created`` stamps are left out."""
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple, float]] = {}
    for family in own.collect():
        merged[family.name] = Metric(family.name, family.documentation, family.type)
        values[family.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
    for part in workers:
        for name, doc, kind, samples in part:
            if kind == "gauge":
                continue
            if name not in merged:
                merged[name] = Metric(name, doc, kind)
                values[name] = {}
            for sample_name, labels, value in samples:
                if sample_name.endswith("_created") or value is None:
                    continue
                key = (sample_name, tuple(sorted(labels.items())))
                values[name][key] = values[name].get(key, 0.0) + value
    for name, family in merged.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)

    class Merged:
        def collect(self) -> list[Metric]:
            return list(merged.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Merged())  # type: ignore[arg-type]
    return generate_latest(registry)


def families_of(registry: CollectorRegistry) -> list[list[Any]]:
    """A worker's metrics as JSON-able families: [name, documentation, type, [[sample, labels, value]...]]."""
    return [[m.name, m.documentation, m.type, [[s.name, s.labels, s.value] for s in m.samples]]
            for m in registry.collect()]
