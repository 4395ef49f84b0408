"""The proxy's CPU and scheduler wake-ups per streamed event (issue #33 item 3), from its own ``/proc`` entry.

A paced policy mock (``--ttft-ms``, ``--tokens-per-s``; incremental SGLang stream, one event per
``--interval`` tokens, judge off: only the stream is measured) streams replies of two lengths through the
proxy at concurrency 1; the difference of the proxy's CPU (``schedstat``, all threads) between the long and the
short replies, divided by the events between them, is the CPU per event, and likewise the number of times
its threads were scheduled (wake-ups), split into the times a thread slept and was woken (voluntary
context switches) and the times it was preempted while runnable (involuntary). A benchmark: nothing is
asserted. ``--floor`` measures, the same way and on the same paced mock, a minimal relay
(``openclaw_rl/bench/stream_floor.py``: uvloop, orjson, one OpenAI chunk per event, nothing else) and prints
it beside the proxy: what a Python process on this machine pays per event at least. Usage:
``python scripts/bench_stream_events.py [--lengths 64,512] [--reps 8] [--floor] [--perf PREFIX]``.

``--python PYTHON`` runs the proxy and the floor under another interpreter (the mocks stay on this one);
``--code-root DIR`` runs another checkout's code (e.g. an export with one constant changed).
``--perf PREFIX`` (Python 3.12+, Linux ``perf`` installed): the proxy and the floor run with ``-X perf``
(perf trampolines: each Python function shows in ``perf report`` as ``py::name:file``) and ``perf record``
samples each of them (software ``cpu-clock``, ``--perf-rate`` Hz, call graphs by ``--perf-callgraph``)
during the measured turns of each reply length, into ``PREFIX-proxy-LENGTH.data`` and
``PREFIX-floor-LENGTH.data``: ``scripts/perf_stream_diff.py`` subtracts the shortest replies' samples from the
longest's, per symbol, and divides by the events between them, as this bench does with the CPU time.
``--perf-plain`` records without ``-X perf`` (C symbols only: no Python function names, but Python calls are
made as unprofiled, where ``-X perf`` sends every one through a C call and a trampoline). The CPU figures of a run
under ``--perf`` include perf's sampling overhead: compare them only with each other.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from openclaw_rl.bench import mock, processes  # noqa: E402
from openclaw_rl.bench.stream_cost import _stream_turn  # noqa: E402
from openclaw_rl.servers import free_port  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_and_runs(pid: int) -> tuple[float, int, int, int, float, float]:
    """(on-CPU seconds, times scheduled, voluntary and involuntary context switches, user and system seconds)
    of the live threads of ``pid``. User and system come from ``stat`` in clock ticks (10 ms): over a bench's
    repetitions they split the on-CPU time roughly, not exactly."""
    cpu = runs = vol = invol = user = system = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu, runs = cpu + int(fields[0]), runs + int(fields[2])
        user, system = user + int(stat[11]), system + int(stat[12])
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                vol += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                invol += int(line.split()[1])
    return cpu / 1e9, runs, vol, invol, user / _TICK, system / _TICK


def _diff(a: tuple, b: tuple, n: float) -> tuple[float, ...]:
    return tuple((y - x) / n for x, y in zip(a, b))


async def per_turn(http: httpx.AsyncClient, stack: processes.Stack, url: str, pid: int, case: mock.Case,
                   lengths: list[int], ns: argparse.Namespace, label: str, settle_pid: int | None = None,
                   reset: bool = False) -> dict[int, tuple[tuple[float, ...], tuple[float, ...]]]:
    """For each reply length: (CPU s, runs, voluntary, involuntary) per turn of ``pid`` and of the policy mock."""
    per: dict[int, tuple[tuple[float, ...], tuple[float, ...]]] = {}
    for length in lengths:
        await http.post(f"{stack.policy_url}/bench/latency", json={
            "reply_tokens": length - 1, "ttft_ms": ns.ttft_ms, "tokens_per_s": ns.tokens_per_s})
        await _stream_turn(http, url, case, length, f"warm-{label}-{length}")
        await stack.settle(pid=settle_pid)
        if reset and length == lengths[0]:
            stack.profile_reset()  # under --profile X.pstat: count the measured turns only
        recorder = start_perf(ns, f"{label}-{length}", pid) if ns.perf else None
        own0, mock0 = cpu_and_runs(pid), cpu_and_runs(stack.procs[0].pid)  # the mock sends each event
        for i in range(ns.reps):
            await _stream_turn(http, url, case, length, f"{label}{length}-{i}")
        await stack.settle(pid=settle_pid)
        if recorder is not None:
            stop_perf(recorder, ns.reps * -(-length // max(ns.interval, 1)), label)
        per[length] = (_diff(own0, cpu_and_runs(pid), ns.reps), _diff(mock0, cpu_and_runs(stack.procs[0].pid), ns.reps))
        print(f"{label} {length}-token replies: {per[length][0][0] * 1e3:.2f} ms of CPU and "
              f"{per[length][0][1]:.1f} wake-ups per turn", flush=True)
    return per


def start_perf(ns: argparse.Namespace, label: str, pid: int) -> subprocess.Popen:
    """``perf record`` on ``pid`` (all its threads) into ``PREFIX-label.data`` (given half a second to attach:
    it prints nothing until it stops)."""
    out = f"{ns.perf}-{label}.data"
    proc = subprocess.Popen(["perf", "record", "-e", "cpu-clock", "-F", str(ns.perf_rate), "-g",
                             f"--call-graph={ns.perf_callgraph}", "-p", str(pid), "-o", out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)
    if proc.poll() is not None:
        raise RuntimeError(f"perf record exited at once: {proc.stderr.read().decode(errors='replace')[-500:]}")  # type: ignore[union-attr]
    return proc


def stop_perf(proc: subprocess.Popen, events: int, label: str) -> None:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    print(f"perf record ({label}): ~{events} events in the recorded turns; {err.decode(errors='replace').strip()[-200:]}",
          flush=True)


def per_event_line(name: str, per: dict, lengths: list[int], interval: int, which: int = 0) -> str:
    short, long = lengths[0], lengths[-1]
    events = (long - short) / max(interval, 1)
    cpu, runs, vol, invol, user, system = ((per[long][which][k] - per[short][which][k]) / events for k in range(6))
    return (f"{name}: {cpu * 1e6:.0f} us of CPU, {runs:.2f} wake-ups per event "
            f"({vol:.2f} woken from sleep, {invol:.2f} preempted; ~{user * 1e6:.0f} us user, ~{system * 1e6:.0f} us system)")


async def start_floor(stack: processes.Stack, interval: int, preload: str = "", *extra: str
                      ) -> tuple[subprocess.Popen, str]:
    """The minimal relay (``stream_floor.py``) on the stack's policy mock; (process, URL) once it listens."""
    port = free_port(mock.HOST)
    proc = stack._spawn("floor", [*(stack.proxy_python or [sys.executable]), "-m", "openclaw_rl.bench.stream_floor", "--port", str(port),
                                  "--upstream", stack.policy_url, "--interval", str(interval), "--preload", preload, *extra])
    for _ in range(200):
        try:
            _, w = await asyncio.open_connection(mock.HOST, port)
            w.close()
            return proc, f"http://{mock.HOST}:{port}"
        except OSError:
            if proc.poll() is not None:
                break
            await asyncio.sleep(0.05)
    raise RuntimeError("the floor relay did not start")


