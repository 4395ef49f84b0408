"""Several policy engines behind one proxy: which engine serves a session's turn, and each engine's state.

Stage: serving → **engines** → backend (one ``PolicyBackend`` per engine) → SGLang. Slime starts several
SGLang engines when the rollout GPUs outnumber one engine's; ``--policy-url`` then takes them all
(comma-separated), or the one URL of the sglang-router in front of them.

Why affinity: turn k+1 of a session repeats turn k's prompt and reply, and only the engine that served
turn k holds that prefix in its KV cache. Each session's routing key (the one the proxy already sends as
``X-SMG-Routing-Key``) picks its engine by rendezvous hashing (highest hash of key + engine URL): the same
engine every turn, and removing an engine moves only the sessions it held. An engine that does not take
a request (refused connection, a 5xx, a broken stream before its first token) is skipped for the next one
in the key's order, counted as a failover; one that refused a connection is marked down and skipped
until the background probe (``/healthz``'s) sees it answer again, or ``DOWN_RETRY_S`` passed. A stream
that already sent tokens to the client is never moved: its error reaches the client as before.
Behind a router the router picks the engine (``--policy manual`` keys on the same header); the proxy
then only lists the router's workers for ``/healthz`` (``router_workers``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from .backend import GenerateResult, PolicyBackend
from .errors import BackendResponseTooLarge, BackendUnavailable, GenerationAborted

log = logging.getLogger(__name__)
_T = TypeVar("_T")

DOWN_RETRY_S = 30.0  # an engine marked down is tried again after this long even without a probe


def split_urls(value: str | Sequence[str]) -> list[str]:
    """The engine URLs of a ``policy_url`` setting: a comma-separated string or a list; no empty items."""
    items = [v.strip() for v in (value.split(",") if isinstance(value, str) else value)]
    return [v.rstrip("/") for v in items if v]


def routing_key(session_key: str) -> str:
    """The ``X-SMG-Routing-Key`` of a session (``namespace\x1fsession id``): stable, and no client string
    reaches the engines or the router."""
    return hashlib.sha1(session_key.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def rendezvous_order(key: str, urls: Sequence[str]) -> list[int]:
    """Indices of ``urls``, the key's preferred engine first (highest random weight hashing)."""
    def weight(url: str) -> bytes:
        return hashlib.blake2b(f"{key}\x1f{url}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return sorted(range(len(urls)), key=lambda i: weight(urls[i]), reverse=True)


@dataclass
class EngineState:
    """One engine's counters and health, as ``/healthz`` shows them."""

    url: str
    requests: int = 0  # turns sent to it (first tries and failovers alike)
    failures: int = 0  # turns it did not take, each moved to another engine (or failed, if none was left)
    failovers_in: int = 0  # turns it served for a session whose own engine failed or was marked down
    down_since: float | None = None  # monotonic time it was marked down (None: up)
    last_error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # the probe's view (reachable, context_length...)

    def is_down(self, now: float) -> bool:
        return self.down_since is not None and now - self.down_since < DOWN_RETRY_S

    def view(self) -> dict[str, Any]:
        return {"url": self.url, **self.extra, "marked_down": self.down_since is not None,
                "requests": self.requests, "failures": self.failures, "failovers_in": self.failovers_in,
                **({"last_error": self.last_error} if self.last_error else {})}


def _moves(error: BaseException) -> bool:
    """Whether a failed call may go to another engine: the engine did not take it (unreachable, a 5xx, a
    malformed or broken answer). Not a timeout (another engine would wait as long), an answer over the size
    cap, an abort that could not be resumed, or a 400 (the request itself is wrong)."""
    return isinstance(error, BackendUnavailable) and not isinstance(
        error, (BackendResponseTooLarge, GenerationAborted))


class EnginePool:
    """``PolicyBackend``'s interface over several engines, each session kept on its rendezvous engine."""

    def __init__(self, backends: Sequence[PolicyBackend],
                 on_failover: Callable[[str, str], None] = lambda url, reason: None,
                 clock: Callable[[], float] = time.monotonic):
        if not backends:
            raise ValueError("an engine pool needs at least one engine")
        self.backends = list(backends)
        self.urls = [b.url for b in self.backends]
        self.states = [EngineState(url) for url in self.urls]
        self.failovers = 0
        self.on_failover, self.clock = on_failover, clock

    # PolicyBackend's attributes the proxy reads, over all engines
    @property
    def url(self) -> str:
        return ",".join(self.urls)

    @property
    def resumed(self) -> int:
        return sum(b.resumed for b in self.backends)

    def order(self, routing_key: str | None) -> list[int]:
        """Engines to try for this key: its rendezvous order, engines marked down moved to the end."""
        ranked = rendezvous_order(routing_key or "", self.urls)
        now = self.clock()
        return sorted(ranked, key=lambda i: self.states[i].is_down(now))  # stable: keeps the hash order

    def home(self, routing_key: str | None) -> str:
        """The engine this key is served by now."""
        return self.urls[self.order(routing_key)[0]]

    def _failed(self, i: int, error: BaseException, left: bool) -> None:
        state = self.states[i]
        state.failures += 1
        state.last_error = str(error)[:200]
        reason = "unreachable" if "unreachable" in str(error) else "error"
        if reason == "unreachable":
            was_up, state.down_since = state.down_since is None, self.clock()  # skipped for DOWN_RETRY_S more
            if was_up:
                log.warning("policy engine %s is unreachable: its sessions go to the next engine until it "
                            "answers again (%s)", state.url, state.last_error)
        if left:
            self.failovers += 1
            self.on_failover(state.url, reason)
            log.info("policy engine %s did not take a turn (%s): trying the next engine", state.url, reason)

    def _served(self, i: int, routing_key: str | None) -> None:
        if i != rendezvous_order(routing_key or "", self.urls)[0]:  # not the session's own engine
            self.states[i].failovers_in += 1

    def probed(self, url: str, extra: dict[str, Any], started: float) -> None:
        """The probe's view of one engine, from a probe begun at ``started`` (this pool's clock): an engine
        that answered is no longer marked down, unless a request failed on it after the probe began."""
        for state in self.states:
            if state.url == url:
                state.extra = extra
                if extra.get("reachable") and state.down_since is not None and state.down_since < started:
                    log.info("policy engine %s answers again", url)
                    state.down_since = None

    async def _first_answer(self, routing_key: str | None, start: Callable[[int], Awaitable[_T]]) -> _T:
        """``start(i)`` on the session's engines in order until one answers: an error that may move
        (``_moves``) fails over to the next engine, the last engine's error is the caller's."""
        order = self.order(routing_key)
        for n, i in enumerate(order):
            self.states[i].requests += 1
            try:
                answer = await start(i)
            except Exception as e:
                if not _moves(e):
                    raise
                last = n + 1 == len(order)
                self._failed(i, e, left=not last)
                if last:
                    raise
                continue
            self._served(i, routing_key)
            return answer
        raise AssertionError("unreachable")  # the loop returns or raises

    async def generate(self, payload: dict[str, Any], routing_key: str | None = None) -> GenerateResult:
        return await self._first_answer(routing_key, lambda i: self.backends[i].generate(payload, routing_key))

    async def generate_stream(self, payload: dict[str, Any], routing_key: str | None = None,
                              gather_s: float = 0.0) -> AsyncIterator[GenerateResult]:
        async def opened(i: int) -> tuple[AsyncGenerator[GenerateResult, None], GenerateResult | None]:
            stream = self.backends[i].generate_stream(payload, routing_key, gather_s)
            try:
                return stream, await anext(stream)
            except StopAsyncIteration:
                return stream, None
            except BaseException:
                await stream.aclose()
                raise

        stream, first = await self._first_answer(routing_key, opened)
        try:
            if first is None:
                return
            yield first
            async for snap in stream:  # from here on an error reaches the client: tokens were sent
                yield snap
        finally:
            await stream.aclose()

    def health(self) -> list[dict[str, Any]]:
        return [state.view() for state in self.states]

    async def aclose(self) -> None:
        for backend in self.backends:
            await backend.aclose()


async def router_workers(http: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None,
                         timeout_s: float = 3.0) -> list[dict[str, Any]] | None:
    """The workers an sglang-router lists at ``GET /workers`` (url, healthy, load), or None when ``url``
    answers but is not a router (a plain SGLang answers 404). Raises ``httpx.HTTPError`` when it does not
    answer."""
    resp = await http.get(f"{url.rstrip('/')}/workers", headers=headers, timeout=timeout_s)
    try:
        data = resp.json() if resp.status_code == 200 else None
    except ValueError:
        return None
    workers = data.get("workers") if isinstance(data, dict) else None
    if not isinstance(workers, list):
        return None
    return [{"url": w.get("url"), "healthy": w.get("is_healthy"), "load": w.get("load")}
            for w in workers if isinstance(w, dict)]
