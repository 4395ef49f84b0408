"""CPU per streamed event of two proxies (this tree and another checkout) and the floor relay, turn by turn
interleaved, so the machine's changing load falls on all of them alike (issue #33 item 3).

``bench_stream_events.py`` measures one proxy, then the floor, each over a block of turns; on the shared
machine the load drifts between blocks by as much as a change is worth (the same code measured 294-349 µs
per event within five minutes). Here each side has its own paced policy mock (same settings as
``bench_stream_events.py``: incremental stream, ``--interval`` tokens an event, judge off), and the turns
go round robin: one turn of each side, the order turned around every round, each turn's CPU (all the
process's threads, ``schedstat``) read before it and after the process has gone quiet. Per event = the
difference between the long and the short replies' mean CPU per turn, over the events between them. The
other checkout's proxy runs its own code (``--other DIR``: e.g. ``git archive main | tar -x -C DIR``),
under this tree's harness; its processes start in ``DIR`` (``python -m`` puts the working directory ahead of
``PYTHONPATH``: before session 20 they started here and ran this checkout's code on both sides). A benchmark: prints, asserts nothing. Usage:
``python scripts/bench_stream_ab.py --other /tmp/before [--lengths 64,512] [--rounds 12] [--no-floor]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from bench_stream_events import cpu_and_runs, start_floor, stream_case  # noqa: E402

from openclaw_rl.bench import mock, processes  # noqa: E402
from openclaw_rl.bench.stream_cost import _stream_turn  # noqa: E402


async def _turn(http: httpx.AsyncClient, url: str, pid: int, stack: processes.Stack, case: mock.Case, length: int,
                sid: str) -> float:
    c0 = cpu_and_runs(pid)[0]
    await _stream_turn(http, url, case, length, sid)
    await stack.settle(pid=pid)
    return cpu_and_runs(pid)[0] - c0


async def measure(ns: argparse.Namespace) -> None:
    tokenizer_dir, case = stream_case()
    lengths = [int(x) for x in ns.lengths.split(",")]
    with tempfile.TemporaryDirectory(prefix="openclaw-stream-ab-") as tmp:
        args = dict(reply_tokens=64, judge_votes=0, incremental=True, proxy_args=["--stream-interval", str(ns.interval)],
                    replay=False)
        (Path(tmp) / "this").mkdir()
        (Path(tmp) / "other").mkdir()
        this = processes.Stack(tokenizer_dir, Path(tmp) / "this", **args)
        other = processes.Stack(tokenizer_dir, Path(tmp) / "other", **args)
        other.code_root = str(Path(ns.other).resolve())
        async with httpx.AsyncClient(timeout=600, trust_env=False) as http:
            try:
                await this.start(http)
                await other.start(http)
                sides: list[tuple[str, processes.Stack, str, int]] = [
                    ("this", this, this.proxy_url, this.proxy_pid), ("other", other, other.proxy_url, other.proxy_pid)]
                if not ns.no_floor:
                    proc, url = await start_floor(this, ns.interval)
                    sides.append(("floor", this, url, proc.pid))
                if ns.floor_preload:  # the same relay carrying the proxy's modules (its heap and code)
                    proc, url = await start_floor(this, ns.interval, ns.floor_preload)
                    sides.append(("floor+preload", this, url, proc.pid))
                if ns.floor_buffered:  # the same relay reading as rawstream does (BufferedProtocol)
                    proc, url = await start_floor(this, ns.interval, "", "--buffered")
                    sides.append(("floor-buffered", this, url, proc.pid))
                if ns.floor_rawstream:  # the same relay reading with the proxy's own reader (rawstream, SSEReader)
                    proc, url = await start_floor(this, ns.interval, "", "--rawstream")
                    sides.append(("floor-rawstream", this, url, proc.pid))
                cpu: dict[tuple[str, int], list[float]] = {(s[0], n): [] for s in sides for n in lengths}
                loads = [os.getloadavg()[0]]
                for length in lengths:
                    for stack in (this, other):
                        await http.post(f"{stack.policy_url}/bench/latency", json={
                            "reply_tokens": length - 1, "ttft_ms": ns.ttft_ms, "tokens_per_s": ns.tokens_per_s})
                    for name, stack, url, pid in sides:  # warm-up turn, not counted
                        await _turn(http, url, pid, stack, case, length, f"warm-{name}-{length}")
                    for r in range(ns.rounds):
                        order = sides if r % 2 == 0 else sides[::-1]
                        for name, stack, url, pid in order:
                            cpu[(name, length)].append(await _turn(http, url, pid, stack, case, length,
                                                                   f"{name}-{length}-{r}"))
                    loads.append(os.getloadavg()[0])
                events = (lengths[-1] - lengths[0]) / ns.interval
                per = {name: (statistics.mean(cpu[(name, lengths[-1])]) - statistics.mean(cpu[(name, lengths[0])]))
                       / events * 1e6 for name, *_ in sides}
                print(f"per event, {ns.rounds} interleaved rounds, load average {min(loads):.2f}-{max(loads):.2f}: "
                      + ", ".join(f"{name} {us:.0f} us" for name, us in per.items())
                      + (f"; this/floor {per['this'] / per['floor']:.2f}, other/floor {per['other'] / per['floor']:.2f}"
                         if "floor" in per else "") + f"; this/other {per['this'] / per['other']:.3f}", flush=True)
            finally:
                this.stop()
                other.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--other", required=True, help="another checkout of the repository (its proxy is measured too)")
    p.add_argument("--lengths", default="64,512")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--interval", type=int, default=8)
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--tokens-per-s", type=float, default=500.0)
    p.add_argument("--no-floor", action="store_true")
    p.add_argument("--floor-buffered", action="store_true", help="also the floor relay reading with BufferedProtocol")
    p.add_argument("--floor-rawstream", action="store_true", help="also the floor relay reading with the proxy's reader")
    p.add_argument("--floor-preload", default="", help="also a floor relay that imports these modules first "
                   "(comma-separated, e.g. openclaw_rl.server)")
    ns = p.parse_args()
    if not (Path(ns.other) / "openclaw_rl" / "__init__.py").is_file():
        print(f"bench_stream_ab: --other {ns.other!r} holds no openclaw_rl package", file=sys.stderr)
        return 2
    asyncio.run(measure(ns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
