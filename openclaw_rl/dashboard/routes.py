"""The dashboard's HTTP routes: a static page and read-only JSON queries behind the API keys.

Stage: read-only, beside the proxy (``serve``, ``train``, ``local``) or alone over a stopped run's files
(``openclaw-rl dashboard``). The page itself (``/dashboard``) and its script and style carry no data and
need no key: a browser cannot send a bearer header when it navigates. Every ``/dashboard/api/…`` query
takes the same ``Authorization: Bearer`` key as the chat API and answers only that key's sessions. The
assets ship inside the package; the page loads nothing from anywhere else (its Content-Security-Policy
says so). Queries that read files run on a worker thread, so a large journal never stalls the proxy's
event loop; the live waiting turns are read on the loop first (the tracker belongs to it), or awaited
where they are another process's answer (a ``serve --workers`` worker asks its owner).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Callable
from importlib import resources
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from . import data

ASSETS = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8",
          "index.html": "text/html; charset=utf-8"}
CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'"

Identify = Callable[[str | None], "str | None"]
"""The caller's namespace from its Authorization header (raises ``Unauthorized``); None: every namespace."""


def asset(name: str) -> bytes:
    return resources.files("openclaw_rl.dashboard").joinpath("static", name).read_bytes()


def dashboard_router(sources: data.Sources, identify: Identify) -> APIRouter:
    router = APIRouter()
    headers = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
               "Referrer-Policy": "no-referrer"}

    @router.get("/dashboard")
    async def page() -> Response:
        return Response(asset("index.html"), media_type=ASSETS["index.html"], headers=headers)

    @router.get("/dashboard/static/{name}")
    async def static(name: str) -> Response:
        if name not in ASSETS:
            return JSONResponse({"error": {"message": f"no dashboard asset {name!r}", "type": "invalid_request_error",
                                           "param": None, "code": 404}}, status_code=404)
        return Response(asset(name), media_type=ASSETS[name], headers=headers)

    async def query(request: Request, fn: Callable[..., Any], *args: Any, turn: tuple[str, int] | None = None
                    ) -> Response:
        ns = identify(request.headers.get("authorization"))
        # on the loop: the live tracker belongs to it; the turn page asks for its turn in full where it can
        waiting = (sources.waiting_turn(ns, *turn) if turn is not None and sources.waiting_turn is not None
                   else sources.waiting(ns))
        if inspect.isawaitable(waiting):  # a worker's: the owner's answer
            waiting = await waiting
        snapshot = dataclasses.replace(sources, waiting=lambda _ns: waiting)
        snapshot._cache = sources._cache  # noqa: SLF001 - the parsed files are shared between requests
        result = await asyncio.to_thread(fn, snapshot, ns, *args)
        if result is None:
            return JSONResponse({"error": {"message": "no such turn for this key", "type": "invalid_request_error",
                                           "param": None, "code": 404}}, status_code=404, headers=headers)
        return JSONResponse(result, headers=headers)

    @router.get("/dashboard/api/overview")
    async def overview(request: Request) -> Response:
        return await query(request, lambda src, ns: {"sessions": data.sessions(src, ns), "training": data.training(src),
                                                     "drops": data.drops(src, ns)})

    @router.get("/dashboard/api/session")
    async def session(request: Request, id: str) -> Response:
        return await query(request, lambda src, ns: {"session": id, "turns": data.session_turns(src, ns, id)})

    @router.get("/dashboard/api/turn")
    async def turn(request: Request, session: str, turn: int, epoch: str | None = None) -> Response:
        return await query(request, data.turn_detail, session, turn, epoch, turn=(session, turn))

    return router
