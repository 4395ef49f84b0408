"""Client of the policy's SGLang native ``/generate`` (token ids in, token ids + log-probs out).

Stage: serving → **backend** → SGLang. One pooled ``httpx.AsyncClient`` for the life of the proxy
(upstream built a new client, and loaded the TLS CA bundle, on every call). Every failure becomes a
typed error: unreachable or garbage → 502, slow → 504, SGLang's own 400 (e.g. context too long) → 400
with SGLang's message. Responses are validated: ids and log-prob triples must align, and their count
must be SGLang's ``completion_tokens``, or it is a 502 (never a silently truncated sample).

How its answers are read: ``sglang_answers.py``; streamed ones: ``sglang_stream.py``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from . import codec
from .capped import StreamBudget, read_capped, too_large
from .errors import (
    BackendResponseTooLarge,
    BackendTimeout,
    BackendUnavailable,
    BadRequest,
    ContextLengthExceeded,
)
from .rawstream import ResponseError, ResponseTooLarge, StreamClient
from .sglang_answers import (  # noqa: F401 - re-exported: the tests and scripts import them from here
    MAX_RESUMES,
    GenerateResult,
    _aligned_logprobs,
    _check_error,
    _completion_tokens,
    _finish_and_version,
    _top_logprobs,
    _unresumed,
    continuation,
    joined,
    parse_generate,
    resumable,
    settle_abort,
)
from .sglang_stream import SSEReader, StreamAssembler  # noqa: F401 - re-exported as above

log = logging.getLogger(__name__)

class PolicyBackend:
    def __init__(self, http: httpx.AsyncClient, url: str, *, timeout_s: float = 600.0, api_key: str = "",
                 connect_timeout_s: float = 10.0, stream_interval: int = 0, end_ids: frozenset[int] = frozenset(),
                 decode: Callable[[list[int], bool], str] | None = None, max_response_bytes: int = 0):
        self.http, self.url, self.timeout_s = http, url.rstrip("/"), timeout_s
        self.max_response_bytes = max_response_bytes
        """A whole answer, one stream event, or a stream's content beyond this is a 502 (0: no cap; capped.py)."""
        self.stream_interval = stream_interval
        """Tokens per event asked of SGLang on streamed calls (``sampling_params.stream_interval``); 0 sends
        nothing (the server's ``--stream-interval`` applies), and becomes 0 once the server refused the field."""
        self._unexplained_failures = 0  # in a row, each fixed by a retry without the field
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # calls to a plain-http SGLang go through rawstream (streams: 10x less CPU per byte than httpx)
        self.streams = StreamClient(self.url, connect_timeout_s=connect_timeout_s) \
            if self.url.startswith("http://") else None
        self.declared_mode: str | None = None
        """The server's ``incremental_streaming_output`` ("incremental" / "cumulative"), once read."""
        self.resumed = 0
        """Generations resumed after a pause's abort."""
        self.end_ids = end_ids
        """Ids that end a reply (EOS, end of turn): an aborted output ending with one is complete."""
        self.decode = decode
        """``(ids, skip_special_tokens) -> text`` as the server decodes: joins text across a resume."""
        self._probe: asyncio.Task | None = None

    def _raise_for(self, status: int, body: bytes) -> None:
        text = body.decode("utf-8", "replace")[:500]
        if status == 400:
            try:
                err = codec.loads(text)
                message = err.get("error", {}).get("message") or err.get("message") or text
            except (ValueError, AttributeError):
                message = text
            cls = ContextLengthExceeded if "context length" in str(message) else BadRequest
            raise cls(f"policy backend rejected the request: {message}",
                      param="messages" if cls is ContextLengthExceeded else None)
        raise BackendUnavailable(f"policy backend answered HTTP {status}: {text[:200]}")

    def _headers(self, routing_key: str | None) -> dict[str, str]:
        # A stable per-session key lets sglang-router (policy: consistent_hashing) keep a session on one
        # worker, so multi-turn prompts hit that worker's prefix cache. Slime's agent adapters do the same.
        base = {**self.headers, "Content-Type": "application/json"}
        return {**base, "X-SMG-Routing-Key": routing_key} if routing_key else base

    async def read_stream_mode(self) -> str | None:
        """The server's declared streaming mode from ``/get_server_info`` (None if it does not say)."""
        try:
            resp = await self.http.get(f"{self.url}/get_server_info", headers=self.headers, timeout=10.0)
            info = codec.loads(resp.content) if resp.status_code == 200 else {}
        except (httpx.HTTPError, *codec.DecodeError):
            return None
        flag = info.get("incremental_streaming_output") if isinstance(info, dict) else None
        if flag is None:
            return None
        self.declared_mode = "incremental" if flag else "cumulative"
        if not flag:
            log.warning("the policy SGLang streams cumulatively (every chunk repeats all ids and log-probs so far): "
                        "the proxy handles it, but start SGLang with --incremental-streaming-output (Slime: "
                        "--sglang-incremental-streaming-output) to cut the stream's bytes from O(n^2) to O(n)")
        return self.declared_mode

    async def generate(self, payload: dict[str, Any], routing_key: str | None = None) -> GenerateResult:
        """The whole reply. A generation aborted by a pause (Slime pauses SGLang in ``abort`` mode for each
        weight update) is resumed from its tokens: the reply the client gets is whole, and its sample's
        version ``mixed:`` when the weights changed in between."""
        decode = self._decoder(payload)
        result = settle_abort(payload, await self._generate_once(payload, routing_key), self.end_ids)
        resumes = 0
        while resumes < MAX_RESUMES and resumable(payload, result):
            nxt = continuation(payload, result)
            assert nxt is not None  # settle_abort made a full budget a "length"
            resumes += 1
            self._log_resume(result)
            result = settle_abort(payload, joined(result, await self._generate_once(nxt, routing_key), decode),
                                  self.end_ids)
        if result.finish_reason == "abort":
            raise _unresumed(result, resumes)
        return result

    def _decoder(self, payload: dict[str, Any]) -> Callable[[list[int]], str] | None:
        """Ids → text as SGLang decodes this request's output (its ``skip_special_tokens``)."""
        if self.decode is None:
            return None
        skip = bool((payload.get("sampling_params") or {}).get("skip_special_tokens", True))
        return lambda ids: self.decode(ids, skip)  # type: ignore[misc]

    def _log_resume(self, result: GenerateResult) -> None:
        self.resumed += 1
        log.info("the policy server aborted a generation after %d tokens (a pause for a weight update?): resuming "
                 "it from those tokens", len(result.output_ids))

    async def _generate_once(self, payload: dict[str, Any], routing_key: str | None = None) -> GenerateResult:
        # plain http: the raw client (a fraction of httpx's CPU per call)
        status, content = await post_whole(
            self.streams, self.http, self.url, "/generate", codec.dumps(payload), self._headers(routing_key),
            self.timeout_s, timeout_message=f"policy backend did not answer within {self.timeout_s}s",
            unreachable=f"policy backend at {self.url} is unreachable", max_bytes=self.max_response_bytes,
            what="policy backend /generate", setting=_CAP_SETTING)
        if status != 200:
            self._raise_for(status, content)
        try:
            data = codec.loads(content)
        except codec.DecodeError as e:
            raise BackendUnavailable("policy backend answered non-JSON") from e
        return parse_generate(data, final=True)

    async def generate_stream(self, payload: dict[str, Any], routing_key: str | None = None,
                              gather_s: float = 0.0) -> AsyncIterator[GenerateResult]:
        """``_stream_once``'s snapshots; a generation aborted by a pause goes on from its tokens (see
        ``generate``), its continuation's snapshots joined onto what came before."""
        decode = self._decoder(payload)
        done: GenerateResult | None = None
        request: dict[str, Any] | None = payload
        resumes = 0
        while True:
            last = None
            stream = self._stream_once(request, routing_key, gather_s)
            try:
                async for snap in stream:
                    last = snap
                    if snap.finish_reason == "abort":
                        break  # held back: it may be complete after all (settle_abort), or go on resumed
                    yield snap if done is None else joined(done, snap, decode)
            finally:
                await stream.aclose()
            assert last is not None  # _stream_once raises when it ends without a finish
            done = settle_abort(payload, last if done is None else joined(done, last, decode), self.end_ids)
            if done.finish_reason != "abort":
                if last.finish_reason == "abort":  # an abort that completed the reply: its last snapshot
                    yield done
                return
            if resumes >= MAX_RESUMES or not resumable(payload, done):
                raise _unresumed(done, resumes)
            request = continuation(payload, done)
            assert request is not None  # settle_abort made a full budget a "length"
            resumes += 1
            self._log_resume(done)

    async def _stream_once(self, payload: dict[str, Any], routing_key: str | None = None,
                           gather_s: float = 0.0) -> AsyncIterator[GenerateResult]:
        """Yield the growing result after each network read that completed events; the last has a finish_reason.

        The events of one read become one snapshot. With ``gather_s``, after a snapshot with text the
        next one waits until the first read after ``gather_s`` (``2 * gather_s`` at most) or the response is
        complete, and takes everything that arrived meanwhile: one client write per interval instead of one per token, and from a
        cumulative stream only the last of those events is decoded. The end of a reply is never held."""
        if self._probe is None:  # once, in the background: never delays a request
            self._probe = asyncio.get_running_loop().create_task(self.read_stream_mode())
        last, suspicion = None, ""
        for interval in (self.stream_interval, 0) if self.stream_interval else (0,):
            results = self._stream_events(with_stream_interval(payload, interval), routing_key, gather_s)
            try:
                async for last in results:
                    if suspicion:  # the retry without the field works
                        self._retry_worked_without_interval(suspicion)
                        suspicion = ""
                    elif interval:
                        self._unexplained_failures = 0  # the field works here: a failure was something else
                    yield last
                break
            except (BadRequest, BackendUnavailable) as e:
                suspicion = _may_refuse_interval(e) if last is None and interval else ""
                if not suspicion:
                    raise
                log.info("streamed /generate with stream_interval %d failed before its first event (%s); retrying "
                         "once without the field", interval, e)
            finally:  # a client that hangs up closes the backend connection now (SGLang then aborts the request)
                await results.aclose()
        if last is None or last.finish_reason is None:
            raise BackendUnavailable("policy backend stream ended without a finish_reason")

    def _stream_events(self, payload: dict[str, Any], routing_key: str | None, gather_s: float
                       ) -> AsyncIterator[GenerateResult]:
        body = codec.dumps({**payload, "stream": True})
        return self._stream_raw(body, routing_key, gather_s) if self.streams else self._stream_httpx(body, routing_key)

    def _retry_worked_without_interval(self, suspicion: str) -> None:
        """A streamed call failed with the field and worked without it. An error naming the field settles
        it at once. A bare server error or broken stream (how an SGLang whose SamplingParams lacks the field
        fails) may also be a passing overload: only ``UNEXPLAINED_FAILURES_TO_DROP`` of those in a row, with
        no call that worked with the field between them, stop the proxy sending it."""
        if suspicion == "generic":
            self._unexplained_failures += 1
            if self._unexplained_failures < UNEXPLAINED_FAILURES_TO_DROP:
                return
        if self.stream_interval:
            log.warning("the policy SGLang refused sampling_params.stream_interval=%d (an SGLang older than "
                        "the per-request field): streamed turns from %s now get one event per token. Start SGLang "
                        "with --stream-interval N to have the server batch them", self.stream_interval, self.url)
            self.stream_interval = 0

    @staticmethod
    def _feed(reader: SSEReader, assembler: StreamAssembler, piece: bytes = b"",
              budget: StreamBudget | None = None) -> GenerateResult | None:
        """The events completed by one read, as one snapshot. Once the stream is known to be cumulative,
        only the read's last event is decoded: it repeats everything the earlier ones hold. Events over
        the size cap fail the stream before they are decoded."""
        spans = reader.push(piece)
        if budget is not None:
            budget.events(spans, assembler.mode == "cumulative")
        return assembler.feed_many(reader.buf, spans)

    async def _stream_raw(self, body: bytes, routing_key: str | None, gather_s: float = 0.0
                          ) -> AsyncIterator[GenerateResult]:
        assert self.streams is not None
        headers = {**self._headers(routing_key), "Accept": "text/event-stream"}
        try:
            conn = await self.streams.post("/generate", body, headers, self.timeout_s, sse=True,
                                           max_body=self.max_response_bytes)  # for an error's body
        except (TimeoutError, asyncio.TimeoutError) as e:
            raise BackendTimeout(f"policy backend did not answer within {self.timeout_s}s") from e
        except (OSError, ResponseError) as e:
            raise BackendUnavailable(f"policy backend at {self.url} is unreachable: {e!r}") from e
        try:
            if conn.status != 200:
                while not conn.finished:
                    await conn.wait(self.timeout_s)
                    conn.fresh = False
                if isinstance(conn.error, ResponseTooLarge):
                    raise too_large(f"policy backend (HTTP {conn.status})", f"an answer of more than "
                                    f"{self.max_response_bytes} bytes", self.max_response_bytes, _CAP_SETTING)
                self._raise_for(conn.status, conn.body)
            reader, assembler, budget = SSEReader(conn), StreamAssembler(), StreamBudget(self.max_response_bytes)
            while not reader.done:
                if not conn.fresh and not conn.finished:
                    await conn.wait(self.timeout_s)
                conn.fresh = False
                last = self._feed(reader, assembler, budget=budget)
                conn.superseded = assembler.mode == "cumulative"
                reader.consume()  # reading resumes here once a paused backlog is small again
                budget.unfinished(reader.pending)
                if last is not None:
                    yield last
                    if gather_s and last.text and not reader.done:
                        # at most half the stall timeout: a window longer than that (or inf) must not keep a
                        # stalled backend's reply from its 504 (wait_gathered holds up to twice the window)
                        await conn.wait_gathered(min(gather_s, self.timeout_s / 2))
                if not reader.done and conn.finished and not conn.fresh:
                    if conn.error is not None or not conn.complete:
                        why = repr(conn.error) if conn.error is not None else "the connection closed mid-stream"
                        raise BackendUnavailable(f"policy backend stream failed: {why}")
                    break
            while reader.done and not conn.finished:  # the chunked terminator follows [DONE] at once;
                try:  # without it the connection is just not reused
                    await conn.wait(1.0)
                except (TimeoutError, asyncio.TimeoutError):
                    break
                conn.fresh = False
        except (TimeoutError, asyncio.TimeoutError) as e:
            raise BackendTimeout(f"policy backend stream stalled for {self.timeout_s}s") from e
        finally:
            self.streams.release(conn)

    async def _stream_httpx(self, body: bytes, routing_key: str | None) -> AsyncIterator[GenerateResult]:
        try:
            async with self.http.stream("POST", f"{self.url}/generate", content=body,
                                        headers=self._headers(routing_key), timeout=self.timeout_s) as resp:
                if resp.status_code != 200:
                    self._raise_for(resp.status_code, await read_capped(
                        resp, self.max_response_bytes, f"policy backend (HTTP {resp.status_code})", _CAP_SETTING))
                reader, assembler, budget = SSEReader(), StreamAssembler(), StreamBudget(self.max_response_bytes)
                async for piece in resp.aiter_bytes():
                    last = self._feed(reader, assembler, piece, budget)
                    reader.consume()
                    budget.unfinished(reader.pending)
                    if last is not None:
                        yield last
                    if reader.done:
                        break
        except httpx.TimeoutException as e:
            raise BackendTimeout(f"policy backend stream stalled for {self.timeout_s}s") from e
        except httpx.HTTPError as e:
            raise BackendUnavailable(f"policy backend stream failed: {e!r}") from e

    async def aclose(self) -> None:
        if self.streams is not None:
            self.streams.close()

