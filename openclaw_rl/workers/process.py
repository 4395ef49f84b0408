"""A worker process of ``serve --workers N`` (started by ``supervisor.py``, not by hand).

Stage: supervisor → **worker process**. Serves ``workers/app.py`` on the listening socket it inherited
(``--fd``), with the one-process proxy's listener guards (``listener.proxy_uvicorn_config``), and exits when
its owner's connection ends (the owner stopped or died: nothing this worker answers could be saved).
SIGTERM: uvicorn's graceful shutdown (the requests in flight finish, their turns committed by the owner).
"""

from __future__ import annotations

import argparse
import socket

from ..cli import setup_logging
from ..listener import proxy_uvicorn_config
from ..servers import KEEP_ALIVE_S, PromptStopServer
from .app import Worker
from .supervisor import load_settings_file


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="openclaw_rl.workers.process")
    ap.add_argument("--index", type=int, required=True)
    ap.add_argument("--fd", type=int, required=True, help="the inherited listening socket")
    ap.add_argument("--owner", required=True, help="the owner's Unix socket")
    ap.add_argument("--settings", required=True)
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--log-json", action="store_true")
    ns = ap.parse_args(argv)
    setup_logging(ns.log_level, ns.log_json)
    settings = load_settings_file(ns.settings)
    worker = Worker.build(settings, ns.owner, ns.index)
    p = settings.proxy
    config = proxy_uvicorn_config(worker.app, p, lambda why: worker.metrics.slow_clients.labels(why).inc(),
                                  KEEP_ALIVE_S)
    server = PromptStopServer(config)

    def owner_lost() -> None:
        server.should_exit = True
        server.wake()
    worker.owner.on_lost = owner_lost
    sock = socket.socket(fileno=ns.fd)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
