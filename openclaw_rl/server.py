"""The proxy's HTTP layer: assemble the pipeline once (``Proxy``) and expose it with thin routes.

Stage: client → **routes** → serving. ``Proxy.build(settings)`` wires tokenizer, backend client, judge,
mode scorer, session tracker, spool writer and gate; ``proxy.app`` is the ASGI app: the FastAPI app, with
``POST /v1/chat/completions`` served in front of FastAPI's routing layers (``DirectRoute``). No module
globals: two proxies can run in one process (tests do). The request-side code (reading and checking
bodies, the chat endpoint, the error handlers) is ``routes.py``, shared with the ``--workers`` HTTP
workers, whose owner process is a ``Proxy`` that serves no HTTP (``workers/``).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import hmac
import json
import logging
import os
import ssl
import time
from collections import defaultdict, deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

from .backend import PolicyBackend
from .chat import ChatRenderer
from .config import ProxySettings, Settings
from .dashboard.data import Sources, waiting_from_tracker
from .dashboard.journal import TurnJournal
from .dashboard.routes import dashboard_router
from .engines import EnginePool, split_urls
from .errors import OpenClawError, RateLimited, Unauthorized
from .gate import SubmissionGate
from .identity import check_resolver_names
from .judge import JudgeClient
from .metrics import ProxyMetrics
from .modes import MODES
from .parsers import OutputParser
from .probes import BackendProbes
from .protocol import models_response
from .routes import chat_endpoint, install_error_handlers, read_feedback, spool_refusal
from .scoring import make_scorer
from .serving import ChatService
from .sessions import SessionTracker
from .spool import Spool
from .turns import Turn
from .users.deletion import UserAdmin, users_router
from .users.identity import UserResolver
from .writer import SampleWriter

log = logging.getLogger(__name__)


# tokenizer_config.json names these for a plain `tokenizers` tokenizer with no model-specific class
# (transformers 5 writes TokenizersBackend; files meant for 4.x too say PreTrainedTokenizerFast).
GENERIC_TOKENIZER_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})


def _named_tokenizer_class(path: str) -> str | None:
    try:
        with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
            return json.load(f).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None


def load_tokenizer(path: str, key: str = "openclaw_proxy_tokenizer") -> Any:
    if not path:
        raise ValueError("the proxy needs the policy tokenizer (--tokenizer / openclaw_proxy_tokenizer / "
                         "Slime's --hf-checkpoint) to render prompts exactly as the policy sees them")
    if not os.path.isdir(path):
        raise ValueError(f"{key}: tokenizer directory {path!r} does not exist (expected a local HF model or "
                         "tokenizer dir holding tokenizer_config.json)")
    try:
        if _named_tokenizer_class(path) in GENERIC_TOKENIZER_CLASSES:
            # The class AutoTokenizer would pick too; AutoTokenizer first imports transformers' model-config
            # stack, which imports torch (~4 CPU-s per proxy process). The proxy needs no torch.
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(path)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - any loader failure is a configuration error here
        raise ValueError(f"{key}: cannot load a tokenizer from {path!r}: {type(e).__name__}: {e}") from None


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default certificate verification (its CA bundle, environment ignored as ``trust_env=False``
    asks), built once per process: building it loads the CA bundle, ~40 ms of CPU per client otherwise, and
    the test suite builds a proxy per test. Shared by clients that all speak HTTP/1.1 (httpcore sets the
    context's ALPN protocols on each TLS connect, the same list for all of them)."""
    return httpx.create_ssl_context(trust_env=False)


