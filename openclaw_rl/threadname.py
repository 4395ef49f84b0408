"""OS names for the proxy's threads, so ``top -H``, ``ps -T`` and ``/proc/<pid>/task/<tid>/comm`` tell the
event loop (``python``), the render thread (``oc-render_0``), the spool writer (``oc-writer``) and the
journal (``oc-journal``) apart, and ``scripts/bench_turn_cpu.py`` can say which of them a turn's CPU goes to.

Stage: shared by the proxy's threads (serving's render pool, the spool writer, the dashboard journal).
Python (before 3.14) names a thread for itself only; the OS name is set here with ``prctl(PR_SET_NAME)``
(Linux; 15 bytes, ``openclaw-`` shortened to ``oc-``). Five lines of ctypes rather than a dependency
(``setproctitle.setthreadtitle`` does the same); anywhere else it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading

_PR_SET_NAME = 15
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None


def os_thread_name(name: str) -> bytes:
    """The name the OS keeps for a thread called ``name`` (at most 15 bytes)."""
    return name.replace("openclaw-", "oc-", 1).encode("utf-8", "replace")[:15]


def name_os_thread(name: str | None = None) -> None:
    """Give the calling thread its (or ``name``'s) OS name; a no-op where the OS has none to set."""
    if _libc is not None:
        _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(os_thread_name(name or threading.current_thread().name)), 0, 0, 0)
