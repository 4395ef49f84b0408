"""One HTTP worker of ``serve --workers N``: parse, render and tokenise, call the policy, check and stream
the reply; the turn goes to the owner process, which saves it.

Stage: client → **worker** (routes → serving) → owner. A worker is the one-process proxy's HTTP half:
the same routes (``routes.py``), the same ``ChatService`` with its own renderer and prefix cache (a
session whose turns land on several workers costs a tokenisation per miss, never an id of difference),
its own policy client and metrics. Its tracker is a ``RemoteTracker``: the owner numbers, pairs, judges
and saves every turn, and a reply's last byte waits for the owner's ``Committed``. ``/healthz`` and
``/metrics`` are the owner's answers (all workers together); ``/v1/feedback`` is applied by the owner.
The dashboard reads the run's files (read-only, as one process's does) and asks the owner, per query, for
its tracker's waiting turns (a ``waiting`` call): the same rows and states as the one-process dashboard,
turns still generating included. An owner that does not answer within ``WAITING_TIMEOUT_S`` (or is gone)
never holds the page: the spool's saved waiting turns are shown instead, labelled ``SPOOL_FALLBACK``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

from ..chat import ChatRenderer
from ..config import Settings
from ..dashboard.data import Sources, waiting_from_spool
from ..dashboard.routes import dashboard_router
from ..errors import OpenClawError
from ..gate import SubmissionGate
from ..identity import check_resolver_names
from ..metrics import ProxyMetrics
from ..parsers import OutputParser
from ..protocol import models_response
from ..routes import chat_endpoint, install_error_handlers, read_feedback, spool_refusal
from ..server import (
    Authenticator,
    DirectRoute,
    HeaderLimitMiddleware,
    ObserveMiddleware,
    backend_http,
    load_tokenizer,
    policy_backend,
    rare_young_collections,
)
from ..serving import ChatService
from ..users.identity import UserResolver
from . import wire
from .remote import OwnerClient, RemoteTracker

log = logging.getLogger(__name__)

WAITING_TIMEOUT_S = 2.0  # a dashboard query waits this long for the owner's waiting turns, then shows the spool's
SPOOL_FALLBACK = "owner did not answer; saved in the spool"
"""The state shown for the spool's waiting turns when the owner's live list is unavailable: their live state
(waiting for a next state, being judged) is unknown, and turns not yet saved are missing."""


@dataclass
class Worker:
    settings: Settings
    index: int
    http: httpx.AsyncClient
    renderer: ChatRenderer
    metrics: ProxyMetrics
    service: ChatService
    owner: OwnerClient
    auth: Authenticator
    users: UserResolver
    app: Any = None
    waiting_timeout_s: float = WAITING_TIMEOUT_S

    @classmethod
    def build(cls, settings: Settings, owner_path: str, index: int, *, tokenizer: Any = None) -> Worker:
        p = settings.proxy
        check_resolver_names(p.identity)
        tokenizer = tokenizer or load_tokenizer(p.tokenizer)
        http = backend_http(p)
        renderer = ChatRenderer(tokenizer, p.enable_thinking)
        metrics = ProxyMetrics()
        holder: list[ChatService] = []

        def on_status(status: wire.Status) -> None:
            if holder and not p.context_length and status.context_length:
                holder[0].context_length = status.context_length
            if holder:
                holder[0].keep_messages = status.keep_messages or bool(p.record_dir)

        owner = OwnerClient(owner_path, index, metrics, on_status, renderer.forget)
        service = ChatService(p, renderer, OutputParser.named(p.reasoning_parser, p.tool_parser, renderer.format),
                              policy_backend(http, p, renderer, metrics), RemoteTracker(owner),  # type: ignore[arg-type]
                              SubmissionGate(is_open=True), metrics, keep_messages=False)
        holder.append(service)
        worker = cls(settings, index, http, renderer, metrics, service, owner,
                     Authenticator(p.api_keys, p.rate_limit_per_min), UserResolver(p.trusted_user_keys, p.user_header))
        worker.app = make_worker_app(worker, Sources(Path(settings.spool.dir), tokenizer=tokenizer,
                                                     waiting=worker.waiting, waiting_turn=worker.waiting_turn))
        return worker

    async def waiting(self, ns: str | None = None) -> list[dict[str, Any]]:
        """The owner tracker's waiting turns that namespace ``ns`` may see (its ``waiting`` call: only those
        cross the socket, as previews: the reply trimmed as the page shows it, no next state), or the spool's
        with ``SPOOL_FALLBACK``."""
        return await self._waiting(ns)

    async def waiting_turn(self, ns: str | None, session: str, turn: int) -> list[dict[str, Any]]:
        """One waiting turn's rows in full, for the turn page (or the spool's, as ``waiting``)."""
        return await self._waiting(ns, session=session, turn=turn)

    async def _waiting(self, ns: str | None, **which: Any) -> list[dict[str, Any]]:
        try:
            return await self.owner.call("waiting", timeout_s=self.waiting_timeout_s, ns=ns, **which)
        except OpenClawError as e:
            log.warning("worker %d: the dashboard shows the spool's waiting turns: %s", self.index, e.message)
        rows = await asyncio.to_thread(waiting_from_spool, Path(self.settings.spool.dir))
        return [{**row, "state": SPOOL_FALLBACK} for row in rows]

    def refusal(self) -> Any:
        state = self.owner.state
        return self.owner.refusal() or (spool_refusal(state.overloaded, state.overflow, state.problem, self.metrics)
                                        if state is not None else None)

    async def shutdown(self) -> None:
        await self.owner.close()
        self.service.close()
        await self.service.backend.aclose()
        await self.http.aclose()


def make_worker_app(worker: Worker, dashboard: Sources) -> Any:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await worker.owner.connect()
        gc.collect()
        gc.freeze()
        rare_young_collections()
        yield
        await worker.shutdown()

    app = FastAPI(title="openclaw-rl proxy worker", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None, redirect_slashes=False)
    p, metrics = worker.settings.proxy, worker.metrics
    install_error_handlers(app)
    chat_completions = app.post("/v1/chat/completions")(chat_endpoint(
        p, worker.service, worker.users, worker.auth, metrics, worker.refusal))

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> dict[str, Any]:
        namespace = worker.users.user(worker.auth.namespace(request.headers.get("authorization")), request.headers)
        fb = await read_feedback(request, p)
        turn, how = await worker.owner.call("feedback", key=f"{namespace}\x1f{fb.session_id}", rating=fb.rating,
                                            text=fb.text)
        return {"session_id": fb.session_id, "turn": turn, "applied_as": how}

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        worker.auth.namespace(request.headers.get("authorization"))
        return models_response(p.served_model_name)

    @app.get("/healthz")
    @app.get("/health")
    async def health() -> dict[str, Any]:
        """The owner's health (all workers), and which worker answered."""
        if worker.owner.gone:
            return {"ok": False, "error": "this worker lost its owner process", "worker": worker.index}
        return {**await worker.owner.call("health", timeout_s=5.0), "worker": worker.index}

    @app.get("/metrics")
    async def prometheus() -> Response:
        text = await worker.owner.call("metrics", timeout_s=10.0)
        return Response(text.encode(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/users")
    async def list_users(request: Request) -> dict[str, Any]:
        """The owner's answer: it holds the sessions, the spool and the admin keys (users/deletion.py)."""
        return await worker.owner.call("users", authorization=request.headers.get("authorization"))

    @app.delete("/v1/users/{user:path}")
    async def delete_user(user: str, request: Request) -> dict[str, Any]:
        return await worker.owner.call("delete_user", timeout_s=600.0, user=user,
                                       authorization=request.headers.get("authorization"))

    app.include_router(dashboard_router(dashboard, worker.auth.identify))
    app.add_middleware(HeaderLimitMiddleware, limit=p.max_header_bytes)
    app.add_middleware(ObserveMiddleware, metrics=metrics)
    return DirectRoute(app, "/v1/chat/completions", chat_completions)
