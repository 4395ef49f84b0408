"""Measure session affinity across two policy engines: prefix-cache reuse and latency per routing policy.

Two embedded engines (``TorchModel``, the tiny h128 model, each with its own prefix cache) serve the same
multi-turn sessions through the real proxy, routed four ways:

* ``proxy-affinity``: ``--policy-url A,B`` (the proxy's rendezvous hashing, no router);
* ``router-manual``: sglang-router ``--policy manual`` (keys on the ``X-SMG-Routing-Key`` the proxy sends);
* ``router-round-robin`` and ``router-cache-aware`` (sglang-router's default policy).

Every session opens with the same shared head (a long system prompt, as OpenClaw's), then its own facts,
and grows by one long user message (a tool result) and a reply a turn. Between policies both engines' caches are flushed and
their counters reset. Printed per policy: the share of prompt tokens served from an engine's prefix cache
(reused / sent), lookups that hit, requests per engine, and the mean / p50 / p90 seconds per turn; and the
router's own hop (tiny ``/generate`` calls through the router vs straight to an engine). Needs the
``router`` extra (``pip install -e .[router]``); without it only ``proxy-affinity`` runs.

    python scripts/bench_router_affinity.py [--sessions 8] [--turns 4] [--head-words 200] [--session-words 400] [--turn-words 200] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openclaw_rl.servers import BackgroundServer, free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "tired", "wizards", "quietly", "box", "amber", "jugs", "of", "liquid", "vodka", "near", "the", "old", "harbour", "at", "dawn"]


def text(n: int, seed: int) -> str:
    return " ".join(WORDS[(i * 7 + seed * 13) % len(WORDS)] + ("." if i % 11 == 10 else "") for i in range(n))


def counted(core: Any) -> Any:
    generate = core.generate
    core.bench_requests = 0

    def wrapper(prompt_ids: Any, sampling: Any) -> Any:
        core.bench_requests += 1
        return generate(prompt_ids, sampling)
    return wrapper


def start_engines(model_dir: Path, n: int = 2) -> list[tuple[BackgroundServer, Any]]:
    from transformers import AutoTokenizer

    from openclaw_rl.engine.server import make_engine_app
    from openclaw_rl.engine.torch_core import TorchModel

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for i in range(n):
        core = TorchModel.from_pretrained(model_dir, max_batch=4, seed=i, tokenizer_vocab_size=len(tokenizer))
        core.generate = counted(core)  # requests per engine: the prefix cache counts only lookups it could try
        app = make_engine_app(core, tokenizer, served_model_name="tiny", model_path=str(model_dir))
        out.append((BackgroundServer(app).start(), core))
    return out


def start_router(worker_urls: list[str], policy: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *worker_urls, "--policy", policy, "--prometheus-port", str(free_port()),
            "--log-level", "warn", "--health-check-interval-secs", "5"]
    if policy == "manual":
        args += ["--assignment-mode", "min_group"]  # a new key goes to the worker holding the fewest keys
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            workers = httpx.get(f"{url}/workers", timeout=2).json().get("workers", [])
            if len(workers) == len(worker_urls) and all(w.get("is_healthy") for w in workers):
                return proc, url
        except (httpx.HTTPError, ValueError):
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"sglang-router exited with {proc.returncode}")
        time.sleep(0.2)
    proc.terminate()
    raise TimeoutError("sglang-router did not list its workers as healthy within 60 s")


def start_proxy(policy_url: str, model_dir: Path, spool: Path) -> tuple[Any, BackgroundServer]:
    from openclaw_rl.config import load_settings
    from openclaw_rl.server import Proxy

    settings = load_settings({"proxy_tokenizer": str(model_dir), "proxy_policy_url": policy_url,
                              "spool_dir": str(spool), "proxy_probe_interval_s": 3600}, env={})
    proxy = Proxy.build(settings)
    return proxy, BackgroundServer(proxy.app).start()


async def drive(url: str, sessions: int, turns: int, head_words: int, session_words: int, turn_words: int,
                new_tokens: int, tag: str) -> tuple[list[float], int]:
    """Each session's turns in order, sessions side by side; (seconds per turn, prompt tokens sent)."""
    head = text(head_words, 0)
    latencies: list[float] = []
    prompt_tokens = 0

    async def session(http: httpx.AsyncClient, s: int) -> None:
        nonlocal prompt_tokens
        messages = [{"role": "system", "content": f"{head}\nSession facts: {text(session_words, s + 1)}"}]
        for t in range(turns):
            messages.append({"role": "user", "content": f"turn {t}: {text(turn_words, s * 31 + t + 100)}"})
            started = time.perf_counter()
            resp = await http.post(f"{url}/v1/chat/completions", headers={"X-Session-Id": f"{tag}-{s}"},
                                   json={"model": "tiny", "messages": messages, "max_tokens": new_tokens})
            latencies.append(time.perf_counter() - started)
            resp.raise_for_status()
            body = resp.json()
            prompt_tokens += body["usage"]["prompt_tokens"]
            messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})

    async with httpx.AsyncClient(timeout=600) as http:
        await asyncio.gather(*(session(http, s) for s in range(sessions)))
    return latencies, prompt_tokens


def reset(engines: list[tuple[BackgroundServer, Any]]) -> None:
    from openclaw_rl.engine.prefix_cache import PrefixStats

    for server, core in engines:
        httpx.post(f"{server.url}/flush_cache", timeout=30).raise_for_status()
        core.prefixes.stats = PrefixStats()
        core.bench_requests = 0


