"""CPU of the proxy's stream reading alone, in-process: HTTP chunk framing, SSE events, assembly.

A synthetic SGLang ``/generate`` stream (one event per HTTP chunk, as SGLang's uvicorn writes them) is
fed to ``rawstream.StreamConnection`` in reads of ``--read-kb`` (the bytes are written into the buffer
the connection offers, as the kernel would), and after each read ``SSEReader`` and ``StreamAssembler``
take what it completed, as ``PolicyBackend`` does without gathering. Only that work is timed
(``time.process_time``; building the stream and writing it into the buffer, the kernel's part, are
not), so the per-token figures show how the proxy's own reading scales with the reply length. The best of ``--repeats`` runs.

    python scripts/bench_stream_parse.py --modes cumulative,incremental --lengths 512,2048,8192
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator

from openclaw_rl.backend import PolicyBackend, SSEReader, StreamAssembler
from openclaw_rl.rawstream import StreamConnection

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def events(n: int, cumulative: bool) -> Iterator[bytes]:
    """SGLang-shaped chunks (key order of SGLang 0.5.23) for an ``n``-token reply."""
    text, ids, triples = [], [], []
    for k in range(1, n + 1):
        tok = 100 + (k * 37) % 1500
        ids.append(str(tok))
        triples.append(f"[-{0.001 * (k % 997) + 0.5:.6f},{tok},null]")
        text.append(f"w{k % 10} ")
        finish = f'{{"type":"length","length":{n}}}' if k == n else "null"
        t, i, lp = ("".join(text), ",".join(ids), ",".join(triples)) if cumulative else (text[-1], ids[-1], triples[-1])
        yield (f'{{"text":"{t}","output_ids":[{i}],"meta_info":{{"id":"e81609ecbaf04060801e70310df98db4",'
               f'"finish_reason":{finish},"prompt_tokens":26,"weight_version":"default","num_retractions":0,'
               f'"output_token_logprobs":[{lp}],"output_token_logprobs_length":{k},"reasoning_tokens":0,'
               f'"completion_tokens":{k},"cached_tokens":25,"cached_tokens_details":{{"device":25,"host":0}},'
               '"dp_rank":null}}').encode()


def run(n: int, cumulative: bool, read: int) -> float:
    conn = StreamConnection()
    conn.sse = True
    # SSEReader(conn.body): the reader before the in-place buffer, to run this on an export of an older commit
    reader, asm = SSEReader(conn) if hasattr(conn, "consumed") else SSEReader(conn.body), StreamAssembler()
    spent, pending, last = 0.0, bytearray(HEAD), None

    def feed(piece: bytes) -> None:
        nonlocal spent, last
        pos, mv, copying = 0, memoryview(piece), 0.0
        t0 = time.process_time()  # one CPU-clock pair per read (a CPU clock read is a syscall)
        while pos < len(piece):
            view = conn.get_buffer(-1)
            k = min(len(view), len(piece) - pos)
            c0 = time.perf_counter()
            view[:k] = mv[pos:pos + k]  # the kernel's copy: not counted
            copying += time.perf_counter() - c0
            del view
            conn.buffer_updated(k)
            pos += k
        last = PolicyBackend._feed(reader, asm) or last
        conn.superseded = asm.mode == "cumulative"
        reader.consume()
        spent += time.process_time() - t0 - copying

    for event in events(n, cumulative):
        payload = b"data: " + event + b"\n\n"
        pending += b"%x\r\n" % len(payload) + payload + b"\r\n"
        while len(pending) >= read:
            feed(bytes(pending[:read]))
            del pending[:read]
    feed(bytes(pending) + b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
    if not (reader.done and last is not None and last.finish_reason == "length" and len(last.output_ids) == n):
        raise SystemExit(f"stream of {n} tokens not read whole")
    return spent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="cumulative,incremental")
    p.add_argument("--lengths", default="512,2048,8192")
    p.add_argument("--read-kb", type=int, default=256)
    p.add_argument("--repeats", type=int, default=1)
    ns = p.parse_args()
    for mode in ns.modes.split(","):
        per = {}
        for n in map(int, ns.lengths.split(",")):
            spent = min(run(n, mode == "cumulative", ns.read_kb * 1024) for _ in range(ns.repeats))
            per[n] = spent / n * 1e6
            print(f"{mode:>11} {n:>6} tokens: {spent * 1e3:8.1f} ms, {per[n]:6.2f} us/token", flush=True)
        if len(per) > 1:
            lo, hi = min(per), max(per)
            print(f"{mode:>11} per token at {hi} / at {lo}: {per[hi] / per[lo]:.2f}")


if __name__ == "__main__":
    main()