class Authenticator:
    """Bearer keys compared in constant time and exactly as configured (nothing stripped: an empty or
    whitespace key is refused at start-up, so no header can match "nothing"); each key is its own
    session namespace."""

    def __init__(self, keys: list[str], rate_limit_per_min: int = 0):
        if any(not k or k != k.strip() for k in keys):
            raise ValueError("empty or whitespace-padded API keys are refused")
        self.keys = [(k.encode(), hashlib.sha256(k.encode()).hexdigest()[:12]) for k in keys]
        self.rate_limit = rate_limit_per_min
        self._hits: dict[str, deque[float]] = defaultdict(deque)

    def namespace(self, authorization: str | None) -> str:
        found = self.identify(authorization)
        if self.rate_limit and self.keys:
            hits, now = self._hits[found], time.monotonic()
            while hits and now - hits[0] > 60:
                hits.popleft()
            if len(hits) >= self.rate_limit:
                raise RateLimited(f"rate limit of {self.rate_limit} requests/minute reached",
                                  headers={"Retry-After": "5"})
            hits.append(now)
        return found

    def identify(self, authorization: str | None) -> str:
        """The key's namespace without counting a request against its rate limit (the dashboard's reads)."""
        if not self.keys:
            return "default"
        scheme, _, credentials = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not credentials:  # the scheme is case-insensitive (RFC 9110 11.1)
            raise Unauthorized("missing bearer token")
        token = credentials.encode("latin-1", "replace")  # the header's own bytes
        found = None
        for key, ns in self.keys:  # check every key: timing does not reveal which one matched
            if hmac.compare_digest(token, key):
                found = ns
        if found is None:
            raise Unauthorized("invalid api key")
        return found


def backend_http(p: ProxySettings) -> httpx.AsyncClient:
    """The client of the policy and judge servers. Pooled connections expire before the backend's keep-alive
    timeout (uvicorn and SGLang: 5 s), so a request never races the server closing its idle connection (seen
    as sporadic 502s under load)."""
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256, keepalive_expiry=2.0)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(p.request_timeout_s, connect=p.connect_timeout_s),
                             trust_env=False, verify=tls_context())


def policy_backend(http: httpx.AsyncClient, p: ProxySettings, renderer: ChatRenderer, metrics: ProxyMetrics) -> Any:
    """The policy's engine, or a pool of them (``engines.py``) when several URLs are configured."""
    engines = [PolicyBackend(http, url, timeout_s=p.request_timeout_s, api_key=p.policy_api_key,
                             connect_timeout_s=p.connect_timeout_s, stream_interval=p.stream_interval,
                             end_ids=renderer.end_of_reply_ids, max_response_bytes=p.max_response_bytes,
                             decode=lambda ids, skip: renderer.decoder(skip)(ids))
               for url in split_urls(p.policy_url)]
    return engines[0] if len(engines) == 1 else EnginePool(
        engines, on_failover=lambda url, reason: metrics.policy_failovers.labels(url, reason).inc())


YOUNG_GC_THRESHOLD = 10_000
"""Allocations (net, of objects the cycle collector tracks) between two young-generation collections once
the proxy runs: Python's default, 700, collects ~0.2 times per turn, and each of those collections walks the
young requests' containers (token id lists of 1K-8K entries among them): 52 young and 4 middle collections,
34 ms of CPU, over the 268 turns of a ``bench_turn_cpu.py --sessions 64 --reps 1`` run (~0.13 ms per turn,
timed with ``gc.callbacks``; issue #33 item 2). Nearly all of a turn's objects are freed by reference
counting: at 10,000 the same run had no collection at all. Cyclic garbage waits longer (at most ~10,000
objects)."""


def rare_young_collections() -> None:
    """Before serving, after the start-up objects are frozen: young collections made rare
    (``YOUNG_GC_THRESHOLD``; a higher threshold, or 0 for collection switched off, is left as it is)."""
    young, *older = gc.get_threshold()
    if young:  # 0: collection was switched off (gc.disable is separate); leave it so
        gc.set_threshold(max(young, YOUNG_GC_THRESHOLD), *older)


