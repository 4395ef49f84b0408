"""The proxy's CPU per turn (issue #33 item 2), from its own ``/proc`` entry: robust to load from other processes.

Runs the bench's stack (policy and judge mocks at zero latency, ``openclaw-rl serve`` with the judge on, m = 3) and
drives two-turn sessions (``compare.sessions_at``: prompts of ~1K and ~8K tokens, 64-token plain replies) at
concurrency C. For each history it prints the proxy's CPU seconds (all threads, ``schedstat``) over the turns sent,
after the judge's votes and spool writes have settled, and the load average. ``--proxies N`` (issue #33 item 5)
starts N independent proxies on the same mocks, each with its own spool directory (a spool has one writer), and
sends each session to one of them by its index, as a router hashing the session id would (a session's turns must
reach the proxy that holds its pending turn); CPU is summed over them. ``--workers N`` runs one proxy as
``serve --workers N`` (an owner process and N HTTP workers on one port, ``openclaw_rl/workers/``): sessions go
to whichever worker the kernel gives each connection, and CPU is the owner's plus its workers'. A benchmark:
nothing is asserted.

``--other DIR`` (an A/B robust to the machine's drift): a second proxy runs another checkout's package (``DIR``: a
``git archive`` export, say) on the same mocks, and every pass sends the sessions to both at once, alternating by
session index, so both see the same minutes of the shared machine; the table then has a row for each and prints
this/other per history (single passes on this machine drift by ±30% within minutes; A/A runs of this mode show
how close to 1.00 the ratio stays).

The floor (on by default, ``--no-floor`` to skip): the same sessions also go, in the same run and right after
the proxy's for each history, through ``openclaw_rl/bench/turn_floor.py`` (its own process, the same mocks):
the least work per turn a proxy with this contract does, in one asyncio process. Its CPU is read the same way,
and the table prints proxy/floor beside the proxy's figure. ``--floor-parts`` has the floor time its parts
(template, tokenising, JSON, HTTP, SQLite, judge: ``time.thread_time``) and prints them per turn.
Usage: ``python scripts/bench_turn_cpu.py [--sessions 64] [--histories 1024,8192] [--workers N] [--profile out.pstat]
[--no-floor] [--floor-parts]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from openclaw_rl.bench import mock, processes  # noqa: E402
from openclaw_rl.bench.compare import sessions_at  # noqa: E402
from openclaw_rl.bench.loadclient import LoadClient  # noqa: E402
from openclaw_rl.servers import free_port  # noqa: E402


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (a ``--workers`` owner's workers)."""
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return out


async def wait_workers(http: httpx.AsyncClient, url: str, n: int) -> None:
    """Until the owner reports ``n`` workers connected (``/healthz`` answers once the first one is up)."""
    for _ in range(1200):
        health = (await http.get(f"{url}/healthz")).json()
        if health.get("workers", {}).get("connected") == n:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the {n} workers did not all connect")


def thread_cpu(pids: list[int]) -> dict[str, float]:
    """On-CPU seconds of the proxies' threads by OS name (``threadname.py``: the event loop keeps the
    process's name, ``python``; ``oc-render_0``, ``oc-writer``, ``oc-journal``), summed over ``pids``."""
    out: dict[str, float] = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                name = (task / "comm").read_text().strip()
                cpu = int((task / "schedstat").read_text().split()[0]) / 1e9
            except OSError:  # the thread ended
                continue
            name = "loop" if name.startswith("python") else name.removeprefix("oc-").rstrip("_0123456789")
            out[name] = out.get(name, 0.0) + cpu
    return out


def tree_cpu(pids: list[int]) -> float:
    """On-CPU seconds of the proxies ``pids``."""
    return sum(processes.cpu_seconds_fine(pid) for pid in pids)


