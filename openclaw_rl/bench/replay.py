"""The bench's "direct" baseline: the policy mock's own bytes, served again by a lean HTTP server.

Stage: bench only (stands where SGLang stands: engine). The policy mock (``mock-sglang``: Starlette, the
scripted engine, log-probs per token) spends ~7 ms of CPU per turn building its answer, so "direct to the
mock" measured the mock, not a floor: 131 turns/s at c=1 where the same bytes from a plain server go at
~1,150, and the proxy read as 0.35 of direct instead of ~0.04-0.09. This server answers each request body
with the bytes the mock answered it with (asked once, on the first sight of that body, by ``prime`` before
any timing), from raw asyncio streams, so direct costs what an engine's HTTP answer costs and nothing else.

Pacing (``POST /bench/latency`` with ``ttft_ms`` and ``tokens_per_s``, the mock's knobs) sends a stream's
events at the times a model would produce them (the first after ``ttft_ms``, each next one when its
``completion_tokens`` are generated) and a plain reply after all of them: a zero-latency stream arrives in
a few reads and understates what streaming costs the proxy. ``reply_tokens`` or ``incremental`` in that
call change the mock's answers, so they empty the cache (send them to both).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from openclaw_rl.bench.loadclient import LoadClient


@dataclass
class Answer:
    content_type: str
    events: list[bytes]  # the whole body (one item), or a stream's events each with its "\n\n"
    tokens: list[int]  # completion tokens reached by each event (pacing)


@dataclass
class Replay:
    upstream: str
    ttft_s: float = 0.0
    tokens_per_s: float = 0.0
    cache: dict[bytes, Answer] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0

    async def answer(self, load: LoadClient, path: str, body: bytes) -> Answer:
        key = hashlib.sha256(path.encode() + b"\0" + body).digest()
        found = self.cache.get(key)
        if found is not None:
            self.hits += 1
            return found
        self.misses += 1
        raw = await load.post(f"{self.upstream}{path}", body, {"content-type": "application/json"})
        stream = bool(json.loads(body).get("stream"))
        events = [e + b"\n\n" for e in raw.split(b"\n\n") if e.strip()] if stream else [raw]
        tokens = [_completion_tokens(e) for e in events]
        for i in range(1, len(tokens)):  # [DONE] and the like carry none: they come with the one before
            tokens[i] = max(tokens[i], tokens[i - 1])
        answer = Answer("text/event-stream" if stream else "application/json", events, tokens)
        self.cache[key] = answer
        return answer

    def latency(self, body: dict[str, Any]) -> dict[str, Any]:
        self.ttft_s = max(0.0, float(body.get("ttft_ms", self.ttft_s * 1000.0))) / 1000.0
        self.tokens_per_s = max(0.0, float(body.get("tokens_per_s", self.tokens_per_s)))
        if body.get("reply_tokens") is not None or body.get("incremental") is not None:
            self.cache.clear()  # the mock answers differently now
        return {"ttft_ms": self.ttft_s * 1000.0, "tokens_per_s": self.tokens_per_s, "cached": len(self.cache),
                "hits": self.hits, "misses": self.misses}

    def due(self, start: float, tokens: int) -> float:
        """When a model would have produced ``tokens`` tokens of an answer asked for at ``start``."""
        rate = tokens / self.tokens_per_s if self.tokens_per_s else 0.0
        return start + self.ttft_s + rate


def _completion_tokens(event: bytes) -> int:
    text = event[5:].strip() if event.startswith(b"data:") else event
    try:
        return int(json.loads(text)["meta_info"]["completion_tokens"])
    except (ValueError, KeyError, TypeError):
        return 0


async def _send(writer: asyncio.StreamWriter, status: str, content_type: str, body: bytes) -> None:
    writer.write(f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
                 .encode("latin-1") + body)
    await writer.drain()


async def _answer(replay: Replay, writer: asyncio.StreamWriter, answer: Answer, start: float) -> None:
    paced = replay.ttft_s > 0 or replay.tokens_per_s > 0
    if answer.content_type != "text/event-stream":
        if paced:
            await asyncio.sleep(max(0.0, replay.due(start, answer.tokens[-1]) - time.perf_counter()))
        await _send(writer, "200 OK", answer.content_type, answer.events[0])
        return
    if not paced:
        await _send(writer, "200 OK", answer.content_type, b"".join(answer.events))
        return
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for event, tokens in zip(answer.events, answer.tokens):
        await asyncio.sleep(max(0.0, replay.due(start, max(tokens - 1, 0)) - time.perf_counter()))
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _client(replay: Replay, load: LoadClient, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            start = time.perf_counter()
            lines = head.decode("latin-1").split("\r\n")
            method, path = lines[0].split(" ")[:2]
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = await reader.readexactly(length) if length else b""
            if method == "GET" and path in ("/health", "/healthz"):
                await _send(writer, "200 OK", "application/json", b"{}")
            elif path == "/bench/latency":
                await _send(writer, "200 OK", "application/json", json.dumps(replay.latency(json.loads(body))).encode())
            elif method == "POST":
                await _answer(replay, writer, await replay.answer(load, path, body), start)
            else:
                await _send(writer, "404 Not Found", "application/json", b'{"error": "not found"}')
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve(host: str, port: int, upstream: str) -> None:
    replay = Replay(upstream)
    async with LoadClient(300.0) as load:
        server = await asyncio.start_server(lambda r, w: _client(replay, load, r, w), host, port, backlog=1024)
        async with server:
            await server.serve_forever()


async def prime(load: LoadClient, url: str, bodies: Iterable[bytes], path: str = "/generate") -> int:
    """Ask the replay server for each body once, so no timed request is its first (which the mock answers)."""
    n = 0
    for body in dict.fromkeys(bodies):
        await load.post(f"{url}{path}", body, {"content-type": "application/json"})
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="the policy mock whose answers are replayed")
    ns = p.parse_args(argv)
    asyncio.run(serve(ns.host, ns.port, ns.upstream))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