def hop_cost(router_url: str, engine_url: str, calls: int = 40) -> tuple[float, float]:
    """Median seconds of a 1-token /generate straight to an engine and through the router (alternating),
    sent as the proxy sends them (its raw HTTP client, ``rawstream.StreamClient``, connections kept)."""
    from openclaw_rl.rawstream import StreamClient

    body = json.dumps({"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 1}}).encode()
    headers = {"Content-Type": "application/json", "X-SMG-Routing-Key": "hop"}

    async def run() -> tuple[float, float]:
        clients = [StreamClient(engine_url), StreamClient(router_url)]
        times: list[list[float]] = [[], []]
        try:
            for _ in range(calls):
                for client, out in zip(clients, times):
                    started = time.perf_counter()
                    status, _ = await client.request("/generate", body, headers, 60.0)
                    out.append(time.perf_counter() - started)
                    assert status == 200, status
        finally:
            for client in clients:
                client.close()
        return statistics.median(times[0]), statistics.median(times[1])
    return asyncio.run(run())


def run_policy(name: str, policy_url: str, engines: list[tuple[BackgroundServer, Any]], model_dir: Path,
               out: Path, ns: argparse.Namespace, round_no: int) -> dict[str, Any]:
    reset(engines)
    proxy, server = start_proxy(policy_url, model_dir, out / f"spool-{name}-{round_no}")
    try:
        latencies, sent = asyncio.run(drive(server.url, ns.sessions, ns.turns, ns.head_words, ns.session_words,
                                            ns.turn_words, ns.new_tokens,
                                            f"{name}-{round_no}"))
    finally:
        server.stop()
        proxy.writer.close()
    stats = [core.prefixes.stats for _, core in engines]
    reused = sum(s.reused_tokens for s in stats)
    lookups, hits = sum(s.lookups for s in stats), sum(s.hits for s in stats)
    q = statistics.quantiles(latencies, n=10)
    return {"policy": name, "round": round_no, "turns": len(latencies), "prompt_tokens": sent,
            "reused_tokens": reused, "reuse_share": reused / sent if sent else 0.0,
            "hits": hits, "lookups": lookups, "requests_per_engine": [core.bench_requests for _, core in engines],
            "mean_s": statistics.mean(latencies), "p50_s": statistics.median(latencies), "p90_s": q[8]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--head-words", type=int, default=200, help="words of the head every session shares")
    ap.add_argument("--session-words", type=int, default=400, help="words of each session's own facts")
    ap.add_argument("--turn-words", type=int, default=200, help="words of each turn's user message (a tool result)")
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1, help="times each policy runs (interleaved)")
    ap.add_argument("--out", default=str(ROOT / ".cache" / "bench_router_affinity"))
    ns = ap.parse_args()
    from openclaw_rl.embedded.tiny_model import ensure_tiny_model

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    model_dir = ensure_tiny_model("h128", cache_dir=ROOT / ".cache")
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    have_router = importlib.util.find_spec("sglang_router") is not None
    if not have_router:
        print("sglang-router is not installed (pip install -e .[router]): only proxy-affinity runs", flush=True)
    engines = start_engines(model_dir)
    urls = [server.url for server, _ in engines]
    routers: dict[str, tuple[subprocess.Popen, str]] = {}
    results: list[dict[str, Any]] = []
    try:
        targets = {"proxy-affinity": ",".join(urls)}
        if have_router:
            for name, policy in (("router-manual", "manual"), ("router-round-robin", "round_robin"),
                                 ("router-cache-aware", "cache_aware")):
                routers[name] = start_router(urls, policy)
                targets[name] = routers[name][1]
        for round_no in range(ns.rounds):
            for name, policy_url in targets.items():
                result = run_policy(name, policy_url, engines, model_dir, out, ns, round_no)
                results.append(result)
                print(json.dumps(result), flush=True)
        hop = hop_cost(routers["router-round-robin"][1], urls[0]) if have_router else None
    finally:
        for proc, _ in routers.values():
            proc.terminate()
            proc.wait(30)
        for server, _ in engines:
            server.stop()
    print(f"\nload average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {ns.sessions} sessions x {ns.turns} "
          f"turns, shared head {ns.head_words} words, own facts {ns.session_words} words, {ns.turn_words} words a turn, {ns.new_tokens} new tokens "
          "a turn; 2 engines, 4 prefix-cache entries each")
    print(f"{'policy':<20} {'reused/sent':>12} {'hits/lookups':>13} {'per engine':>11} {'mean s':>7} "
          f"{'p50 s':>6} {'p90 s':>6}")
    for r in results:
        print(f"{r['policy']:<20} {r['reuse_share']:>12.1%} {r['hits']:>6}/{r['lookups']:<6} "
              f"{'/'.join(map(str, r['requests_per_engine'])):>11} {r['mean_s']:>7.3f} {r['p50_s']:>6.3f} "
              f"{r['p90_s']:>6.3f}")
    if hop is not None:
        print(f"router hop: 1-token /generate median {hop[0] * 1000:.2f} ms straight to an engine, "
              f"{hop[1] * 1000:.2f} ms through sglang-router ({(hop[1] - hop[0]) * 1000:+.2f} ms)")
    (out / "results.json").write_text(json.dumps({"results": results, "hop_s": hop}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