async def drive(load: LoadClient, urls: list[str], sessions: list[list[mock.Case]], concurrency: int, tag: str,
                reply: int, by_url: dict[str, list[int]] | None = None) -> tuple[int, int, float]:
    """(turns, errors, wall seconds) of ``concurrency`` workers running whole sessions; ``by_url`` gets
    [turns, errors] per URL."""
    turns = errors = 0
    todo = iter(range(len(sessions)))
    counts = by_url if by_url is not None else {}

    async def worker() -> None:
        nonlocal turns, errors
        for s in todo:
            url = urls[s % len(urls)]  # a session stays on one proxy
            mine = counts.setdefault(url, [0, 0])
            for t, case in enumerate(sessions[s]):
                headers = {**mock.JSON_HEADERS, "X-Session-Id": f"{tag}-{s}",
                           **({"X-Session-Done": "1"} if t == len(sessions[s]) - 1 else {})}
                try:
                    await load.post(f"{url}/v1/chat/completions", mock.chat_body(case, reply, False), headers)
                    turns += 1
                    mine[0] += 1
                except Exception:
                    errors += 1
                    mine[1] += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return turns, errors, time.perf_counter() - start


async def start_floor(ns: argparse.Namespace, stack: processes.Stack, http: httpx.AsyncClient, tokenizer_dir: str
                      ) -> tuple[int, str]:
    """The floor proxy (``turn_floor.py``) on the stack's mocks, as its own process: (pid, url)."""
    port = free_port("127.0.0.1")
    args = [sys.executable, "-m", "openclaw_rl.bench.turn_floor", "--tokenizer", tokenizer_dir, "--policy-url",
            stack.policy_url, "--judge-url", stack.judge_url, "--port", str(port), "--spool",
            str(stack.workdir / "floor.sqlite"), *(["--parts"] if ns.floor_parts else [])]
    proc = stack._spawn("floor", args)
    url = f"http://127.0.0.1:{port}"
    await stack._wait_healthy(http, [(proc, f"{url}/healthz")], 120.0)
    return proc.pid, url


