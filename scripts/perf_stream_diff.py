"""Per streamed event, where a process's CPU goes by symbol: ``perf`` samples of the long replies minus the short ones'.

Stage: benchmark tooling (issue #33 item 3). Reads the files ``scripts/bench_stream_events.py --perf PREFIX``
writes (``PREFIX-{proxy,floor}-{SHORT,LONG}.data``: ``perf record -e cpu-clock`` of the measured turns, the
process under Python 3.12's ``-X perf`` trampolines, DWARF call graphs) through ``perf script``, keeps the
samples of one thread (default: the main thread, the event loop's), and prints, per symbol, the samples of
the long replies' turns minus the short ones', turned into µs of CPU per event (samples / rate, divided by
the events between the two lengths: the bench's own per-event difference, so per-turn work cancels out).

Two views: the leaf ("self": the C function, kernel function or trampoline the sample hit) and the
innermost Python function on the stack (every sample's C time charged to the Python function that called
into it; Python 3.12's trampolines carry no unwind tables, so ``perf`` stops at the first one and the
outer Python frames are not seen: no inclusive time beyond the innermost frame). Plus coarse groups by
the leaf's library (kernel, libpython, malloc, uvloop/libuv, libc, the extensions). Usage:
``python scripts/perf_stream_diff.py PREFIX-proxy [--short 64 --long 512 --reps 40 --interval 8 --rate 4000]``.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys

_HEAD = re.compile(r"^\s*(\d+)/(\d+)\s*$")
_FRAME = re.compile(r"^\s*[0-9a-f]+ (.*) \((.*)\)\s*$")


def samples(path: str, main_only: bool) -> list[tuple[str, str, str, frozenset[str]]]:
    """Each sample of ``path`` as (leaf symbol, leaf's library, innermost Python function or '-', every symbol
    on its stack)."""
    out = subprocess.run(["perf", "script", "-i", path, "-F", "tid,pid,ip,sym,dso"], capture_output=True, text=True,
                         check=True).stdout
    result: list[tuple[str, str, str, frozenset[str]]] = []
    keep, frames = False, []  # type: ignore[var-annotated]

    def flush() -> None:
        if keep and frames:
            py = next((s for s, _ in frames if s.startswith("py::")), "-")
            leaf = next(((s, d) for s, d in frames if d != "inlined"), frames[0])  # the function perf names
            result.append((leaf[0], leaf[1], py, frozenset(s for s, _ in frames)))

    for line in out.splitlines():
        head = _HEAD.match(line)
        if head:
            flush()
            keep, frames = (not main_only) or head.group(1) == head.group(2), []
            continue
        frame = _FRAME.match(line)
        if frame:
            frames.append((frame.group(1), frame.group(2).rsplit("/", 1)[-1]))
    flush()
    return result


def group(sym: str, dso: str) -> str:
    """A leaf's coarse group: where in the stack the CPU went."""
    if dso.startswith("[kernel") or dso == "[unknown]" and sym.startswith("["):
        return "kernel"
    if sym.startswith("py::"):
        return "trampoline (py::)"
    if "malloc" in sym.lower() or "free" in sym.lower() or "alloc" in sym.lower() and "libpython" in dso:
        return "allocation (pymalloc, malloc, free)"
    if "gc_collect" in sym or sym.startswith("gc_") or "visit_" in sym or "deduce_unreachable" in sym:
        return "gc"
    if dso.startswith("libpython"):
        return "libpython: eval loop" if sym == "_PyEval_EvalFrameDefault" else "libpython: other"
    if "uvloop" in dso or "loop.cpython" in dso:
        return "uvloop / libuv"
    if dso.startswith("libc"):
        return "libc"
    return dso


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("prefix", help="e.g. /tmp/x-proxy: reads PREFIX-SHORT.data and PREFIX-LONG.data")
    p.add_argument("--short", type=int, default=64)
    p.add_argument("--long", type=int, default=512)
    p.add_argument("--reps", type=int, default=40, help="the bench's --reps (turns recorded per length)")
    p.add_argument("--interval", type=int, default=8, help="tokens per stream event")
    p.add_argument("--rate", type=int, default=4000, help="perf record's -F")
    p.add_argument("--against", default="", metavar="PREFIX2",
                   help="a second recording (e.g. PREFIX-floor) printed beside the first, with the difference")
    p.add_argument("--all-threads", action="store_true", help="every thread, not only the main (event loop's)")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--inclusive", action="append", default=[], metavar="SYMBOL",
                   help="also the samples with SYMBOL anywhere on their stack (C frames: with -X perf the stack "
                        "ends at the innermost Python frame; without it, at main)")
    p.add_argument("--within", action="append", default=[], metavar="TEXT",
                   help="also break down by leaf the samples whose innermost Python function contains TEXT "
                        "('-': the samples with no Python frame)")
    ns = p.parse_args()
    events = ns.reps * (-(-ns.long // ns.interval) - -(-ns.short // ns.interval))
    us = 1e6 / ns.rate / events  # µs per event of one sample's difference
    runs = [(prefix, [samples(f"{prefix}-{n}.data", not ns.all_threads) for n in (ns.short, ns.long)])
            for prefix in filter(None, (ns.prefix, ns.against))]
    for prefix, (short, long) in runs:
        print(f"{prefix}: {len(short)} and {len(long)} samples ({ns.short}- and {ns.long}-token replies, {ns.reps} "
              f"each); {events} events between them; total {(len(long) - len(short)) * us:.0f} us per event")
    views = [("groups by the leaf's library", lambda s: group(s[0], s[1]), None),
             ("leaf (self) symbols", lambda s: s[0], None),
             ("innermost Python function (its C callees included)", lambda s: s[2], None)]
    for text in ns.within:
        views.append((f"leaves under {text!r}", lambda s: s[0], lambda s, t=text: s[2] == t if t == "-" else t in s[2]))
    for title, key, where in views:
        cols = []
        for _, (short, long) in runs:
            a = collections.Counter(key(s) for s in short if where is None or where(s))
            b = collections.Counter(key(s) for s in long if where is None or where(s))
            cols.append({k: (b[k] - a[k]) * us for k in set(a) | set(b)})
        keys = sorted(set().union(*cols), key=lambda k: -max(abs(c.get(k, 0.0)) for c in cols))
        print(f"\n{title}: us per event" + ("  (first, second, first - second)" if len(cols) > 1 else ""))
        for k in keys[:ns.top]:
            values = [c.get(k, 0.0) for c in cols]
            extra = f"  {values[1]:7.1f}  {values[0] - values[1]:+7.1f}" if len(values) > 1 else ""
            print(f"  {values[0]:7.1f}{extra}  {k}")
    if ns.inclusive:
        print("\nsamples with the symbol anywhere on the stack (inclusive): us per event")
        for text in ns.inclusive:
            values = [(sum(any(text in f for f in s[3]) for s in long) - sum(any(text in f for f in s[3]) for s in short))
                      * us for _, (short, long) in runs]
            print("  " + "  ".join(f"{v:7.1f}" for v in values) + f"  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
