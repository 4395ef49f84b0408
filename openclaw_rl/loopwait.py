"""How a request's coroutine waits for another thread and for its client, with the fewest loop objects.

Stage: routes → serving → sessions (shared by the chat route and ``serving.ChatService``). A non-streamed turn
waits for the render thread (its prompt), for the spool writer (its commit) and, all along, for a hang-up
of its client. asyncio's general tools cost the event loop more than these waits need: ``run_in_executor``
and ``wrap_future`` chain a loop future to the thread's future in both directions through four callbacks,
``wait_for`` adds a waiter future and a callback on top, and watching for a hang-up with ``asyncio.wait``
over two extra tasks adds two tasks and a waiter per request (issue #33 item 2; ``scripts/bench_loopwait.py``
times each wait both ways, docs/performance.md "Event loop, fourth pass"). The semantics are theirs:

- ``thread_result``: the thread's result or exception; a deadline raises ``TimeoutError``; a waiter that
  gives up (deadline, cancelled) cancels the thread's future, so work not yet started is skipped, as
  ``run_in_executor`` and ``wait_for(wrap_future(...))`` do. A future settled as the deadline fires (its copy
  queued behind the timer) gives its outcome, not a timeout, as 3.10/3.11's ``wait_for`` did: a commit that
  happened is not reported as failed.
- ``until_disconnect``: ``work`` runs in the calling task (no task of its own); a hang-up cancels it there and
  the call returns None, as ``asyncio.wait`` over a work task and a watcher did. A hang-up heard in the same
  loop turn as the work's end (its callback queued already) cancels nothing: the caller has moved on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


def _copy(source: concurrent.futures.Future, dest: asyncio.Future) -> None:
    """On the loop: ``source``'s outcome onto ``dest`` (unless the waiter gave up already)."""
    if dest.done():
        return
    if source.cancelled():
        dest.cancel()
        return
    error = source.exception()
    if error is not None:
        dest.set_exception(error)
    else:
        dest.set_result(source.result())


async def thread_result(source: concurrent.futures.Future, timeout: float | None = None) -> Any:
    """``await asyncio.wait_for(asyncio.wrap_future(source), timeout)`` (``timeout`` None: no deadline) for a
    future another thread settles: one loop future, one callback on ``source``, one timer. A future that is
    done already is answered without waiting. ``TimeoutError`` at the deadline (Python 3.11's
    ``asyncio.TimeoutError`` is the same class)."""
    if source.done():
        if source.cancelled():
            raise asyncio.CancelledError()
        return source.result()
    loop = asyncio.get_running_loop()
    dest = loop.create_future()

    def settled(done: concurrent.futures.Future) -> None:  # on the thread that settled it
        if not loop.is_closed():
            loop.call_soon_threadsafe(_copy, done, dest)

    source.add_done_callback(settled)
    timer = loop.call_later(timeout, _expire, dest) if timeout is not None else None
    try:
        return await dest
    except BaseException as e:
        # the waiter gave up (deadline, cancelled): work not yet started is skipped
        if not source.cancel() and isinstance(e, TimeoutError) and source.done():
            # settled as the deadline fired (its copy queued behind the timer): its outcome, not a timeout
            # (a commit that happened is not reported as failed), as wait_for(wrap_future(...)) answered
            return source.result()
        raise
    finally:
        if timer is not None:
            timer.cancel()


async def until_disconnect(receive: Callable[[], Awaitable[dict[str, Any]]], work: Awaitable[T]) -> T | None:
    """Await ``work`` in this task, cancelled if the client hangs up first (an ``http.disconnect`` from the ASGI
    ``receive``, called once: the caller has read the whole body, so nothing else can come); returns None when
    the client left, whatever ``work`` did with the cancellation. A cancellation from elsewhere propagates."""
    task = asyncio.current_task()
    assert task is not None
    gone = finished = False

    def heard(watcher: asyncio.Future) -> None:
        nonlocal gone
        if watcher.cancelled() or watcher.exception() is not None or finished:
            return  # finished: queued before the callback was removed; the caller has moved on
        if watcher.result().get("type") == "http.disconnect":
            gone = True
            task.cancel()

    watcher = asyncio.ensure_future(receive())
    watcher.add_done_callback(heard)
    try:
        result = await work
    except BaseException:
        if not gone:
            raise
        if _uncancel(task) > 0:  # cancelled from elsewhere too (the server stopping): that one stands
            raise
        return None
    finally:
        finished = True
        watcher.remove_done_callback(heard)
        watcher.cancel()
    if gone:  # ``work`` swallowed the cancellation; the client is gone all the same
        _uncancel(task)
        return None
    return result


def _uncancel(task: asyncio.Task) -> int:
    """``task.uncancel()`` where there is one (3.11+): the cancellations still standing (0 on 3.10)."""
    uncancel = getattr(task, "uncancel", None)
    return uncancel() if uncancel is not None else 0
