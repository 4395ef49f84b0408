"""The proxy's HTTP layer: assemble the pipeline once (``Proxy``) and expose it with thin routes.

Stage: client → **routes** → serving. ``Proxy.build(settings)`` wires tokenizer, backend client, judge,
mode scorer, session tracker, spool writer and gate; ``proxy.app`` is the ASGI app: the FastAPI app, with
``POST /v1/chat/completions`` served in front of FastAPI's routing layers (``DirectRoute``). No module
globals: two proxies can run in one process (tests do). Bodies are read and size-checked before
parsing; every error leaves as OpenAI's error JSON with a 4xx/5xx status (``errors.py``).
"""

from __future__ import annotations

import asyncio
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
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from . import codec
from .backend import PolicyBackend
from .chat import ChatRenderer
from .config import Settings
from .dashboard.data import Sources, waiting_from_tracker
from .dashboard.journal import TurnJournal
from .dashboard.routes import dashboard_router
from .engines import EnginePool, split_urls
from .errors import (
    BadRequest,
    ClientGone,
    NotDurable,
    OpenClawError,
    Overloaded,
    PayloadTooLarge,
    RateLimited,
    RequestTimeout,
    Unauthorized,
    error_body,
    internal_error_body,
)
from .gate import SubmissionGate
from .identity import check_resolver_names
from .judge import JudgeClient
from .metrics import ProxyMetrics
from .modes import MODES
from .parsers import OutputParser
from .probes import BackendProbes
from .protocol import ChatCompletionRequest, FeedbackRequest, has_lone_surrogate, models_response
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


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _is_branch_tag(part: Any) -> bool:
    """pydantic's name for a union member in an error's path ("str", "list[union[TextPart,OtherPart]]"):
    not a field of the request. Fields are lower snake_case; members are types."""
    return isinstance(part, str) and ("[" in part or part[:1].isupper() or part in _TYPE_TAGS)