@dataclass
class Proxy:
    settings: Settings
    http: httpx.AsyncClient
    renderer: ChatRenderer
    judge: JudgeClient
    spool: Spool
    writer: SampleWriter
    tracker: SessionTracker
    gate: SubmissionGate
    metrics: ProxyMetrics
    service: ChatService
    auth: Authenticator
    probes: BackendProbes
    app: Any = None  # the ASGI app: FastAPI behind DirectRoute (make_app)
    journal: TurnJournal | None = None  # every turn's outcome and the step that trained it (the dashboard's)
    dashboard: Sources | None = None  # what /dashboard reads (a trainer adds its metrics.jsonl)
    users: UserResolver = field(default_factory=UserResolver)  # the user of a request (users/identity.py)
    user_admin: UserAdmin = field(default_factory=UserAdmin)  # deleting a user while running (users/deletion.py)

    @classmethod
    def build(cls, settings: Settings, *, tokenizer: Any = None, judge_tokenizer: Any = None,
              gate_open: bool = True) -> Proxy:
        p, j = settings.proxy, settings.judge
        check_resolver_names(p.identity)
        tokenizer = tokenizer or load_tokenizer(p.tokenizer)
        if judge_tokenizer is None:
            judge_tokenizer = load_tokenizer(j.tokenizer, "openclaw_judge_tokenizer") if j.tokenizer and j.tokenizer != p.tokenizer else tokenizer
        http = backend_http(p)
        renderer = ChatRenderer(tokenizer, p.enable_thinking)
        metrics = ProxyMetrics()
        teacher_slots = settings.opd.teacher_concurrency if MODES[settings.mode].needs_teacher else 0
        votes = metrics.judge_votes.children  # (outcome,) → its counter, bound once (metrics.py)

        def count_retry(event: str, call: str, reason: str) -> None:
            (metrics.judge_retries if event == "retry" else metrics.judge_gave_up).labels(call, reason).inc()

        judge = JudgeClient(http, j, tokenizer=judge_tokenizer, vocab_size=len(judge_tokenizer),
                            on_vote=lambda outcome: votes[(outcome,)].inc(),
                            teacher_concurrency=teacher_slots, raw_http=True, on_retry=count_retry)
        if not judge.enabled:
            log.warning("no judge URL: PRM is off, every turn scores 0 and RL/OPD produce no learning signal "
                        "(upstream's PRM-disabled behaviour). Set --judge-url to train.")
        teacher = None
        if MODES[settings.mode].needs_teacher and settings.opd.teacher_url:  # a teacher apart from the judge
            from openclaw_opd.teacher_server import build_teacher

            teacher = build_teacher(http, settings, tokenizer, load=load_tokenizer, on_retry=count_retry)
        scorer = make_scorer(settings, judge, renderer, teacher)
        spool = Spool(settings.spool.dir, settings.spool.max_bytes, sync=settings.spool.sync)
        spool.lock_for_writing()  # one proxy per spool: a second one gets SpoolLocked (one line, exit 1)
        spool.release_leases()
        writer = SampleWriter(spool, metrics, p.record_dir, max_overflow=settings.spool.max_overflow)
        journal = TurnJournal(spool.dir)
        tracker = SessionTracker(scorer, journal.tee(writer), metrics, ttl_s=p.session_ttl_s, max_sessions=p.max_sessions,
                                 persist=writer.save_turn, persist_next_state=writer.save_next_state,
                                 on_end=renderer.forget)
        gate = SubmissionGate(is_open=gate_open, mode=p.pause_mode, hold_s=p.pause_hold_s)
        metrics.submission_open.set(1 if gate_open else 0)
        service = ChatService(p, renderer, OutputParser.named(p.reasoning_parser, p.tool_parser, renderer.format),
                              policy_backend(http, p, renderer, metrics), tracker, gate, metrics,
                              keep_messages=scorer.keeps_messages)
        auth = Authenticator(p.api_keys, p.rate_limit_per_min)
        probes = BackendProbes(http, settings, service, judge, metrics)
        proxy = cls(settings, http, renderer, judge, spool, writer, tracker, gate, metrics, service, auth, probes,
                    journal=journal, users=UserResolver(p.trusted_user_keys, p.user_header),
                    user_admin=UserAdmin(list(p.admin_keys)))
        proxy.dashboard = Sources(spool.dir, tokenizer=tokenizer, waiting=lambda ns: waiting_from_tracker(tracker, ns))
        proxy.app = make_app(proxy)
        return proxy

    async def start(self) -> None:
        """Before the first request (the app's lifespan, or a ``--workers`` owner): waiting turns restored
        from the spool, the idle sweeper and the backend probes started, start-up objects frozen."""
        self.tracker.restore([Turn.from_record(json.loads(p)) for p in self.spool.pending_turns()])
        self.tracker.start_sweeper()
        await self.probes.refresh()  # learn the context lengths before the first request
        self.probes.start()
        # torch/transformers leave ~250K long-lived objects; without freezing them every full collection
        # walks them all and stalls the event loop for 100-300 ms (measured by the benchmark).
        gc.collect()
        gc.freeze()
        rare_young_collections()

    def refusal(self) -> OpenClawError | None:
        """Why a chat request is refused before the policy spends a generation it cannot save (counted)."""
        return spool_refusal(self.writer.overloaded, len(self.writer.overflow), self.writer.problem, self.metrics)

    def health(self) -> dict[str, Any]:
        """``/healthz``. Cheap: backend reachability comes from the background probe's cache, the spool's
        state from the writer (``spool.error``: writes fail, or the file was deleted or replaced). ``ok``
        is false while the policy is unreachable or the spool cannot take turns (the HTTP status stays 200:
        the proxy itself is alive)."""
        backends = self.probes.state
        policy_ok = backends.get("policy", {}).get("reachable", True)
        spool = self.writer.health()
        return {"ok": policy_ok and spool["ok"], "submission_open": self.gate.is_open,
                "sessions": len(self.tracker.sessions), "pending_turns": self.tracker.pending_turns,
                "backends": backends, "spool": spool, "spool_overflow": len(self.writer.overflow)}

    def refresh_gauges(self) -> None:
        """The gauges ``/metrics`` reads from live state, set just before rendering."""
        busy = sum(1 for sess in self.tracker.sessions.values() if sess.busy)
        self.metrics.sessions.labels("active").set(busy)
        self.metrics.sessions.labels("idle").set(len(self.tracker.sessions) - busy)
        self.metrics.spool_depth.set(self.spool.ready_count())
        self.metrics.submission_open.set(1 if self.gate.is_open else 0)

    async def shutdown(self) -> None:
        """Graceful stop (SIGTERM/SIGINT): judgements in flight finish, waiting turns stay persisted for
        the next start (exactly as after a crash), everything enqueued is committed and the record files
        are closed (closing again, as the rollout bridge does, is a no-op)."""
        await self.probes.stop()
        self.judge.retrier.stop()  # judge calls waiting to retry end now; their turns stay in the spool
        await self.tracker.drain()
        self.writer.close()
        if self.journal is not None:
            self.journal.close()
        self.service.close()
        await self.service.backend.aclose()
        self.judge.close()
        await self.http.aclose()


