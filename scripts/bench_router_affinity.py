"""Measure session affinity across two policy engines: prefix-cache reuse and latency per routing policy.

Two embedded engines (``openclaw-rl engine`` processes, the tiny h128 model, each with its own prefix
cache, of 32 prompts by default) serve the same multi-turn sessions through the real proxy, routed five ways:

* ``proxy-affinity``: ``--policy-url A,B`` (the proxy's rendezvous hashing, no router);
* ``router-manual``: sglang-router ``--policy manual`` (keys on the ``X-SMG-Routing-Key`` the proxy sends);
* ``router-round-robin``, ``router-random`` and ``router-cache-aware`` (sglang-router's default policy).

Every session opens with the same shared head (a long system prompt, as OpenClaw's), then its own facts,
and grows by one long user message (a tool result) and a reply a turn. Sessions run side by side, turn by
turn; with an even number of them round robin would send each session to the same engine every turn (the
waves alternate in step), so the default is odd (7). Before each policy both engines' caches are flushed and
given the shared head.
Printed per policy, from the engines' own counters (``/server_info``'s ``prefix_cache``): the share of
prompt tokens served from a prefix cache (reused / prompt tokens), lookups that hit, requests per engine;
and the mean / p50 / p90 seconds per turn at the client. Then the router's own hop: 1-token
``/generate`` calls through the router vs straight to an engine. Needs the ``router`` extra
(``pip install -e .[router]``); without it only ``proxy-affinity`` runs.

    python scripts/bench_router_affinity.py [--sessions 7] [--turns 4] [--head-words 200]
        [--session-words 400] [--turn-words 200] [--new-tokens 8] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import shutil
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
    """``n`` words drawn with their own seed: texts of two seeds differ from their first words."""
    pick = random.Random(seed).choice
    return " ".join(pick(WORDS) + ("." if i % 11 == 10 else "") for i in range(n))


def start_engines(model_dir: Path, n: int = 2, entries: int = 32) -> list[tuple[subprocess.Popen, str]]:
    """``openclaw-rl engine`` processes (as SGLang runs apart from the proxy; an engine in the proxy's own
    process answered a loopback client ~40 ms late here, which would have biased the comparison)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cli = Path(sys.executable).parent / "openclaw-rl"
    out = []
    for i in range(n):
        port = free_port()
        proc = subprocess.Popen([str(cli), "engine", "--model", str(model_dir), "--port", str(port), "--max-batch",
                                 "4", "--seed", str(i), "--served-model-name", "tiny", "--prefix-cache-entries",
                                 str(entries)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out.append((proc, f"http://127.0.0.1:{port}"))
    for proc, url in out:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"engine at {url} did not start")
            time.sleep(0.3)
    return out


def counters(url: str) -> dict[str, int]:
    """The engine's prefix-cache counters (``/server_info``'s ``prefix_cache``)."""
    return httpx.get(f"{url}/server_info", timeout=30).json()["prefix_cache"]


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


def reset(urls: list[str], warm_ids: list[int]) -> list[dict[str, int]]:
    """Empty both engines' prefix caches, then give each the shared head (as a long-running engine has it:
    otherwise whether a session's first turn finds it depends on which prefill ran first); their counters
    now (the run's are the difference)."""
    for url in urls:
        httpx.post(f"{url}/flush_cache", timeout=30).raise_for_status()
        httpx.post(f"{url}/generate", json={"input_ids": warm_ids, "sampling_params": {"max_new_tokens": 1}},
                   timeout=300).raise_for_status()
    return [counters(url) for url in urls]


def head_ids(model_dir: Path, head_words: int) -> list[int]:
    """The shared head as the proxy renders it (a session whose own facts differ from the first word)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "system", "content": f"{text(head_words, 0)}\nSession facts: warm"},
                {"role": "user", "content": "warm"}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


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


def run_policy(name: str, policy_url: str, urls: list[str], model_dir: Path,
               out: Path, ns: argparse.Namespace, round_no: int) -> dict[str, Any]:
    before = reset(urls, head_ids(model_dir, ns.head_words))
    spool = out / f"spool-{name}-{round_no}"
    shutil.rmtree(spool, ignore_errors=True)  # a previous run's waiting turns would be restored
    proxy, server = start_proxy(policy_url, model_dir, spool)
    try:
        latencies, sent = asyncio.run(drive(server.url, ns.sessions, ns.turns, ns.head_words, ns.session_words,
                                            ns.turn_words, ns.new_tokens,
                                            f"{name}-{round_no}"))
    finally:
        server.stop()
        proxy.writer.close()
    stats = [{k: v - b[k] for k, v in counters(url).items()} for url, b in zip(urls, before)]
    reused = sum(st["reused_tokens"] for st in stats)
    looked = sum(st["prompt_tokens"] for st in stats)
    lookups, hits = sum(st["lookups"] for st in stats), sum(st["hits"] for st in stats)
    q = statistics.quantiles(latencies, n=10)
    return {"policy": name, "round": round_no, "turns": len(latencies), "prompt_tokens": sent,
            "engine_prompt_tokens": looked, "reused_tokens": reused, "reuse_share": reused / looked if looked else 0.0,
            "hits": hits, "lookups": lookups, "requests_per_engine": [st["lookups"] for st in stats],
            "mean_s": statistics.mean(latencies), "p50_s": statistics.median(latencies), "p90_s": q[8]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=7)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--head-words", type=int, default=200, help="words of the head every session shares")
    ap.add_argument("--session-words", type=int, default=400, help="words of each session's own facts")
    ap.add_argument("--turn-words", type=int, default=200, help="words of each turn's user message (a tool result)")
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--cache-entries", type=int, default=32,
                    help="prompts each engine's prefix cache keeps (SGLang's radix cache holds many sessions)")
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
    engines = start_engines(model_dir, entries=ns.cache_entries)
    urls = [url for _, url in engines]
    routers: dict[str, tuple[subprocess.Popen, str]] = {}
    results: list[dict[str, Any]] = []
    try:
        targets = {"proxy-affinity": ",".join(urls)}
        if have_router:
            for name, policy in (("router-manual", "manual"), ("router-round-robin", "round_robin"),
                                 ("router-random", "random"), ("router-cache-aware", "cache_aware")):
                routers[name] = start_router(urls, policy)
                targets[name] = routers[name][1]
        for round_no in range(ns.rounds):
            for name, policy_url in targets.items():
                result = run_policy(name, policy_url, urls, model_dir, out, ns, round_no)
                results.append(result)
                print(json.dumps(result), flush=True)
        hop = hop_cost(routers["router-round-robin"][1], urls[0]) if have_router else None
    finally:
        for proc, _ in routers.values():
            proc.terminate()
            proc.wait(30)
        for proc, _ in engines:
            proc.terminate()
            proc.wait(30)
    print(f"\nload average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {ns.sessions} sessions x {ns.turns} "
          f"turns, shared head {ns.head_words} words, own facts {ns.session_words} words, {ns.turn_words} words a turn, {ns.new_tokens} new tokens "
          f"a turn; 2 engines, {ns.cache_entries} prefix-cache entries each")
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
