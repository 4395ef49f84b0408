"""The event loop's CPU per wait of a non-streamed turn, asyncio's general tools beside ``loopwait.py`` (issue #33 item 2).

Under uvloop, in one process: the render hop (``run_in_executor`` vs ``thread_result(pool.submit(...))``), the
commit wait (``wait_for(wrap_future(...))`` vs ``thread_result(..., timeout)``), the hang-up watch (a work task
and a watcher task under ``asyncio.wait`` vs ``until_disconnect``) and the body's deadline (``wait_for`` of a
coroutine vs ``asyncio.timeout``). Prints the loop thread's CPU (``time.thread_time``) per use, best of three
rounds. A benchmark: nothing is asserted. Usage: ``python scripts/bench_loopwait.py [--n 4000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openclaw_rl.loopwait import thread_result, until_disconnect  # noqa: E402


async def main(n: int) -> None:
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    never = asyncio.Event()

    async def bench(name: str, make: Callable[[], Awaitable[Any]]) -> None:
        for _ in range(300):
            await make()
        best = float("inf")
        for _ in range(3):
            start = time.thread_time()
            for _ in range(n):
                await make()
            best = min(best, (time.thread_time() - start) / n)
        print(f"{name:48s} {best * 1e6:7.1f} µs")

    def one() -> int:
        return 1

    async def step() -> int:
        await asyncio.sleep(0)
        return 1

    async def body() -> int:
        return 1

    async def receive() -> dict[str, Any]:
        await never.wait()
        return {"type": "http.disconnect"}

    async def commit_old() -> Any:
        return await asyncio.wait_for(asyncio.wrap_future(pool.submit(one)), 30)

    async def watch_old() -> Any:
        task, watcher = asyncio.ensure_future(step()), asyncio.ensure_future(receive())
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
            return await task
        finally:
            watcher.cancel()

    async def deadline_old() -> Any:
        return await asyncio.wait_for(body(), 60)

    async def deadline_new() -> Any:
        async with asyncio.timeout(60):  # type: ignore[attr-defined]  # Python 3.11+
            return await body()

    await bench("render hop: run_in_executor", lambda: loop.run_in_executor(pool, one))
    await bench("render hop: thread_result(submit)", lambda: thread_result(pool.submit(one)))
    await bench("commit wait: wait_for(wrap_future), + submit", commit_old)
    await bench("commit wait: thread_result(timeout), + submit", lambda: thread_result(pool.submit(one), 30))
    await bench("hang-up watch: 2 tasks + asyncio.wait", watch_old)
    await bench("hang-up watch: until_disconnect", lambda: until_disconnect(receive, step()))
    await bench("body deadline: wait_for(coroutine)", deadline_old)
    if hasattr(asyncio, "timeout"):
        await bench("body deadline: asyncio.timeout", deadline_new)
    pool.shutdown()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4000)
    ns = p.parse_args()
    try:
        import uvloop
    except ImportError:  # the plain asyncio loop: the same comparison, other absolute figures
        asyncio.run(main(ns.n))
    else:
        uvloop.run(main(ns.n))
