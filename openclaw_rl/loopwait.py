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
  loop turn as the work's end (its callback queued already) cancels nothing: the caller has moved on. A
  cancellation from elsewhere (the server stopping) propagates, also when it comes with the hang-up's or
  during the work's clean-up after it: Python 3.11+ counts a task's cancellations (``Task.uncancel``), so
  the hang-up's own is taken back and the other stands. Python 3.10 does not count them (two merge into
  one), so there ``work`` runs in a task of its own, the one the hang-up cancels (``asyncio.wait`` over it
  and the watcher: one task and a waiter more per request, 3.10 only).
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


async def await_within(fut: asyncio.Future, timeout: float) -> None:
    """``await asyncio.wait_for(fut, timeout)`` for a future only its owner resolves (rawstream's reader's waiter):
    a timer sets ``TimeoutError`` on it instead. Python 3.11's ``wait_for`` wraps the future, adds a waiter
    and, on the timeout that ends most of a stream's gathering windows, cancels and waits again: ~12% of the
    proxy's CPU on a paced stream (yappi), for one wait per event. The wakers check ``done()`` first."""
    handle = asyncio.get_running_loop().call_later(timeout, _expire, fut)
    try:
        await fut
    finally:
        handle.cancel()


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


COUNTS_CANCELS = hasattr(asyncio.Task, "uncancel")
"""Python 3.11+: a task counts the cancellations asked of it, so ``until_disconnect`` can take back the
hang-up's own and tell whether one from elsewhere stands (3.10: ``work`` runs in a task of its own)."""


async def until_disconnect(receive: Callable[[], Awaitable[dict[str, Any]]], work: Awaitable[T]) -> T | None:
    """Await ``work`` in this task, cancelled if the client hangs up first (an ``http.disconnect`` from the ASGI
    ``receive``, called once: the caller has read the whole body, so nothing else can come); returns None when
    the client left, whatever ``work`` did with the cancellation. A cancellation from elsewhere propagates."""
    if not COUNTS_CANCELS:
        return await _in_a_task_of_its_own(receive, work)
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


async def _in_a_task_of_its_own(receive: Callable[[], Awaitable[dict[str, Any]]], work: Awaitable[T]) -> T | None:
    """``until_disconnect`` where a task does not count its cancellations (3.10): ``work`` in a task of its own,
    so the hang-up cancels that task and a cancellation of this one is never taken for it."""
    job = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(receive())
    try:
        done, _ = await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if job not in done and not watcher.cancelled() and watcher.exception() is None \
                and watcher.result().get("type") == "http.disconnect":
            job.cancel()
            await asyncio.wait({job})  # its clean-up done, as in the caller's task; None whatever it did
            _retrieve(job)
            return None
        return await job  # finished, or the watcher heard something else: nothing more to watch for
    except asyncio.CancelledError:  # from elsewhere: it cancels the work too, and stands
        job.cancel()
        await asyncio.wait({job})
        _retrieve(job)
        raise
    finally:
        watcher.cancel()


def _retrieve(job: asyncio.Future) -> None:
    """Take the outcome of a finished ``job`` that is not answered (the caller's is None, or the cancellation):
    an error left unasked would be logged, with its traceback, as "Task exception was never retrieved" when
    the task goes (the 3.11+ path swallows it in the caller's task, silently)."""
    if not job.cancelled():
        job.exception()


def _uncancel(task: asyncio.Task) -> int:
    """``task.uncancel()`` where there is one (3.11+): the cancellations still standing (0 on 3.10)."""
    uncancel = getattr(task, "uncancel", None)
    return uncancel() if uncancel is not None else 0