_CAP_SETTING = "openclaw_proxy_max_response_bytes"


async def post_whole(raw: StreamClient | None, http: httpx.AsyncClient, base_url: str, path: str, body: bytes,
                     headers: dict[str, str], timeout_s: float, *, timeout_message: str,
                     unreachable: str, max_bytes: int = 0, what: str = "backend",
                     setting: str = "") -> tuple[int, bytes]:
    """One whole POST, (status, body): through the raw client when there is one (plain http), else httpx.
    A timeout raises ``BackendTimeout(timeout_message)``, a body over ``max_bytes`` (0: no cap; read no
    further than that) ``BackendResponseTooLarge`` naming ``what`` and its ``setting``, any other transport
    failure ``BackendUnavailable`` starting with ``unreachable``. Shared by the policy and the judge."""
    try:
        if raw is not None:
            return await raw.request(path, body, headers, timeout_s, max_body=max_bytes)
        async with http.stream("POST", base_url + path, content=body, headers=headers, timeout=timeout_s) as resp:
            return resp.status_code, await read_capped(resp, max_bytes, what, setting)
    except ResponseTooLarge as e:
        raise too_large(what, f"an answer of more than {max_bytes} bytes", max_bytes, setting) from e
    except BackendResponseTooLarge:  # read_capped's (a ConnectionError, so an OSError: not "unreachable")
        raise
    except (TimeoutError, asyncio.TimeoutError, httpx.TimeoutException) as e:
        raise BackendTimeout(timeout_message) from e
    except (OSError, ResponseError, httpx.HTTPError) as e:
        raise BackendUnavailable(f"{unreachable}: {e!r}") from e


