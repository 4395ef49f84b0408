"""``python -m openclaw_rl.bench.cpu_profile OUT -m MODULE ARGS…``: run a module under yappi's CPU clock.

Why: the proxy's work is spread over the event loop, the render thread and the writer thread. cProfile
sees the main thread only, and a sampling profiler counts a thread blocked in ``fsync`` or a futex as
busy; yappi with the CPU clock attributes on-CPU time per function across all threads. The stats are
written at exit in pstats format (and each thread apart, OUT.<thread class>-<id>.pstat) (SIGUSR1 clears what was counted so far: start-up, warm-up) (read them with ``python -m pstats OUT``). Used by ``openclaw-rl bench
--profile-proxy X.pstat``; yappi is a benchmark-only dependency (``pip install yappi``).
"""

from __future__ import annotations

import atexit
import runpy
import signal
import sys


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit("usage: python -m openclaw_rl.bench.cpu_profile OUT -m MODULE [ARGS...]")
    try:
        import yappi
    except ImportError:
        raise SystemExit("--profile-proxy *.pstat needs yappi (pip install yappi)") from None
    out, module = sys.argv[1], sys.argv[3]
    sys.argv = [module, *sys.argv[4:]]
    yappi.set_clock_type("cpu")
    yappi.start(builtins=True)
    # SIGUSR1 (``Stack.profile_reset``): drop what was counted so far, e.g. start-up and warm-up
    signal.signal(signal.SIGUSR1, lambda *_: yappi.clear_stats())

    def save() -> None:
        yappi.stop()
        yappi.get_func_stats().save(out, type="pstat")
        for t in yappi.get_thread_stats():  # each thread apart: OUT.<thread name>.pstat
            yappi.get_func_stats(filter={"ctx_id": t.id}).save(f"{out}.{t.name}-{t.id}.pstat", type="pstat")

    atexit.register(save)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