def make_app(proxy: Proxy) -> Any:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await proxy.start()
        yield
        await proxy.shutdown()

    # No /docs, /redoc or /openapi.json: they would be served without the API key, and a path with a
    # trailing slash gets the JSON 404 of any unknown path, not a redirect.
    app = FastAPI(title="openclaw-rl proxy", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)
    metrics = proxy.metrics

    install_error_handlers(app)
    chat_completions = app.post("/v1/chat/completions")(chat_endpoint(
        proxy.settings.proxy, proxy.service, proxy.users, proxy.auth, metrics, proxy.refusal))

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> dict[str, Any]:
        namespace = proxy.users.user(proxy.auth.namespace(request.headers.get("authorization")), request.headers)
        fb = await read_feedback(request, proxy.settings.proxy)
        turn, how = proxy.tracker.feedback(f"{namespace}\x1f{fb.session_id}", fb.rating, fb.text)
        return {"session_id": fb.session_id, "turn": turn, "applied_as": how}

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        proxy.auth.namespace(request.headers.get("authorization"))
        return models_response(proxy.settings.proxy.served_model_name)

    @app.get("/healthz")
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return proxy.health()

    @app.get("/metrics")
    async def prometheus() -> Response:
        proxy.refresh_gauges()
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    if proxy.dashboard is not None:
        app.include_router(dashboard_router(proxy.dashboard, proxy.auth.identify))
    app.include_router(users_router(proxy))
    app.add_middleware(HeaderLimitMiddleware, limit=proxy.settings.proxy.max_header_bytes)
    app.add_middleware(ObserveMiddleware, metrics=metrics)
    return DirectRoute(app, "/v1/chat/completions", chat_completions)