async def floor_parts(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    """The floor's CPU seconds per part so far (``--parts``)."""
    return (await http.get(f"{url}/parts")).json()["cpu_s"]


def side_row(side: str, h: int, rep: int, turns: int, errors: int, cpu: float, threads0: dict[str, float],
             threads1: dict[str, float], load0: float) -> dict[str, object]:
    """``--other``'s row for one proxy of the pair."""
    return {"side": side, "history": h, "rep": rep, "turns": turns, "errors": errors,
            "cpu_ms_per_turn": round(cpu / max(turns, 1) * 1e3, 3), "owner_cpu_ms_per_turn": round(cpu / max(turns, 1) * 1e3, 3),
            "turns_per_s": 0.0, "load": round(load0, 2),
            "thread_ms_per_turn": {name: round((sec - threads0.get(name, 0.0)) / max(turns, 1) * 1e3, 3)
                                   for name, sec in sorted(threads1.items()) if sec - threads0.get(name, 0.0) > 1e-4},
            "load_end": round(os.getloadavg()[0], 2)}


async def run(ns: argparse.Namespace, tokenizer_dir: str, cases: dict[int, list[list[mock.Case]]], workdir: Path
              ) -> list[dict[str, object]]:
    stack = processes.Stack(tokenizer_dir, workdir, reply_tokens=ns.reply, judge_votes=3, replay=False,
                       profile_proxy=ns.profile, proxy_args=["--workers", str(ns.workers)] if ns.workers > 1 else None)
    rows: list[dict[str, object]] = []
    async with httpx.AsyncClient(timeout=120, trust_env=False) as http, LoadClient(120.0) as load:
        try:
            await stack.start(http)
            pids, urls = [stack.proxy_pid], [stack.proxy_url]
            if ns.workers > 1:
                await wait_workers(http, stack.proxy_url, ns.workers)
                pids += children(stack.proxy_pid)
            for i in range(1, ns.proxies):  # the same command line, another port and spool directory
                args = stack._proxy_args(f"spool-{i}")
                port = str(free_port("127.0.0.1"))
                args[args.index("--port") + 1] = port
                proc = stack._spawn(f"proxy-{i}", args, stack.proxy_env)
                urls.append(f"http://127.0.0.1:{port}")
                await stack._wait_healthy(http, [(proc, f"{urls[-1]}/healthz")], 120.0)
                pids.append(proc.pid)
            other_pid, other_url = 0, ""
            if ns.other:  # another checkout's proxy on the same mocks: the same command line, its own spool
                args = stack._proxy_args("spool-other")
                port = str(free_port("127.0.0.1"))
                args[args.index("--port") + 1] = port
                proc = stack._spawn("proxy-other", args, stack.proxy_env, code_root=str(Path(ns.other).resolve()))
                other_url = f"http://127.0.0.1:{port}"
                await stack._wait_healthy(http, [(proc, f"{other_url}/healthz")], 120.0)
                other_pid = proc.pid
            floor_pid, floor_url = await start_floor(ns, stack, http, tokenizer_dir) if ns.floor else (0, "")
            sent = urls + ([other_url] if other_pid else [])  # with --other: sessions alternate between the two
            for h, sessions in cases.items():  # warm-up: first use of each path, tokenizer caches
                await drive(load, sent, sessions[:2 * len(sent)], 2, f"warm{h}", ns.reply)
                if floor_pid:
                    await drive(load, [floor_url], sessions[:2], 2, f"fwarm{h}", ns.reply)
            for pid in pids + [p for p in (floor_pid, other_pid) if p]:
                await stack.settle(pid=pid)
            stack.profile_reset()
            for rep in range(ns.reps):
                for h, sessions in cases.items():
                    for pid in pids + ([other_pid] if other_pid else []):
                        await stack.settle(pid=pid)
                    load0, cpu0, owner0 = os.getloadavg()[0], tree_cpu(pids), tree_cpu(pids[:1])
                    threads0 = thread_cpu(pids)
                    other0 = (tree_cpu([other_pid]), thread_cpu([other_pid])) if other_pid else (0.0, {})
                    by_url: dict[str, list[int]] = {}
                    turns, errors, wall = await drive(load, sent, sessions[4:], ns.concurrency,
                                                      f"r{rep}h{h}", ns.reply, by_url)
                    for pid in pids + ([other_pid] if other_pid else []):
                        await stack.settle(pid=pid)
                    if other_pid:  # each got every other session: its own turns and errors
                        (o_turns, o_errors), (turns, errors) = by_url.get(other_url, [0, 0]), by_url.get(urls[0], [0, 0])
                        rows.append(side_row("other", h, rep, o_turns, o_errors, tree_cpu([other_pid]) - other0[0],
                                             other0[1], thread_cpu([other_pid]), load0))
                    cpu, owner = tree_cpu(pids) - cpu0, tree_cpu(pids[:1]) - owner0
                    threads = {name: round((sec - threads0.get(name, 0.0)) / max(turns, 1) * 1e3, 3)
                               for name, sec in sorted(thread_cpu(pids).items())
                               if sec - threads0.get(name, 0.0) > 1e-4}
                    rows.append({"side": "this", "history": h, "rep": rep, "turns": turns, "errors": errors,
                                 "cpu_ms_per_turn": round(cpu / max(turns, 1) * 1e3, 3),
                                 # with --workers: the owner's part (tracker, judge, spool writer)
                                 "owner_cpu_ms_per_turn": round(owner / max(turns, 1) * 1e3, 3),
                                 "turns_per_s": round(turns / wall, 1), "load": round(load0, 2),
                                 "thread_ms_per_turn": threads,  # which thread the CPU went to
                                 "load_end": round(os.getloadavg()[0], 2)})
                    if floor_pid:  # the same sessions (other ids) through the floor, right after
                        await stack.settle(pid=floor_pid)
                        f0, p0 = processes.cpu_seconds_fine(floor_pid), await floor_parts(http, floor_url) \
                            if ns.floor_parts else {}
                        fturns, ferrors, fwall = await drive(load, [floor_url], sessions[4:], ns.concurrency,
                                                             f"f{rep}h{h}", ns.reply)
                        await stack.settle(pid=floor_pid)
                        fcpu = processes.cpu_seconds_fine(floor_pid) - f0
                        rows[-1].update({"floor_ms_per_turn": round(fcpu / max(fturns, 1) * 1e3, 3),
                                         "floor_errors": ferrors, "floor_turns_per_s": round(fturns / fwall, 1),
                                         "floor_load_end": round(os.getloadavg()[0], 2)})
                        rows[-1]["proxy_over_floor"] = round(float(rows[-1]["cpu_ms_per_turn"])  # type: ignore[arg-type]
                                                             / max(float(rows[-1]["floor_ms_per_turn"]), 1e-9), 2)  # type: ignore[arg-type]
                        if ns.floor_parts:
                            p1 = await floor_parts(http, floor_url)
                            rows[-1]["floor_parts_ms"] = {k: round((v - p0.get(k, 0.0)) / max(fturns, 1) * 1e3, 3)
                                                          for k, v in sorted(p1.items())}
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        finally:
            stack.stop()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=64, help="two-turn sessions per history (+4 for warm-up)")
    p.add_argument("--histories", default="1024,8192")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--reply", type=int, default=64)
    p.add_argument("--proxies", type=int, default=1, help="independent proxies, sessions split between them (item 5)")
    p.add_argument("--workers", type=int, default=1, help="serve --workers N: an owner and N HTTP workers (item 5)")
    p.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the sessions through the floor proxy (turn_floor.py) and print proxy/floor")
    p.add_argument("--floor-parts", action="store_true", help="the floor times its parts; print them per turn")
    p.add_argument("--profile", default="", help="profile the proxy (.pstat: yappi; .folded: py-spy)")
    p.add_argument("--other", default="", help="A/B: a second proxy runs this checkout's package (a directory), "
                   "sessions alternating between the two in every pass")
    ns = p.parse_args()
    if ns.other and (ns.proxies > 1 or ns.workers > 1):
        p.error("--other compares one proxy with another: not with --proxies or --workers")
    from transformers import AutoTokenizer

    tokenizer_dir = str(mock.ensure_tokenizer())
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    cases = {h: sessions_at(tokenizer, sessions=ns.sessions + 4, history=h, reply=ns.reply, seed=h)
             for h in map(int, ns.histories.split(","))}
    with tempfile.TemporaryDirectory(prefix="openclaw-turn-cpu-") as tmp:
        try:
            rows = asyncio.run(run(ns, tokenizer_dir, cases, Path(tmp)))
        except RuntimeError as e:  # a stack that cannot start (a missing profiler, a proxy that exits): say why
            print(f"bench_turn_cpu: {e}", file=sys.stderr)
            return 2
    print(f"{'side':>6}{'history':>8}{'CPU ms/turn':>13}{'owner ms':>10}{'turns/s':>9}{'turns':>7}{'errors':>8}{'load':>7}"
          + (f"{'floor ms':>10}{'proxy/floor':>13}{'floor err':>11}" if ns.floor else "") + "  ms per turn by thread")
    for r in rows:
        print(f"{r['side']:>6}{r['history']:>8}{r['cpu_ms_per_turn']:>13}{r['owner_cpu_ms_per_turn']:>10}{r['turns_per_s']:>9}"
              f"{r['turns']:>7}{r['errors']:>8}{r['load']:>7}"
              + (f"{r.get('floor_ms_per_turn', '-'):>10}{r.get('proxy_over_floor', '-'):>13}{r.get('floor_errors', '-'):>11}"
                 if ns.floor else "")
              + "  " + " ".join(f"{k} {v}" for k, v in r["thread_ms_per_turn"].items()))  # type: ignore[union-attr]
        if ns.floor_parts and "floor_parts_ms" in r:
            print("   floor parts, ms/turn: " + ", ".join(f"{k} {v}" for k, v in r["floor_parts_ms"].items()))  # type: ignore[union-attr]
    for h in cases:
        sel = [float(r["cpu_ms_per_turn"]) for r in rows if r["history"] == h and r["side"] == "this"]  # type: ignore[arg-type]
        if ns.other:
            oth = [float(r["cpu_ms_per_turn"]) for r in rows if r["history"] == h and r["side"] == "other"]  # type: ignore[arg-type]
            ratios = sorted(a / max(b, 1e-9) for a, b in zip(sel, oth))
            print(f"~{h} tokens: this {sum(sel) / len(sel):.3f}, other {sum(oth) / len(oth):.3f} ms/turn (means); "
                  f"this/other per pass {', '.join(f'{x:.3f}' for x in ratios)}, median {ratios[len(ratios) // 2]:.3f}")
        print(f"~{h} tokens: CPU ms/turn best {min(sel):.3f}, mean {sum(sel) / len(sel):.3f} (proxies {ns.proxies}, workers {ns.workers})")
        if ns.floor:
            fl = [float(r["floor_ms_per_turn"]) for r in rows if r["history"] == h]  # type: ignore[arg-type]
            print(f"~{h} tokens: floor ms/turn best {min(fl):.3f}, mean {sum(fl) / len(fl):.3f}; "
                  f"proxy/floor of the means {sum(sel) / max(sum(fl), 1e-9):.2f}")
    print(f"load average at end {tuple(round(x, 2) for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
