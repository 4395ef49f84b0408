"""Client of the policy's SGLang native ``/generate`` (token ids in, token ids + log-probs out).

Stage: serving → **backend** → SGLang. One pooled ``httpx.AsyncClient`` for the life of the proxy
(upstream built a new client, and loaded the TLS CA bundle, on every call). Every failure becomes a
typed error: unreachable or garbage → 502, slow → 504, SGLang's own 400 (e.g. context too long) → 400
with SGLang's message. Responses are validated: ids and log-prob triples must align, or it is a 502.
Streaming follows SGLang's cumulative chunk semantics (each chunk holds everything so far).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from .errors import BackendTimeout, BackendUnavailable, BadRequest, ContextLengthExceeded


@dataclass(slots=True)
class GenerateResult:
    """One /generate answer (final, or a cumulative streaming snapshot)."""

    text: str
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None  # None while streaming; "stop" | "length" | "abort" at the end
    prompt_tokens: int
    weight_version: str | None


def parse_generate(data: Any, *, final: bool) -> GenerateResult:
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict):
        raise BackendUnavailable("policy backend answered an unexpected JSON shape")
    if "error" in data:
        err = data["error"]
        message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        raise BadRequest(f"policy backend rejected the request: {message}")
    try:
        meta = data["meta_info"]
        ids = [int(t) for t in data["output_ids"]]
        triples = meta.get("output_token_logprobs") or []
        logprobs = [float(t[0]) for t in triples]
        if [int(t[1]) for t in triples] != ids:
            raise BackendUnavailable("policy backend log-probs do not match its output ids (return_logprob off?)")
        fr = meta.get("finish_reason")
        finish = fr.get("type") if isinstance(fr, dict) else fr
        if final and finish is None:
            raise BackendUnavailable("policy backend ended without a finish_reason")
        version = meta.get("weight_version")
        segments = meta.get("weight_versions") or []
        if len(segments) > 1:  # the weights changed mid-generation: no single version produced it
            version = "mixed:" + ",".join(str(seg.get("version")) for seg in segments if isinstance(seg, dict))
        return GenerateResult(str(data.get("text", "")), ids, logprobs, finish, int(meta.get("prompt_tokens", 0)),
                              version)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise BackendUnavailable(f"policy backend answered malformed /generate output: {e!r}") from e


class PolicyBackend:
    def __init__(self, http: httpx.AsyncClient, url: str, *, timeout_s: float = 600.0, api_key: str = ""):
        self.http, self.url, self.timeout_s = http, url.rstrip("/"), timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _raise_for(self, status: int, body: bytes) -> None:
        text = body.decode("utf-8", "replace")[:500]
        if status == 400:
            try:
                err = json.loads(text)
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
        return {**self.headers, "X-SMG-Routing-Key": routing_key} if routing_key else self.headers

    async def generate(self, payload: dict[str, Any], routing_key: str | None = None) -> GenerateResult:
        try:
            resp = await self.http.post(f"{self.url}/generate", json=payload, headers=self._headers(routing_key),
                                        timeout=self.timeout_s)
        except httpx.TimeoutException as e:
            raise BackendTimeout(f"policy backend did not answer within {self.timeout_s}s") from e
        except httpx.HTTPError as e:
            raise BackendUnavailable(f"policy backend at {self.url} is unreachable: {e!r}") from e
        if resp.status_code != 200:
            self._raise_for(resp.status_code, resp.content)
        try:
            data = resp.json()
        except ValueError as e:
            raise BackendUnavailable("policy backend answered non-JSON") from e
        return parse_generate(data, final=True)

    async def generate_stream(self, payload: dict[str, Any], routing_key: str | None = None
                              ) -> AsyncIterator[GenerateResult]:
        """Yield cumulative snapshots; the last one has a finish_reason."""
        body = {**payload, "stream": True}
        try:
            async with self.http.stream("POST", f"{self.url}/generate", json=body, headers=self._headers(routing_key),
                                        timeout=self.timeout_s) as resp:
                if resp.status_code != 200:
                    self._raise_for(resp.status_code, await resp.aread())
                last: GenerateResult | None = None
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        obj = json.loads(data)
                    except ValueError as e:
                        raise BackendUnavailable("policy backend streamed non-JSON") from e
                    last = parse_generate(obj, final=False)
                    yield last
                if last is None or last.finish_reason is None:
                    raise BackendUnavailable("policy backend stream ended without a finish_reason")
        except httpx.TimeoutException as e:
            raise BackendTimeout(f"policy backend stream stalled for {self.timeout_s}s") from e
        except httpx.HTTPError as e:
            raise BackendUnavailable(f"policy backend stream failed: {e!r}") from e


# --- value range checks (kept apart from parsing) ------------------------------------------------------

def check_output_values(result: GenerateResult, vocab_size: int) -> str | None:
    """Why a final /generate answer cannot be trained on (None if it can): every id inside the
    vocabulary (which also makes it fit a 32-bit token array), every log-prob a finite number ≤ 0."""
    for i, t in enumerate(result.output_ids):
        if not 0 <= t < vocab_size:
            return f"output id {t} at position {i} is outside the vocabulary of {vocab_size}"
    for i, lp in enumerate(result.logprobs):
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