def validation_message(e: ValidationError) -> tuple[str, str | None]:
    """The first error, said of the field. Where a union's first member only says "should be a valid
    string", the member that matched the input's type says more (``content: []``: at least 1 item)."""
    errors = e.errors()
    first = errors[0]
    if first["type"].endswith("_type"):
        first = next((x for x in errors if not x["type"].endswith("_type")
                      and tuple(x["loc"][:-1]) == tuple(first["loc"][:-1])), first)
    param = ".".join(str(p) for p in first.get("loc", ()) if not _is_branch_tag(p)) or None
    return f"invalid request: {first.get('msg')}" + (f" (at {param})" if param else ""), param


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
        # Pooled connections expire before the backend's keep-alive timeout (uvicorn and SGLang: 5 s), so a
        # request never races the server closing its idle connection (seen as sporadic 502s under load).
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256, keepalive_expiry=2.0)
        http = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(p.request_timeout_s, connect=p.connect_timeout_s),
                                 trust_env=False, verify=tls_context())
        renderer = ChatRenderer(tokenizer, p.enable_thinking)
        metrics = ProxyMetrics()
        teacher_slots = settings.opd.teacher_concurrency if MODES[settings.mode].needs_teacher else 0
        def count_retry(event: str, call: str, reason: str) -> None:
            (metrics.judge_retries if event == "retry" else metrics.judge_gave_up).labels(call, reason).inc()

        judge = JudgeClient(http, j, tokenizer=judge_tokenizer, vocab_size=len(judge_tokenizer),
                            on_vote=lambda outcome: metrics.judge_votes.labels(outcome).inc(),
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
        engines = [PolicyBackend(http, url, timeout_s=p.request_timeout_s, api_key=p.policy_api_key,
                                 connect_timeout_s=p.connect_timeout_s, stream_interval=p.stream_interval,
                                 end_ids=renderer.end_of_reply_ids, max_response_bytes=p.max_response_bytes,
                                 decode=lambda ids, skip: renderer.decoder(skip)(ids))
                   for url in split_urls(p.policy_url)]
        backend: Any = engines[0] if len(engines) == 1 else EnginePool(
            engines, on_failover=lambda url, reason: metrics.policy_failovers.labels(url, reason).inc())
        service = ChatService(p, renderer, OutputParser.named(p.reasoning_parser, p.tool_parser, renderer.format), backend, tracker,
                              gate, metrics, keep_messages=scorer.keeps_messages)
        auth = Authenticator(p.api_keys, p.rate_limit_per_min)
        probes = BackendProbes(http, settings, service, judge, metrics)
        proxy = cls(settings, http, renderer, judge, spool, writer, tracker, gate, metrics, service, auth, probes,
                    journal=journal, users=UserResolver(p.trusted_user_keys, p.user_header),
                    user_admin=UserAdmin(list(p.admin_keys)))
        proxy.dashboard = Sources(spool.dir, tokenizer=tokenizer, waiting=lambda: waiting_from_tracker(tracker))
        proxy.app = make_app(proxy)
        return proxy

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


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body, size-checked as it arrives and read within ``timeout_s`` (a slow body gets 408)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the {limit}-byte limit")
    body = bytearray()

    async def read() -> None:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limit:
                raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
    try:
        await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise RequestTimeout(f"request body not received within {timeout_s:g}s") from None
    except ClientDisconnect:
        log.info("client hung up on %s after %d bytes of its body", request.url.path, len(body))
        raise ClientGone("client disconnected before its request body was complete") from None
    return bytes(body)


INLINE_PARSE_BYTES = 64 * 1024  # bodies above this are parsed and validated on a worker thread


def parse_json_body(body: bytes) -> Any:
    try:
        data, unicode_ok = codec.loads_unicode(body)
    except (*codec.DecodeError, RecursionError) as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    # escapes (\\ud800) and, through json's surrogatepass, raw CESU-8 bytes (ED A0 80) can smuggle them in
    if not unicode_ok and has_lone_surrogate(data):
        raise BadRequest("request body contains a lone UTF-16 surrogate (\\ud800-\\udfff): not valid Unicode")
    return data


async def read_json_body(request: Request, limit: int, timeout_s: float = 60.0) -> Any:
    body = await read_body(request, limit, timeout_s)
    if len(body) > INLINE_PARSE_BYTES:
        return await asyncio.to_thread(parse_json_body, body)
    return parse_json_body(body)


def parse_chat_request(raw: Any, max_messages: int) -> ChatCompletionRequest:
    """Cheap bounds first (the message count), then the schema."""
    if not isinstance(raw, dict):
        raise BadRequest("request body must be a JSON object")
    messages = raw.get("messages")
    if isinstance(messages, list) and len(messages) > max_messages:
        raise BadRequest(f"too many messages: {len(messages)} (this proxy accepts at most {max_messages})",
                         param="messages")
    try:
        return ChatCompletionRequest.model_validate(raw)
    except ValidationError as e:
        message, param = validation_message(e)
        raise BadRequest(message, param=param) from None


async def cancel_on_disconnect(request: Request, work: Any) -> Any:
    """Run ``work`` (a coroutine) and cancel it if the client hangs up first: a non-streaming backend call
    nobody waits for is stopped (its turn settles as client_disconnected). Returns None when the client
    left. The body is fully read here, so the next ASGI message can only be the disconnect."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(request.receive())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and watcher.done() and watcher.result().get("type") == "http.disconnect":
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return None
        return await task
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()


def make_app(proxy: Proxy) -> Any:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        proxy.tracker.restore([Turn.from_record(json.loads(p)) for p in proxy.spool.pending_turns()])
        proxy.tracker.start_sweeper()
        await proxy.probes.refresh()  # learn the context lengths before the first request
        proxy.probes.start()
        # torch/transformers leave ~250K long-lived objects; without freezing them every full collection
        # walks them all and stalls the event loop for 100-300 ms (measured by the benchmark).
        gc.collect()
        gc.freeze()
        yield
        await proxy.shutdown()

    # No /docs, /redoc or /openapi.json: they would be served without the API key, and a path with a
    # trailing slash gets the JSON 404 of any unknown path, not a redirect.
    app = FastAPI(title="openclaw-rl proxy", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)
    metrics = proxy.metrics

    @app.exception_handler(OpenClawError)
    async def _known(request: Request, exc: OpenClawError) -> JSONResponse:
        return JSONResponse(error_body(exc), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = {"error": {"message": str(exc.detail), "type": "invalid_request_error", "param": None,
                          "code": exc.status_code}}
        return JSONResponse(body, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unknown(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse(internal_error_body(), status_code=500)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        namespace = proxy.users.user(proxy.auth.namespace(request.headers.get("authorization")), request.headers)
        if proxy.writer.overloaded:
            metrics.backpressure.inc()
            raise Overloaded(f"the spool is full and {len(proxy.writer.overflow)} samples wait in memory; retry "
                             "when the trainer has caught up", headers={"Retry-After": "30"})
        if proxy.writer.problem is not None:  # refused before the policy spends a generation it cannot save
            metrics.not_durable.labels("spool_failing").inc()
            raise NotDurable(f"the proxy cannot save turns to its spool now ({proxy.writer.problem}); retry "
                             "shortly", headers={"Retry-After": "5"})
        p = proxy.settings.proxy
        body = await read_body(request, p.max_body_bytes, p.body_timeout_s)
        if len(body) > INLINE_PARSE_BYTES:
            req = await asyncio.to_thread(lambda: parse_chat_request(parse_json_body(body), p.max_messages))
        else:
            req = parse_chat_request(parse_json_body(body), p.max_messages)
        work = proxy.service.complete(req, dict(request.headers), namespace, len(body))
        result = await (work if req.stream else cancel_on_disconnect(request, work))
        if result is None:  # the client hung up; nobody reads this
            return Response(status_code=499)
        if isinstance(result, dict):
            return Response(codec.dumps(result), media_type="application/json")
        return StreamingResponse(result, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> dict[str, Any]:
        namespace = proxy.users.user(proxy.auth.namespace(request.headers.get("authorization")), request.headers)
        raw = await read_json_body(request, 64 * 1024, proxy.settings.proxy.body_timeout_s)
        try:
            fb = FeedbackRequest.model_validate(raw)
        except ValidationError as e:
            message, param = validation_message(e)
            raise BadRequest(message, param=param) from None
        turn, how = proxy.tracker.feedback(f"{namespace}\x1f{fb.session_id}", fb.rating, fb.text)
        return {"session_id": fb.session_id, "turn": turn, "applied_as": how}

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        proxy.auth.namespace(request.headers.get("authorization"))
        return models_response(proxy.settings.proxy.served_model_name)

    @app.get("/healthz")
    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Cheap: backend reachability comes from the background probe's cache, the spool's state from
        the writer (``spool.error``: writes fail, or the file was deleted or replaced). ``ok`` is false
        while the policy is unreachable or the spool cannot take turns (the HTTP status stays 200: the
        proxy itself is alive)."""
        backends = proxy.probes.state
        policy_ok = backends.get("policy", {}).get("reachable", True)
        spool = proxy.writer.health()
        return {"ok": policy_ok and spool["ok"], "submission_open": proxy.gate.is_open,
                "sessions": len(proxy.tracker.sessions), "pending_turns": proxy.tracker.pending_turns,
                "backends": backends, "spool": spool, "spool_overflow": len(proxy.writer.overflow)}

    @app.get("/metrics")
    async def prometheus() -> Response:
        busy = sum(1 for sess in proxy.tracker.sessions.values() if sess.busy)
        metrics.sessions.labels("active").set(busy)
        metrics.sessions.labels("idle").set(len(proxy.tracker.sessions) - busy)
        metrics.spool_depth.set(proxy.spool.ready_count())
        metrics.submission_open.set(1 if proxy.gate.is_open else 0)
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
            self.metrics.requests.labels(route, str(status[0])).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - start)


_ROUTES = {"/v1/chat/completions", "/v1/models", "/healthz", "/health", "/metrics", "/v1/feedback"}
