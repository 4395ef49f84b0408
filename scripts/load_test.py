#!/usr/bin/env python
"""Full-size load test on loopback: 200 sessions x 10 turns through the proxy with the judge on (m=3).

Starts the scripted SGLang-compatible policy and judge and the proxy in this process, drives them, and
prints the figures: errors, samples lost or duplicated, per-session order, latency, turns/s, and what is
left in memory after the idle sessions expire. Two hostile cases run alongside when asked:

* ``--slow-clients N``: N slowloris sockets (a request line, then one header line every 0.5 s, never a
  complete head) are open during the load; reports how many the header deadline dropped and when.
* ``--big-request``: the largest request the proxy accepts (just under the body limit, at the message
  limit) is sent during the load while ``/healthz`` is polled every 50 ms; reports its latency.

The attacks of issue #27 run instead, one flag each, against ``openclaw-rl serve`` in front of
``openclaw-rl mock-sglang`` as separate processes (``openclaw_rl/bench/attacks.py``), with a bystander of
``--sessions`` x ``--turns`` (default 8 x 6) on its own key and address; each prints turns acknowledged vs
saved in the spool, bystander ok / failed and latency p50 / max, and the load average:

* ``--slow-body-flood N`` / ``--idle-flood N``: N sockets from ``--attack-addresses K`` addresses
  (127.0.0.2 …) that drip their body (1 byte / 2 s) or send nothing, reopened when the proxy closes them;
* ``--disk-full KB``: the spool on a KB tmpfs (root and ``mount``), else, after a third of the turns,
  RLIMIT_FSIZE on the running serve (prlimit) at its largest spool file + KB;
* ``--delete-spool``: the spool files removed after a third of the turns;
* ``--two-proxies``: a second serve on the same spool dir, sessions split between them;
* ``--huge-policy-body MB`` / ``--huge-judge-body MB``: the mock pads each /generate body to that size;
* ``--mismatch-text``: the policy mock's text differs from its output ids;
* ``--sigkill N``: N SIGKILLs of serve at random moments, restarted on the same port and spool; the
  bystander retries each turn up to ``--attempts`` (10) times.
``--serve-arg=--max-connections=512`` (repeatable) passes flags to serve, e.g. to compare limits.

Usage: .venv/bin/python scripts/load_test.py [--sessions N] [--turns T] [--slow-clients N] [--big-request]
       .venv/bin/python scripts/load_test.py --slow-body-flood 600 [--attack-addresses 1] [--serve-arg=...]
Everything is bounded in count and time and binds to 127.0.0.0/8 only.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from support import judge_reply, policy_reply, scripted_server  # noqa: E402

from openclaw_rl.bench.load import run_load  # noqa: E402
from openclaw_rl.config import load_settings  # noqa: E402
from openclaw_rl.embedded.tiny_model import ensure_tiny_model  # noqa: E402
from openclaw_rl.listener import uvicorn_config  # noqa: E402
from openclaw_rl.server import Proxy  # noqa: E402
from openclaw_rl.servers import KEEP_ALIVE_S, free_port  # noqa: E402
from openclaw_rl.turns import Turn  # noqa: E402

HEADER_TIMEOUT_S = 2.0


class GuardedServer:
    """The proxy served as `openclaw-rl serve` serves it (header deadline, connection cap), on a thread."""

    def __init__(self, proxy: Proxy):
        self.port = free_port()
        p = proxy.settings.proxy
        config = uvicorn_config(proxy.app, host="127.0.0.1", port=self.port, header_timeout_s=HEADER_TIMEOUT_S,
                                max_connections=p.max_connections, max_header_bytes=p.max_header_bytes,
                                keep_alive_s=KEEP_ALIVE_S, log_level="warning", access_log=False,
                                on_drop=lambda why: proxy.metrics.slow_clients.labels(why).inc())
        self.server = uvicorn.Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.server.serve())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> GuardedServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def slowloris(port: int, n: int, stop: threading.Event, out: dict) -> None:
    """Open ``n`` sockets that never finish their request head; record when the server drops them."""
    socks, opened = [], time.monotonic()
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            s.setblocking(False)
            socks.append(s)
        except OSError:
            out["refused"] = out.get("refused", 0) + 1
    dropped_at: list[float] = []
    alive, line = list(socks), 0
    deadline = time.monotonic() + 60
    while alive and not stop.is_set() and time.monotonic() < deadline:
        still = []
        for s in alive:
            try:
                if s.recv(1) == b"":
                    raise ConnectionResetError
                still.append(s)
            except BlockingIOError:
                try:
                    s.sendall(b"X-Drip-%d: 1\r\n" % line)
                    still.append(s)
                except OSError:
                    dropped_at.append(time.monotonic() - opened)
            except OSError:
                dropped_at.append(time.monotonic() - opened)
        alive, line = still, line + 1
        stop.wait(0.5)
    for s in socks:
        s.close()
    out.update(opened=len(socks), dropped=len(dropped_at), still_open=len(alive),
               last_drop_s=max(dropped_at) if dropped_at else None)


def big_request_probes(url: str, sizes: list[int], max_messages: int, out: list) -> None:
    for size in sizes:
        out.append({})
        big_request_probe(url, size, max_messages, out[-1])


def big_request_probe(url: str, max_body: int, max_messages: int, out: dict) -> None:
    """Send the largest request of ``max_body`` bytes while polling /healthz; record both."""
    def encode(chars: int) -> bytes:
        return json.dumps({"messages": [{"role": "user", "content": "w " * (chars // 2)}] * max_messages,
                           "max_tokens": 8}).encode()
    per = (max_body - len(encode(0)) - 64) // max_messages  # content characters per message that still fit
    body = encode(per)
    assert len(body) <= max_body, len(body)
    result: dict = {}

    def send() -> None:
        start = time.perf_counter()
        try:
            r = httpx.post(f"{url}/v1/chat/completions", content=body, timeout=600,
                           headers={"content-type": "application/json", "X-Session-Id": "big"})
            result.update(status=r.status_code, code=r.json().get("error", {}).get("code") if r.status_code != 200
                          else None)
        except httpx.HTTPError as e:
            result.update(status=type(e).__name__)
        result["seconds"] = time.perf_counter() - start

    sender = threading.Thread(target=send)
    sender.start()
    health: list[float] = []
    with httpx.Client(timeout=60) as client:
        while sender.is_alive() and len(health) < 20_000:
            start = time.perf_counter()
            client.get(f"{url}/healthz")
            health.append(time.perf_counter() - start)
            time.sleep(0.05)
    sender.join()
    health.sort()
    out.update(body_bytes=len(body), messages=max_messages, **result, healthz_polls=len(health),
               healthz_p50_ms=1000 * health[len(health) // 2] if health else None,
               healthz_max_ms=1000 * health[-1] if health else None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=None, help="200 (an attack: 8)")
    ap.add_argument("--turns", type=int, default=None, help="10 (an attack: 6)")
    ap.add_argument("--slow-clients", type=int, default=0, help="slowloris sockets open during the load")
    ap.add_argument("--big-request", action="store_true", help="send the largest accepted request during the load")
    attack = ap.add_argument_group("attacks (issue #27): serve + mock-sglang processes, one flag each")
    attack.add_argument("--slow-body-flood", type=int, default=0, metavar="N", help="sockets dripping their body")
    attack.add_argument("--idle-flood", type=int, default=0, metavar="N", help="idle sockets, reopened when closed")
    attack.add_argument("--attack-addresses", type=int, default=1, metavar="K", help="flood from 127.0.0.2 … (1)")
    attack.add_argument("--disk-full", type=int, default=0, metavar="KB", help="spool on a KB-sized place")
    attack.add_argument("--disk-full-how", choices=["auto", "tmpfs", "rlimit"], default="auto",
                        help="auto: a tmpfs when root and mount work, else RLIMIT_FSIZE")
    attack.add_argument("--delete-spool", action="store_true", help="rm the spool files after a third of the turns")
    attack.add_argument("--two-proxies", action="store_true", help="two serve processes on one spool dir")
    attack.add_argument("--huge-policy-body", type=float, default=0, metavar="MB", help="pad policy /generate bodies")
    attack.add_argument("--huge-judge-body", type=float, default=0, metavar="MB", help="pad judge /generate bodies")
    attack.add_argument("--mismatch-text", action="store_true", help="policy text differs from its output ids")
    attack.add_argument("--sigkill", type=int, default=0, metavar="N", help="SIGKILL serve N times (restarted)")
    attack.add_argument("--attempts", type=int, default=None, help="tries per bystander turn (1; --sigkill: 10)")
    attack.add_argument("--bystander-seconds", type=float, default=None,
                        help="spread each bystander session over this long (floods: 30 s, others: 20 s)")
    attack.add_argument("--request-timeout", type=float, default=10.0, help="per bystander request (10 s)")
    attack.add_argument("--serve-arg", action="append", default=[], help="extra serve flag (repeatable)")
    ns = ap.parse_args()
    if any((ns.slow_body_flood, ns.idle_flood, ns.disk_full, ns.delete_spool, ns.two_proxies, ns.huge_policy_body,
            ns.huge_judge_body, ns.mismatch_text, ns.sigkill)):
        return run_one_attack(ns)
    ns.sessions, ns.turns = ns.sessions or 200, ns.turns or 10
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ensure_tiny_model())
    spool = tempfile.mkdtemp(prefix="load-spool-")
    slow_out: dict = {}
    big_out: list = []
    with scripted_server(tok, policy_reply) as policy, scripted_server(tok, judge_reply) as judge:
        settings = load_settings({"proxy_policy_url": policy.url, "judge_url": judge.url, "judge_votes": 3,
                                  "judge_max_new_tokens": 256, "spool_dir": spool, "proxy_session_ttl_s": 3600}, env={})
        proxy = Proxy.build(settings, tokenizer=tok)
        with GuardedServer(proxy) as server:
            stop = threading.Event()
            hostile = []
            if ns.slow_clients:
                hostile.append(threading.Thread(target=slowloris, args=(server.port, ns.slow_clients, stop, slow_out)))
            if ns.big_request:
                # the largest body accepted (refused before rendering: it cannot fit the context), then the
                # largest that passes that bound and is rendered and tokenised (on the render threads)
                p, svc = settings.proxy, proxy.service
                renderable = int(0.95 * svc.context_length * svc.max_token_bytes) if svc.context_length else 0
                sizes = [p.max_body_bytes] + ([renderable] if 0 < renderable < p.max_body_bytes else [])
                hostile.append(threading.Thread(target=big_request_probes,
                                                args=(server.url, sizes, p.max_messages, big_out)))
            for t in hostile:
                t.start()
            report = asyncio.run(run_load(server.url, sessions=ns.sessions, turns=ns.turns))
            for t in hostile:
                t.join(600)
            stop.set()
            expected = ns.sessions * (ns.turns - 1)
            proxy.spool.wait_ready(expected, 300)
            proxy.writer.flush()
            samples = list(proxy.spool.iter_samples())
            keys = [(s.session_id, s.turn) for s in samples]
            ordered = all([s.turn for s in samples if s.session_id == f"load-{i}"] == list(range(1, ns.turns))
                          for i in range(ns.sessions))
            expired = asyncio.run_coroutine_threadsafe(_sweep(proxy), server.loop).result(60)
            deadline = time.time() + 60
            while proxy.tracker.unsettled_turns and time.time() < deadline:
                time.sleep(0.05)
            proxy.writer.flush()
            gc.collect()
            left = sum(type(o) is Turn for o in gc.get_objects())
    print(f"sessions x turns      {ns.sessions} x {ns.turns} (judge m=3)")
    print(f"requests ok / errors  {report.ok} / {dict(report.errors) or 0}")
    print(f"turns/s               {report.turns_per_s:.1f}")
    print(f"latency p50/p95/p99   {report.percentile(.5)*1000:.1f} / {report.percentile(.95)*1000:.1f} / "
          f"{report.percentile(.99)*1000:.1f} ms")
    print(f"samples               {len(keys)} of {expected} expected; duplicates {len(keys) - len(set(keys))}; "
          f"lost {expected - len(set(keys))}; per-session order {'ok' if ordered else 'BROKEN'}")
    print(f"after idle expiry     {expired} sessions flushed; {len(proxy.tracker.sessions)} tracked; "
          f"{left} Turn objects in memory")
    ok = not report.errors and len(set(keys)) == expected == len(keys) and ordered and left == 0
    if ns.slow_clients:
        print(f"slow clients          {slow_out.get('opened')} slowloris sockets opened; {slow_out.get('dropped')} "
              f"dropped by the {HEADER_TIMEOUT_S:g} s header deadline (last after {slow_out.get('last_drop_s') or 0:.1f} s); "
              f"{slow_out.get('still_open')} still open")
        ok = ok and slow_out.get("still_open") == 0
    for big in big_out:
        print(f"big request           {big['body_bytes'] / 1e6:.2f} MB, {big['messages']} messages → "
              f"{big.get('status')} {big.get('code') or ''} after {big.get('seconds', 0):.1f} s")
        print(f"  /healthz meanwhile  {big['healthz_polls']} polls, p50 {big['healthz_p50_ms'] or 0:.1f} ms, "
              f"max {big['healthz_max_ms'] or 0:.1f} ms")
    return 0 if ok else 1


def run_one_attack(ns: argparse.Namespace) -> int:
    from openclaw_rl.bench.attacks import AttackConfig, print_report, run_attack

    cfg = AttackConfig(sessions=ns.sessions or 8, turns=ns.turns or 6, timeout_s=ns.request_timeout,
                       attempts=ns.attempts or (10 if ns.sigkill else 1), slow_body=ns.slow_body_flood,
                       idle=ns.idle_flood, addresses=ns.attack_addresses, disk_full_kb=ns.disk_full,
                       disk_full_how=ns.disk_full_how,
                       delete_spool=ns.delete_spool, two_proxies=ns.two_proxies, huge_policy_mb=ns.huge_policy_body,
                       huge_judge_mb=ns.huge_judge_body, mismatch_text=ns.mismatch_text, sigkill=ns.sigkill,
                       serve_args=ns.serve_arg, seconds=ns.bystander_seconds if ns.bystander_seconds is not None
                       else 30.0 if ns.slow_body_flood or ns.idle_flood else 20.0)
    if cfg.slow_body and cfg.idle:
        print("one flood at a time: --slow-body-flood or --idle-flood", file=sys.stderr)
        return 2
    print_report(run_attack(str(ensure_tiny_model()), cfg))
    return 0


async def _sweep(proxy: Proxy) -> int:
    return proxy.tracker.sweep(now=float("inf"))


if __name__ == "__main__":
    sys.exit(main())