class DirectRoute:
    """One POST route served in front of FastAPI: the same endpoint, inside the app's own middlewares
    (``app.user_middleware``, stacked as Starlette stacks them), its exceptions answered by the app's own
    handlers (``app.exception_handlers``, looked up along the exception's MRO as Starlette does); every
    other request and the lifespan go to ``app``. Adding a middleware or a handler to the app covers this
    route too: there is no second list to keep in step.

    Why: FastAPI's other layers around a route (server-error, telemetry and body-limit middleware, the
    exception middleware, the exit stack, matching every route, solving dependencies) cost ~0.12 ms of the
    proxy's CPU per request here, and the chat route uses none of them: it reads and checks its own body,
    raises ``OpenClawError`` or ``HTTPException`` and returns a ``Response``. An exception no handler
    covers more closely gets the app's ``Exception`` handler (logged there), as FastAPI's server-error
    middleware would give it, and is not re-raised to the server."""

    def __init__(self, app: FastAPI, path: str, endpoint: Any):
        self.app, self.path, self.endpoint = app, path, endpoint
        direct: Any = self._serve
        for cls, args, kwargs in reversed(app.user_middleware):  # the first added ends up innermost
            direct = cls(direct, *args, **kwargs)
        self.direct = direct

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == self.path and scope["method"] == "POST":
            await self.direct(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _serve(self, scope: dict, receive: Any, send: Any) -> None:
        request = Request(scope, receive, send)
        try:
            response = await self.endpoint(request)
        except Exception as exc:
            handlers = self.app.exception_handlers
            handler = next(handlers[kind] for kind in type(exc).__mro__ if kind in handlers)
            response = await handler(request, exc)
        await response(scope, receive, send)


class HeaderLimitMiddleware:
    """431 for request heads over the limit (h11 only bounds heads that arrive in pieces)."""

    def __init__(self, app: Any, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and sum(len(k) + len(v) for k, v in scope["headers"]) > self.limit:
            body = json.dumps({"error": {"message": f"request headers exceed {self.limit} bytes",
                                         "type": "invalid_request_error", "param": None, "code": 431}}).encode()
            await send({"type": "http.response.start", "status": 431,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


class ObserveMiddleware:
    """Requests and latency by route and status: a plain ASGI middleware (Starlette's
    ``BaseHTTPMiddleware`` costs ~1 ms per request, measured)."""

    def __init__(self, app: Any, metrics: ProxyMetrics):
        self.app, self.metrics = app, metrics
        # (route, code) and (route,) → their series, bound once (metrics.py: a dict hit, not labels())
        self.requests, self.latency = metrics.requests.children, metrics.latency.children

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [500]

        async def observed_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        finally:
            route = scope["path"] if scope["path"] in _ROUTES else "other"
            self.requests[(route, str(status[0]))].inc()
            self.latency[(route,)].observe(time.perf_counter() - start)


_ROUTES = {"/v1/chat/completions", "/v1/models", "/healthz", "/health", "/metrics", "/v1/feedback"}
