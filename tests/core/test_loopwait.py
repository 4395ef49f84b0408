"""loopwait: a hang-up still cancels the work (in the caller's task), and a thread's future is waited for with
wait_for(wrap_future(...))'s semantics (result, error, deadline, giving up cancels the thread's future).

The ``until_disconnect`` tests run on both of its paths: this Python's, and the one Python 3.10 takes (no
``Task.uncancel``: the work in a task of its own), forced here on 3.11+ (``both_paths``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading

import pytest

from openclaw_rl import loopwait
from openclaw_rl.loopwait import thread_result, until_disconnect


@pytest.fixture(params=["this python", "python 3.10's"])
def both_paths(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.param != "this python":
        monkeypatch.setattr(loopwait, "COUNTS_CANCELS", False)


async def answer(waiting: asyncio.Future) -> object:
    """``waiting``'s outcome; a failure rather than a hang if it never comes (a hang-up that cancels nothing)."""
    done, _ = await asyncio.wait({waiting}, timeout=10)
    assert waiting in done, "the work was not cancelled"
    return waiting.result()


class Client:
    """An ASGI ``receive`` whose one message (the disconnect) comes when the test says so."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.calls = 0

    async def receive(self) -> dict:
        self.calls += 1
        await self.gone.wait()
        return {"type": "http.disconnect"}


def test_a_hang_up_cancels_the_work_in_the_callers_task(both_paths: None) -> None:
    async def main() -> None:
        client, started, seen = Client(), asyncio.Event(), []
        caller = asyncio.current_task()

        async def work() -> str:
            seen.append(asyncio.current_task() is caller)
            started.set()
            try:
                await asyncio.Event().wait()  # a backend call that never answers
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            return "never"

        waiting = asyncio.ensure_future(until_disconnect(client.receive, work()))
        await started.wait()
        client.gone.set()
        assert await answer(waiting) is None
        assert seen == [False, "cancelled"]  # ran in the wrapper's task (not a task of its own), then cancelled
        assert client.calls == 1
    asyncio.run(main())


def test_work_that_finishes_first_is_answered_and_the_watcher_is_stopped(both_paths: None) -> None:
    async def main() -> None:
        client = Client()

        async def work() -> str:
            await asyncio.sleep(0)
            return "answer"

        assert await until_disconnect(client.receive, work()) == "answer"
        await asyncio.sleep(0)
        watchers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert all(t.done() for t in watchers)  # no receive() left waiting
        cancelling = getattr(asyncio.current_task(), "cancelling", lambda: 0)  # Python 3.11+
        assert not cancelling()  # no cancellation left standing on the caller
    asyncio.run(main())


def test_an_error_of_the_work_propagates_while_the_client_is_there(both_paths: None) -> None:
    async def main() -> None:
        async def work() -> str:
            raise ValueError("backend")

        with pytest.raises(ValueError, match="backend"):
            await until_disconnect(Client().receive, work())
    asyncio.run(main())


def test_work_that_swallows_the_cancellation_still_answers_none(both_paths: None) -> None:
    async def main() -> None:
        client, started = Client(), asyncio.Event()

        async def work() -> str:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                return "swallowed"
            return "never"

        waiting = asyncio.ensure_future(until_disconnect(client.receive, work()))
        await started.wait()
        client.gone.set()
        assert await answer(waiting) is None
    asyncio.run(main())


def test_a_cancellation_from_elsewhere_propagates(both_paths: None) -> None:
    async def main() -> None:
        started = asyncio.Event()

        async def work() -> str:
            started.set()
            await asyncio.Event().wait()
            return "never"

        waiting = asyncio.ensure_future(until_disconnect(Client().receive, work()))
        await started.wait()
        waiting.cancel()  # the server stopping, not the client leaving
        with pytest.raises(asyncio.CancelledError):
            await waiting
    asyncio.run(main())


def test_a_cancellation_from_elsewhere_during_the_clean_up_after_a_hang_up_propagates(both_paths: None) -> None:
    """The client hangs up; while the work cleans up after that cancellation, the server stops (cancels the
    request's task): that cancellation stands, not a 499 (Python 3.10 merged the two and answered None)."""
    async def main() -> None:
        client, started, cleaning = Client(), asyncio.Event(), asyncio.Event()

        async def work() -> str:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cleaning.set()
                await asyncio.Event().wait()  # e.g. telling the tracker; cancelled again by the server
                raise
            return "never"

        waiting = asyncio.ensure_future(until_disconnect(client.receive, work()))
        await started.wait()
        client.gone.set()
        await cleaning.wait()
        waiting.cancel()  # the server stopping
        with pytest.raises(asyncio.CancelledError):
            await answer(waiting)
    asyncio.run(main())


def test_a_cancellation_from_elsewhere_with_the_hang_ups_propagates(both_paths: None) -> None:
    """The server's cancellation queued right behind the hang-up's, before the request's task resumes: it
    stands (Python 3.10 merged the two into one and answered None)."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        started, request = asyncio.Event(), loop.create_future()

        async def receive() -> dict:
            await started.wait()
            task = await request
            loop.call_soon(loop.call_soon, task.cancel)  # runs after the watcher's done callbacks
            return {"type": "http.disconnect"}

        async def work() -> str:
            started.set()
            await asyncio.Event().wait()
            return "never"

        waiting = asyncio.ensure_future(until_disconnect(receive, work()))
        request.set_result(waiting)
        with pytest.raises(asyncio.CancelledError):
            await answer(waiting)
    asyncio.run(main())


def test_an_error_of_the_works_clean_up_after_a_hang_up_is_not_reported_as_never_retrieved(both_paths: None) -> None:
    """The client hangs up and the work fails while cleaning up (or the server stops it and it fails then): the
    answer is None (or the server's cancellation), and that error is not left in a task nobody asked, which
    asyncio reports at collection as "Task exception was never retrieved" with its traceback in the log."""
    reports: list[str] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: reports.append(ctx["message"]))

        async def work(started: asyncio.Event) -> str:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise ValueError("clean-up failed") from None
            return "never"

        client, started = Client(), asyncio.Event()
        waiting = asyncio.ensure_future(until_disconnect(client.receive, work(started)))
        await started.wait()
        client.gone.set()
        assert await answer(waiting) is None
        started = asyncio.Event()
        waiting = asyncio.ensure_future(until_disconnect(Client().receive, work(started)))
        await started.wait()
        waiting.cancel()  # the server stopping
        done, _ = await asyncio.wait({waiting}, timeout=10)
        assert waiting in done and (waiting.cancelled() or isinstance(waiting.exception(), ValueError))
        del waiting
        gc.collect()  # a task's unretrieved error is reported when the task goes

    asyncio.run(main())
    gc.collect()
    assert reports == []


def test_thread_result_gives_the_threads_result_or_error() -> None:
    async def main() -> None:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            assert await thread_result(pool.submit(lambda: 41 + 1)) == 42
            with pytest.raises(KeyError):
                await thread_result(pool.submit(lambda: {}["x"]))
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result("now")
            assert await thread_result(done, 1.0) == "now"  # settled already: no waiting
    asyncio.run(main())


def test_thread_result_deadline_raises_timeout_and_cancels_the_threads_future() -> None:
    async def main() -> None:
        never: concurrent.futures.Future = concurrent.futures.Future()
        with pytest.raises(TimeoutError):
            await thread_result(never, 0.01)
        assert never.cancelled()  # as wait_for(wrap_future(...)) leaves it
    asyncio.run(main())


def test_a_cancelled_waiter_cancels_work_not_yet_started() -> None:
    async def main() -> None:
        gate, ran = threading.Event(), []
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(gate.wait)  # the thread is busy
            queued = pool.submit(lambda: ran.append(1))
            waiting = asyncio.ensure_future(thread_result(queued))
            await asyncio.sleep(0)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            gate.set()
        assert queued.cancelled() and ran == []
    asyncio.run(main())


def test_a_result_set_from_a_thread_wakes_the_waiter() -> None:
    async def main() -> None:
        future: concurrent.futures.Future = concurrent.futures.Future()
        waiting = asyncio.ensure_future(thread_result(future, 30.0))
        await asyncio.sleep(0)
        threading.Thread(target=future.set_result, args=("committed",)).start()
        assert await waiting == "committed"
    asyncio.run(main())


def test_a_hang_up_heard_as_the_work_finishes_does_not_cancel_the_caller_afterwards(both_paths: None) -> None:
    """The work's answer and the disconnect land in the same loop turn: the caller resumes first (its answer),
    and the watcher's callback, already queued, must not cancel the caller later (it would cancel whatever
    the request does next, e.g. sending the reply: a CancelledError out of the app, logged as a traceback)."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        hang_up, answer_ = loop.create_future(), loop.create_future()

        def both() -> None:  # the work's future first (the caller's wake-up queued), then the disconnect
            answer_.set_result("answer")
            hang_up.set_result({"type": "http.disconnect"})

        loop.call_soon(both)
        assert await until_disconnect(lambda: hang_up, answer_) == "answer"
        for _ in range(3):  # the watcher's queued callback runs here
            await asyncio.sleep(0)
        cancelling = getattr(asyncio.current_task(), "cancelling", lambda: 0)  # Python 3.11+
        assert not cancelling()
    asyncio.run(main())


def test_a_result_that_lands_with_the_deadline_is_kept() -> None:
    """The thread settles its future in the same loop turn as the deadline fires (the timer runs first): the
    result is there when the waiter resumes, so it is the answer (a commit that happened is not reported as
    a timeout: the turn would be saved and dropped as not_durable), as wait_for(wrap_future(...)) did."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        source: concurrent.futures.Future = concurrent.futures.Future()
        loop.call_soon(source.set_result, "committed")  # runs before the 0 s timer, its copy after it
        assert await thread_result(source, 0) == "committed"
    asyncio.run(main())
