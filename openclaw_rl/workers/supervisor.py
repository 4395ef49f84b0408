"""``openclaw-rl serve --workers N``: the owner process binds the port, starts N worker processes on it,
restarts any that dies, and stops them before itself.

Stage: **supervisor** → owner + workers. The owner binds and listens on the proxy's port once, then hands
that one listening socket to every worker (inherited, ``pass_fds``): the workers accept from one shared
queue. Not ``SO_REUSEPORT``: that gives each worker its own queue, and the connections waiting in a dying
worker's queue are reset; here they stay queued for the others, and a port in use is one error at start.
The owner itself accepts nothing. Workers talk to the owner over a Unix socket in a private (0700)
directory (``wire.py``).

A worker that exits while the owner runs is started again (after 0.5 s, doubling to 30 s while workers
keep dying within 10 s of their start); its requests in flight were cut, its turns still generating are
dropped as ``client_disconnected`` (``owner.py``). SIGTERM/SIGINT to the owner stop it in order: the
workers first (each finishes its requests in flight within the graceful window, the owner still
committing their turns), then the owner's judgements in flight, writer and spool (``Proxy.shutdown``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import time
from typing import Any

from ..config import Settings
from ..server import Proxy
from .owner import OwnerHub

log = logging.getLogger(__name__)

RESTART_FIRST_S, RESTART_MAX_S, STABLE_S = 0.5, 30.0, 10.0
STOP_GRACE_S = 35.0  # a worker's graceful shutdown is 30 s (uvicorn's window); then it is killed


def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class Supervisor:
    """Starts and restarts the worker processes (``python -m openclaw_rl.workers.process``)."""

    def __init__(self, hub: OwnerHub, listener: socket.socket, rundir: str, settings_path: str, log_level: str,
                 log_json: bool = False):
        self.hub, self.listener, self.rundir = hub, listener, rundir
        self.settings_path, self.log_level, self.log_json = settings_path, log_level, log_json
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.stopping = False
        self._tasks: list[asyncio.Task] = []

    def start(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._keep(i)) for i in range(n)]

    async def _spawn(self, index: int) -> asyncio.subprocess.Process:
        fd = self.listener.fileno()
        args = [sys.executable, "-m", "openclaw_rl.workers.process", "--index", str(index), "--fd", str(fd),
                "--owner", os.path.join(self.rundir, "owner.sock"), "--settings", self.settings_path,
                "--log-level", self.log_level, *(["--log-json"] if self.log_json else [])]
        # its own session: a terminal's Ctrl-C reaches the owner only, which stops the workers in order
        return await asyncio.create_subprocess_exec(*args, pass_fds=(fd,), start_new_session=True)

    async def _keep(self, index: int) -> None:
        delay = RESTART_FIRST_S
        while not self.stopping:
            started = time.monotonic()
            proc = self.procs[index] = await self._spawn(index)
            code = await proc.wait()
            if self.stopping:
                return
            delay = RESTART_FIRST_S if time.monotonic() - started > STABLE_S else min(delay * 2, RESTART_MAX_S)
            self.hub.restarts += 1
            log.error("worker %d (pid %d) exited with %s; starting another in %.1fs", index, proc.pid, code, delay)
            await asyncio.sleep(delay)

    async def stop(self) -> None:
        """SIGTERM every worker, wait for them (then SIGKILL what is left)."""
        self.stopping = True
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        waits = [proc.wait() for proc in self.procs.values()]
        if waits:
            _, pending = await asyncio.wait([asyncio.ensure_future(w) for w in waits], timeout=STOP_GRACE_S)
            for proc in self.procs.values():
                if proc.returncode is None:
                    proc.kill()
            if pending:
                await asyncio.wait(pending)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def run_owner(settings: Settings, workers: int, proxy: Proxy, log_level: str, log_json: bool = False) -> None:
    p = settings.proxy
    listener = listen(p.host, p.port)
    rundir = tempfile.mkdtemp(prefix="openclaw-workers-")  # 0700: the owner's socket is for its workers only
    settings_path = os.path.join(rundir, "settings.pickle")
    with open(settings_path, "wb") as f:
        pickle.dump(settings, f)
    hub = OwnerHub(proxy, workers)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await proxy.start()
        await hub.start(os.path.join(rundir, "owner.sock"))
        supervisor = Supervisor(hub, listener, rundir, settings_path, log_level, log_json)
        supervisor.start(workers)
        log.info("owner pid %d: %d workers on http://%s:%d/v1", os.getpid(), workers, p.host, p.port)
        await stop.wait()
        log.info("stopping: the workers first, then the owner's judgements, writer and spool")
        await supervisor.stop()
    finally:
        listener.close()
        await hub.close()
        await proxy.shutdown()
        shutil.rmtree(rundir, ignore_errors=True)


def serve_workers(settings: Settings, workers: int, log_level: str, log_json: bool = False) -> int:
    proxy = Proxy.build(settings)  # locks the spool: one owner per spool, as one proxy per spool
    asyncio.run(run_owner(settings, workers, proxy, log_level, log_json))
    return 0


def load_settings_file(path: str) -> Any:
    with open(path, "rb") as f:
        return pickle.load(f)  # written by this worker's own owner, in its private directory