# --- value range checks (kept apart from parsing) ------------------------------------------------------

def with_stream_interval(payload: dict[str, Any], interval: int) -> dict[str, Any]:
    """``payload`` asking SGLang for one stream event per ``interval`` tokens (0: unchanged). SGLang sends
    the first token at once, then an event whenever at least ``interval`` tokens are unsent, and the
    finish always; the events hold the same ids, log-probs and text, just fewer of them."""
    if not interval:
        return payload
    return {**payload, "sampling_params": {**(payload.get("sampling_params") or {}), "stream_interval": interval}}


UNEXPLAINED_FAILURES_TO_DROP = 3  # see PolicyBackend._retry_worked_without_interval


def _may_refuse_interval(error: Exception) -> str:
    """Whether a streamed call that failed before its first event may have failed on the
    ``stream_interval`` field: ``"named"`` for an error naming it (an SGLang whose SamplingParams lacks it
    raises ``unexpected keyword argument 'stream_interval'``), ``"generic"`` for a server error or broken
    stream, which is how such an SGLang's uncaught TypeError reaches the client, and ``""`` (not retried)
    for a 400 about anything else, an unreachable server or a timeout."""
    text = str(error)
    if isinstance(error, BackendResponseTooLarge):
        return ""
    if "stream_interval" in text or "unexpected keyword" in text:
        return "named"
    return "generic" if isinstance(error, BackendUnavailable) and "unreachable" not in text else ""


