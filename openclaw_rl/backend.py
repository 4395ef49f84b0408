"""Client of the policy's SGLang native ``/generate`` (token ids in, token ids + log-probs out).

Stage: serving → **backend** → SGLang. One pooled ``httpx.AsyncClient`` for the life of the proxy
(upstream built a new client, and loaded the TLS CA bundle, on every call). Every failure becomes a
typed error: unreachable or garbage → 502, slow → 504, SGLang's own 400 (e.g. context too long) → 400
with SGLang's message. Responses are validated: ids and log-prob triples must align, and their count
must be SGLang's ``completion_tokens``, or it is a 502 (never a silently truncated sample).

Streaming works in both of SGLang's modes, at a cost linear in the reply length:

- default (``incremental_streaming_output=false``): every chunk repeats all ids and log-prob triples so
  far, so a client that decodes each chunk in full does quadratic work (1.8 s of CPU for a 2,048-token
  reply). ``StreamAssembler`` cuts the two big arrays out of the chunk's bytes (C-speed ``find``),
  decodes the small rest, and decodes only the array tails it has not seen yet.
- ``--incremental-streaming-output``: each chunk carries only the new text, ids and triples; they are
  appended. (Treating those chunks as cumulative is how a 1-token "response" got trained before.)

The mode is read per chunk from the counts: ``completion_tokens`` is cumulative in both modes, so a
chunk holding ``completion_tokens`` ids repeats everything, one holding ``completion_tokens - seen``
ids holds the new ones, and anything else means tokens were lost: the stream fails with a 502 and the
turn is dropped with that reason. The server's declared mode (``/get_server_info``) is read once, to
log it and to recommend the incremental mode.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from . import codec
from .errors import BackendTimeout, BackendUnavailable, BadRequest

log = logging.getLogger(__name__)

_IDS_KEY = b'"output_ids":['
_LOGPROBS_KEY = b'"output_token_logprobs":['
_SPLICE_MIN_BYTES = 2048  # below this a chunk is decoded whole: cutting it up costs more than it saves


@dataclass(slots=True)
class GenerateResult:
    """One /generate answer (final, or a cumulative streaming snapshot)."""

    text: str
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None  # None while streaming; "stop" | "length" | "abort" at the end
    prompt_tokens: int
    weight_version: str | None


def _check_error(data: Any) -> dict[str, Any]:
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict):
        raise BackendUnavailable("policy backend answered an unexpected JSON shape")
    if "error" in data:
        err = data["error"]
        message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        raise BadRequest(f"policy backend rejected the request: {message}")
    return data


def _finish_and_version(meta: dict[str, Any]) -> tuple[str | None, str | None]:
    fr = meta.get("finish_reason")
    finish = fr.get("type") if isinstance(fr, dict) else fr
    version = meta.get("weight_version")
    segments = meta.get("weight_versions") or []
    if len(segments) > 1:  # the weights changed mid-generation: no single version produced it
        version = "mixed:" + ",".join(str(seg.get("version")) for seg in segments if isinstance(seg, dict))
    return finish, version


def _completion_tokens(meta: dict[str, Any]) -> int | None:
    n = meta.get("completion_tokens")
    return None if n is None else int(n)


def _aligned_logprobs(ids: list[int], triples: list[Any]) -> list[float]:
    if len(triples) != len(ids) or any(int(t[1]) != i for t, i in zip(triples, ids)):
        raise BackendUnavailable("policy backend log-probs do not match its output ids (return_logprob off?)")
    return [float(t[0]) for t in triples]


def parse_generate(data: Any, *, final: bool) -> GenerateResult:
    """A whole (non-streamed) ``/generate`` object."""
    data = _check_error(data)
    try:
        meta = data["meta_info"]
        ids = [int(t) for t in data["output_ids"]]
        logprobs = _aligned_logprobs(ids, meta.get("output_token_logprobs") or [])
        finish, version = _finish_and_version(meta)
        if final and finish is None:
            raise BackendUnavailable("policy backend ended without a finish_reason")
        n = _completion_tokens(meta)
        if n is not None and n != len(ids):
            raise BackendUnavailable(f"policy backend reports {n} completion tokens but sent {len(ids)} ids")
        return GenerateResult(str(data.get("text") or ""), ids, logprobs, finish, int(meta.get("prompt_tokens", 0)),
                              version)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise BackendUnavailable(f"policy backend answered malformed /generate output: {e!r}") from e


def _splice(data: bytes) -> tuple[bytes, bytes, bytes] | None:
    """Cut the interiors of ``output_ids`` and ``output_token_logprobs`` out of a chunk's JSON.

    Returns (the chunk with both arrays emptied, ids interior, triples interior), or None when the
    chunk does not have the expected layout (then it is decoded whole). The key patterns cannot occur
    inside a JSON string (their closing quote would be escaped there), and the arrays hold only
    numbers and nulls (the proxy never asks for ``return_text_in_logprobs``), so ``]`` / ``]]`` end them.
    """
    i = data.find(_IDS_KEY)
    if i < 0:
        return None
    ids_start = i + len(_IDS_KEY)
    ids_end = data.find(b"]", ids_start)
    j = data.find(_LOGPROBS_KEY, ids_end)
    if ids_end < 0 or j < 0:
        return None
    lp_start = j + len(_LOGPROBS_KEY)
    if data[lp_start:lp_start + 1] == b"]":
        lp_end = lp_start
    else:
        lp_end = data.find(b"]]", lp_start)
        if lp_end < 0 or not data.endswith(b"null", lp_start, lp_end):
            return None
        lp_end += 1
    light = b"".join((data[:ids_start], data[ids_end:lp_start], data[lp_end:]))
    return light, data[ids_start:ids_end], data[lp_start:lp_end]


def _tail(interior: bytes, count: int, sep: bytes) -> bytes:
    """The last ``count`` elements of an array interior (elements joined by ``sep``)."""
    end = len(interior)
    for _ in range(count):
        end = interior.rfind(sep, 0, end)
        if end < 0:
            return interior
    return interior[end + len(sep) - (1 if sep == b"],[" else 0):]


class StreamAssembler:
    """One streamed generation, assembled from SGLang's chunks in either streaming mode (see module doc).

    ``feed(payload)`` takes one event's JSON bytes and returns the growing result; its lists are
    extended in place, never rebuilt."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.text = ""
        self.mode: str | None = None  # "cumulative" | "incremental", once a chunk has told them apart
        self.chunks = 0

    def feed(self, payload: bytes) -> GenerateResult:
        self.chunks += 1
        try:
            spliced = _splice(payload) if len(payload) >= _SPLICE_MIN_BYTES else None
            data = _check_error(codec.loads(spliced[0] if spliced else payload))
            meta = data["meta_info"]
            if spliced:
                ids_raw, lp_raw = spliced[1], spliced[2]
                count = ids_raw.count(b",") + 1 if ids_raw.strip() else 0
            else:
                ids_list, triples = data["output_ids"], meta.get("output_token_logprobs") or []
                count = len(ids_list)
                if len(triples) != count:
                    raise BackendUnavailable(f"policy backend streamed {count} ids but {len(triples)} log-probs "
                                             "(return_logprob off?)")
            seen, n = len(self.ids), _completion_tokens(meta)
            if n is None:  # an SGLang without completion_tokens: trust the declared mode, default cumulative
                n = count if self.mode != "incremental" else seen + count
            if count == n - seen:
                mode, new = "incremental", count
            elif count == n and n >= seen:
                mode, new = "cumulative", n - seen
            else:
                raise BackendUnavailable(f"policy backend stream lost tokens: chunk {self.chunks} reports {n} "
                                         f"completion tokens, holds {count} ids, {seen} were seen before")
            if seen and self.mode is None:
                self.mode = mode
            elif seen and mode != self.mode:
                raise BackendUnavailable(f"policy backend stream switched from {self.mode} to {mode} chunks")
            if spliced:
                new_ids = [int(t) for t in codec.loads(b"[" + _tail(ids_raw, new, b",") + b"]")] if new else []
                new_triples = codec.loads(b"[" + _tail(lp_raw, new, b"],[") + b"]") if new else []
            else:
                new_ids = [int(t) for t in ids_list[count - new:]]
                new_triples = triples[len(triples) - new:] if new else []
            declared = meta.get("output_token_logprobs_length")
            if declared is not None and int(declared) != n:
                raise BackendUnavailable(f"policy backend reports {n} completion tokens but {declared} log-probs")
            self.logprobs += _aligned_logprobs(new_ids, new_triples)
            self.ids += new_ids
            text = data.get("text")  # absent with --skip-tokenizer-init
            if text is not None:
                self.text = text if mode == "cumulative" else self.text + text
            finish, version = _finish_and_version(meta)
            return GenerateResult(self.text, self.ids, self.logprobs, finish, int(meta.get("prompt_tokens", 0)),
                                  version)
        except codec.DecodeError as e:
            raise BackendUnavailable(f"policy backend streamed non-JSON: {e}") from e
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise BackendUnavailable(f"policy backend streamed malformed /generate output: {e!r}") from e


