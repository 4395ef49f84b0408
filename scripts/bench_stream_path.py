"""The proxy's per-event data path warm, in one process, without sockets (issue #33 item 3): what the code
itself costs, apart from waking up for each event.

A streamed 512-token reply of the policy mock (incremental, ``--interval`` tokens an event) is captured
once over loopback, then fed chunk by chunk, one read per HTTP chunk, through what the proxy runs for it:
``StreamConnection`` (de-chunking in place), ``SSEReader`` + ``StreamAssembler`` (decode and checks, one
snapshot per ``--per-snapshot`` events, as the paced bench's gathering gives), ``IdsText`` (the text-of-ids
check), the streaming output parser and ``ChunkBytes``. Prints µs per event by stage, the best of
``--batches`` batches of ``--streams`` streams, beside the floor relay's per-event Python (de-chunk, orjson,
one chunk built). A benchmark: nothing asserted. Run it under another checkout with
``PYTHONPATH=DIR python scripts/bench_stream_path.py`` to compare. Usage:
``python scripts/bench_stream_path.py [--interval 8] [--per-snapshot 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson  # noqa: E402

from openclaw_rl.bench import mock  # noqa: E402
from openclaw_rl.capped import StreamBudget  # noqa: E402
from openclaw_rl.chat import ChatRenderer  # noqa: E402
from openclaw_rl.idstext import IdsText  # noqa: E402
from openclaw_rl.parsers import OutputParser  # noqa: E402
from openclaw_rl.rawstream import StreamConnection  # noqa: E402
from openclaw_rl.servers import free_port  # noqa: E402
from openclaw_rl.serving import ChunkBytes  # noqa: E402
from openclaw_rl.sglang_stream import SSEReader, StreamAssembler  # noqa: E402


async def capture(tokenizer_dir: str, case: mock.Case, interval: int) -> bytes:
    """One streamed ``/generate`` answer of a fresh policy mock, as bytes on the wire (head and chunks)."""
    port = free_port(mock.HOST)
    proc = subprocess.Popen([sys.executable, "-m", "openclaw_rl.cli", "--log-level", "WARNING", "mock-sglang",
                             "--tokenizer", tokenizer_dir, "--port", str(port), "--reply-tokens", "512",
                             "--incremental-streaming-output"], start_new_session=True)
    try:
        for _ in range(400):
            try:
                reader, writer = await asyncio.open_connection(mock.HOST, port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        else:
            raise RuntimeError("the policy mock did not start")
        body = mock.generate_body(case, 511, True, interval)
        writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        raw = b""
        while not raw.endswith(b"\r\n0\r\n\r\n"):
            piece = await reader.read(1 << 20)
            if not piece:
                break
            raw += piece
        writer.close()
        return raw
    finally:
        proc.terminate()
        proc.wait()


def split(raw: bytes) -> tuple[bytes, list[bytes]]:
    """(head, the HTTP chunks with their framing, the last one included)."""
    i = raw.index(b"\r\n\r\n") + 4
    head, body, chunks, pos = raw[:i], raw[i:], [], 0
    while pos < len(body):
        nl = body.index(b"\r\n", pos)
        end = nl + 2 + int(body[pos:nl], 16) + 2
        chunks.append(body[pos:end])
        pos = end
    return head, chunks


def one_stream(head: bytes, chunks: list[bytes], prompt: list[int], renderer: ChatRenderer, parser: OutputParser,
               per_snapshot: int, t: dict[str, float]) -> None:
    conn = StreamConnection()
    conn.sse = True

    def deliver(data: bytes) -> None:
        view = conn.get_buffer(-1)
        view[:len(data)] = data
        conn.buffer_updated(len(data))

    deliver(head)
    reader, asm, budget = SSEReader(conn), StreamAssembler(), StreamBudget(1 << 30)
    ids_text, out = IdsText(renderer.decoder(True), prompt), ChunkBytes("chatcmpl-x", "policy", 1)
    stream_parser = parser.streaming(True, False)
    clock = time.perf_counter
    for k, chunk in enumerate(chunks):
        a = clock()
        deliver(chunk)
        t["read"] += clock() - a
        if (k + 1) % per_snapshot and k != len(chunks) - 1:
            continue
        a = clock()
        spans = reader.push()
        budget.events(spans, asm.mode == "cumulative")
        snap = asm.feed_many(reader.buf, spans)
        reader.consume()
        conn.fresh = False
        b = clock()
        t["decode+checks"] += b - a
        if snap is None:
            continue
        text = ids_text.update(snap.output_ids)
        if not text.startswith(snap.text):
            raise RuntimeError("the mock's text is not the text of its ids")
        c = clock()
        deltas = stream_parser.feed(snap.text)
        d = clock()
        out.deltas(deltas)
        e = clock()
        t["ids-text"] += c - b
        t["parser"] += d - c
        t["chunk bytes"] += e - d


def floor_stream(chunks: list[bytes]) -> None:
    """The floor relay's Python per event (stream_floor.py): de-chunk, decode, keep the log-probs, one chunk."""
    logprobs: list[float] = []
    for chunk in chunks:
        nl = chunk.index(b"\r\n")
        data = bytearray(chunk[nl + 2:nl + 2 + int(chunk[:nl], 16)])
        start = data.find(b"data: {")
        if start < 0:
            continue
        obj = orjson.loads(data[start + 6:data.find(b"\n\n", start)])
        meta: dict[str, Any] = obj["meta_info"]
        logprobs += [t[0] for t in meta["output_token_logprobs"]]
        b"prefix" + orjson.dumps({"content": obj["text"]}) + b"suffix"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--interval", type=int, default=8, help="tokens per SGLang stream event")
    p.add_argument("--per-snapshot", type=int, default=2, help="events per snapshot (the gathering window's)")
    p.add_argument("--streams", type=int, default=60)
    p.add_argument("--batches", type=int, default=7)
    ns = p.parse_args()
    from transformers import AutoTokenizer

    tokenizer_dir = str(mock.ensure_tokenizer())
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    case = mock.build_workload(tokenizer, sessions=1, turns=1, max_history_tokens=2048, reply_tokens=64)[0][0]
    head, chunks = split(asyncio.run(capture(tokenizer_dir, case, ns.interval)))
    events = sum(1 for c in chunks if b"data: {" in c)
    renderer = ChatRenderer(tokenizer)
    parser = OutputParser.for_format(renderer.format)
    best: dict[str, float] | None = None
    for _ in range(ns.batches):
        t = dict.fromkeys(("read", "decode+checks", "ids-text", "parser", "chunk bytes"), 0.0)
        for _ in range(ns.streams):
            one_stream(head, chunks, case.ids, renderer, parser, ns.per_snapshot, t)
        t["total"] = sum(t.values())
        best = t if best is None or t["total"] < best["total"] else best
    assert best is not None
    floor = float("inf")
    for _ in range(ns.batches):
        a = time.perf_counter()
        for _ in range(ns.streams):
            floor_stream(chunks)
        floor = min(floor, time.perf_counter() - a)
    per = ns.streams * events
    print(f"{events} events, {ns.per_snapshot} a snapshot; µs per event (best of {ns.batches} × {ns.streams} streams): "
          + ", ".join(f"{k} {v / per * 1e6:.2f}" for k, v in best.items())
          + f"; the floor's Python {floor / per * 1e6:.2f}; load average {os.getloadavg()[0]:.2f}; code from "
          + str(Path(sys.modules["openclaw_rl"].__file__ or "").parent.parent))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