def check_output_values(result: GenerateResult, vocab_size: int) -> str | None:
    """Why a final /generate answer cannot be trained on (None if it can): every id inside the
    vocabulary (which also makes it fit a 32-bit token array), every log-prob a finite number ≤ 0."""
    ids, logprobs = result.output_ids, result.logprobs
    if ids and not (min(ids) >= 0 and max(ids) < vocab_size):  # in C; the loop below only names the culprit
        for i, t in enumerate(ids):
            if not 0 <= t < vocab_size:
                return f"output id {t} at position {i} is outside the vocabulary of {vocab_size}"
    if logprobs and not (all(map(math.isfinite, logprobs)) and max(logprobs) <= 0.0):
        for i, lp in enumerate(logprobs):
            if not (math.isfinite(lp) and lp <= 0.0):
                return f"log-prob {lp!r} at position {i} is not a finite number <= 0"
    return None


# --- reachability and context length (GET, cached by the caller) --------------------------------------

@dataclass(slots=True)
class BackendInfo:
    reachable: bool
    context_length: int | None  # tokens, when the server reports it
    error: str = ""


async def probe_backend(http: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None,
                        timeout_s: float = 3.0) -> BackendInfo:
    """One cheap probe: ``GET /v1/models`` (SGLang and the embedded engine report ``max_model_len``);
    else SGLang's ``/get_server_info`` (``context_length`` when it was set at launch). ``/health`` is not
    used: SGLang runs a real generation for it (about 1 s)."""
    url = url.rstrip("/")
    try:
        resp = await http.get(f"{url}/v1/models", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as e:
        return BackendInfo(False, None, f"{type(e).__name__}: {e}")
    context = None
    if resp.status_code == 200:
        context = _positive_int(_first(resp, "data", "max_model_len"))
    if context is None:
        try:
            info = await http.get(f"{url}/get_server_info", headers=headers, timeout=timeout_s)
            if info.status_code == 200:
                data = info.json()
                context = _positive_int(data.get("context_length")) if isinstance(data, dict) else None
        except (httpx.HTTPError, ValueError):
            pass
    if resp.status_code >= 500:
        return BackendInfo(False, context, f"HTTP {resp.status_code}")
    return BackendInfo(True, context)


def _first(resp: httpx.Response, key: str, field: str) -> Any:
    try:
        items = resp.json().get(key)
        return items[0].get(field) if isinstance(items, list) and items and isinstance(items[0], dict) else None
    except (ValueError, AttributeError):
        return None


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
