"""``openclaw-rl dashboard``: the dashboard over a stopped (or another process's) run's files.

Stage: read-only. It reads the spool directory's turn journal and waiting turns, and the trainer's
``metrics.jsonl`` (by default the one beside the spool directory, where ``local`` and ``train`` put it),
and serves the same page and queries as ``/dashboard`` of a running proxy. With ``--api-key`` (or
``OPENCLAW_PROXY_API_KEYS``) each key sees only its own sessions, as on the proxy; without keys every
session is shown, so it binds to loopback by default.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from .data import Sources, waiting_from_spool
from .routes import dashboard_router


def standalone_app(spool_dir: str | Path, metrics_path: str | Path | None = None, *, keys: list[str] | None = None,
                   tokenizer: Any = None) -> Any:
    """A FastAPI app serving ``/dashboard`` over a run's files."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from openclaw_rl.errors import OpenClawError, error_body
    from openclaw_rl.server import Authenticator

    spool = Path(spool_dir)
    if metrics_path is None:
        guess = spool.parent / "metrics.jsonl"
        metrics_path = guess if guess.exists() else None
    sources = Sources(spool, Path(metrics_path) if metrics_path else None, tokenizer=tokenizer,
                      waiting=lambda ns: asyncio.to_thread(waiting_from_spool, spool))  # SQLite, off the loop
    auth = Authenticator(keys or [])
    app = FastAPI(title="openclaw-rl dashboard", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(OpenClawError)
    async def _known(request: Any, exc: OpenClawError) -> JSONResponse:
        return JSONResponse(error_body(exc), status_code=exc.status, headers=exc.headers)

    app.include_router(dashboard_router(sources, (lambda h: auth.identify(h)) if keys else (lambda h: None)))
    return app


def register_dashboard_command(sub: Any) -> None:
    p = sub.add_parser("dashboard", help="serve the dashboard over a run's spool directory and metrics.jsonl",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spool-dir", required=True, help="the run's spool directory (e.g. runs/local-rl/spool)")
    p.add_argument("--metrics", default=None, help="the trainer's metrics.jsonl (default: beside the spool dir)")
    p.add_argument("--tokenizer", default="", help="a tokenizer directory, to show the reply's tokens as text")
    p.add_argument("--api-key", action="append", default=None,
                   help="a key that may read (repeatable; default OPENCLAW_PROXY_API_KEYS; none: every session)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8400)
    p.set_defaults(fn=cmd_dashboard)


def cmd_dashboard(ns: argparse.Namespace) -> int:
    import uvicorn

    spool = Path(ns.spool_dir)
    if not spool.is_dir():
        raise FileNotFoundError(f"no spool directory at {spool}")
    keys = ns.api_key if ns.api_key is not None else [
        k for k in os.environ.get("OPENCLAW_PROXY_API_KEYS", "").split(",") if k]
    tokenizer = None
    if ns.tokenizer:
        from openclaw_rl.server import load_tokenizer

        tokenizer = load_tokenizer(ns.tokenizer, "--tokenizer")
    app = standalone_app(spool, ns.metrics, keys=keys, tokenizer=tokenizer)
    print(f"dashboard: http://{ns.host}:{ns.port}/dashboard ({'keys required' if keys else 'no keys: every session'})",
          flush=True)
    uvicorn.run(app, host=ns.host, port=ns.port, log_level="warning")
    return 0