async def sse_payloads(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The ``data:`` payloads of an SSE byte stream, without decoding it to text (a cumulative
    SGLang stream is hundreds of MB for a long reply). ``[DONE]`` ends it."""
    buf, scan = bytearray(), 0
    async for piece in chunks:
        buf += piece
        while True:
            nl = buf.find(b"\n", scan)
            if nl < 0:
                scan = len(buf)
                break
            line = bytes(memoryview(buf)[:nl])
            del buf[:nl + 1]  # O(1): CPython moves a bytearray's start
            scan = 0
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                yield payload


class PolicyBackend:
    def __init__(self, http: httpx.AsyncClient, url: str, *, timeout_s: float = 600.0, api_key: str = ""):
        self.http, self.url, self.timeout_s = http, url.rstrip("/"), timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.declared_mode: str | None = None
        """The server's ``incremental_streaming_output`` ("incremental" / "cumulative"), once read."""
        self._probe: asyncio.Task | None = None

    def _raise_for(self, status: int, body: bytes) -> None:
        text = body.decode("utf-8", "replace")[:500]
        if status == 400:
            try:
                err = codec.loads(text)
                message = err.get("error", {}).get("message") or err.get("message") or text
            except (ValueError, AttributeError):
                message = text
            raise BadRequest(f"policy backend rejected the request: {message}")
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
        try:
            resp = await self.http.post(f"{self.url}/generate", content=codec.dumps(payload),
                                        headers=self._headers(routing_key), timeout=self.timeout_s)
        except httpx.TimeoutException as e:
            raise BackendTimeout(f"policy backend did not answer within {self.timeout_s}s") from e
        except httpx.HTTPError as e:
            raise BackendUnavailable(f"policy backend at {self.url} is unreachable: {e!r}") from e
        if resp.status_code != 200:
            self._raise_for(resp.status_code, resp.content)
        try:
            data = codec.loads(resp.content)
        except codec.DecodeError as e:
            raise BackendUnavailable("policy backend answered non-JSON") from e
        return parse_generate(data, final=True)

    async def generate_stream(self, payload: dict[str, Any], routing_key: str | None = None
                              ) -> AsyncIterator[GenerateResult]:
        """Yield the growing result after each chunk; the last one has a finish_reason."""
        if self._probe is None:  # once, in the background: never delays a request
            self._probe = asyncio.get_running_loop().create_task(self.read_stream_mode())
        body = codec.dumps({**payload, "stream": True})
        try:
            async with self.http.stream("POST", f"{self.url}/generate", content=body,
                                        headers=self._headers(routing_key), timeout=self.timeout_s) as resp:
                if resp.status_code != 200:
                    self._raise_for(resp.status_code, await resp.aread())
                assembler, last = StreamAssembler(), None
                async for data in sse_payloads(resp.aiter_bytes()):
                    last = assembler.feed(data)
                    yield last
                if last is None or last.finish_reason is None:
                    raise BackendUnavailable("policy backend stream ended without a finish_reason")
        except httpx.TimeoutException as e:
            raise BackendTimeout(f"policy backend stream stalled for {self.timeout_s}s") from e
        except httpx.HTTPError as e:
            raise BackendUnavailable(f"policy backend stream failed: {e!r}") from e