def stream_case() -> tuple[str, mock.Case]:
    """The bench tokenizer's directory and the one ~2K-history, 64-token-reply turn the stream benches send."""
    from transformers import AutoTokenizer

    tokenizer_dir = str(mock.ensure_tokenizer())
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return tokenizer_dir, mock.build_workload(tokenizer, sessions=1, turns=1, max_history_tokens=2048,
                                              reply_tokens=64)[0][0]


async def measure(ns: argparse.Namespace) -> None:
    tokenizer_dir, case = stream_case()
    lengths = [int(x) for x in ns.lengths.split(",")]
    with tempfile.TemporaryDirectory(prefix="openclaw-stream-events-") as tmp:
        stack = processes.Stack(tokenizer_dir, Path(tmp), reply_tokens=64, judge_votes=0, incremental=True,
                           proxy_args=["--stream-interval", str(ns.interval)], replay=False,
                                profile_proxy=ns.profile)
        if ns.python or ns.perf:
            trampolines = ["-X", "perf"] if ns.perf and not ns.perf_plain else []
            stack.proxy_python = [ns.python or sys.executable, *trampolines]
        stack.code_root = ns.code_root  # "": this checkout
        async with httpx.AsyncClient(timeout=600, trust_env=False) as http:
            try:
                await stack.start(http)
                per = await per_turn(http, stack, stack.proxy_url, stack.proxy_pid, case, lengths, ns, "proxy",
                                     reset=True)
                load = tuple(round(x, 2) for x in os.getloadavg())
                print(per_event_line("per event", per, lengths, ns.interval),
                      f"; load average {load} on {os.cpu_count()} CPUs", sep="", flush=True)
                if ns.floor:
                    proc, url = await start_floor(stack, ns.interval)
                    floor = await per_turn(http, stack, url, proc.pid, case, lengths, ns, "floor", settle_pid=proc.pid)
                    print(per_event_line("per event, the floor relay (stream_floor.py)", floor, lengths, ns.interval),
                          f"; load average {tuple(round(x, 2) for x in os.getloadavg())}", sep="", flush=True)
                # a reference, not a floor: the mock (one Python process, uvicorn) only formats and sends each
                # event after a timer wakes it; the proxy also reads, checks and forwards it
                print(per_event_line("the policy mock, which sends them", per, lengths, ns.interval, which=1))
            finally:
                stack.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="64,512",
                   help="two or more reply lengths in tokens, shortest first (per event = the difference)")
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--interval", type=int, default=8, help="tokens per SGLang stream event")
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--tokens-per-s", type=float, default=500.0)
    p.add_argument("--floor", action="store_true",
                   help="also measure the minimal relay (openclaw_rl/bench/stream_floor.py) on the same mock")
    p.add_argument("--perf", default="", metavar="PREFIX",
                   help="run the proxy and the floor with -X perf and perf-record their measured turns "
                        "into PREFIX-{proxy,floor}-LENGTH.data (Python 3.12+; scripts/perf_stream_diff.py reads them)")
    p.add_argument("--python", default="", metavar="PYTHON",
                   help="the interpreter of the proxy and the floor (default: this one; the mocks keep this one)")
    p.add_argument("--perf-plain", action="store_true",
                   help="under --perf, no -X perf: C symbols only, Python calls as the unprofiled proxy makes them")
    p.add_argument("--code-root", default="", metavar="DIR",
                   help="the checkout whose proxy (and floor) runs, e.g. an export with a constant changed")
    p.add_argument("--perf-rate", type=int, default=4000, help="perf record's sampling rate (Hz)")
    p.add_argument("--perf-callgraph", default="dwarf,16384",
                   help="perf record's --call-graph (fp needs an interpreter built with frame pointers)")
    p.add_argument("--profile", default="", help="profile the proxy (.pstat: yappi; .folded: py-spy)")
    ns = p.parse_args()
    try:
        lengths = [int(x) for x in ns.lengths.split(",")]
    except ValueError:
        lengths = []
    if len(lengths) < 2 or lengths != sorted(set(lengths)) or lengths[0] <= 0:
        print(f"bench_stream_events: --lengths {ns.lengths!r}: give two or more increasing positive token counts "
              "(the cost per event is the difference between the longest and the shortest reply)", file=sys.stderr)
        return 2
    asyncio.run(measure(ns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
