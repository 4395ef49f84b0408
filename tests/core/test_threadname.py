"""The proxy's threads carry OS names (``threadname.py``): ``top -H`` and the turn-CPU benchmark's per-thread
figures tell the render thread, the spool writer and the journal apart."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from openclaw_rl.threadname import name_os_thread, os_thread_name

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="OS thread names are read from /proc (Linux)")


def comm(tid: int) -> str:
    return Path(f"/proc/self/task/{tid}/comm").read_text().strip()


def os_names() -> set[str]:
    return {p.read_text().strip() for p in Path("/proc/self/task").glob("*/comm")}


def test_a_thread_gets_its_python_name_shortened_to_the_os_limit():
    assert os_thread_name("openclaw-writer") == b"oc-writer"
    assert os_thread_name("openclaw-render-bulk_0") == b"oc-render-bulk_"  # 15 bytes
    seen: list[str] = []
    t = threading.Thread(target=lambda: (name_os_thread(), seen.append(comm(threading.get_native_id()))),
                         name="openclaw-journal")
    t.start()
    t.join()
    assert seen == ["oc-journal"]


def test_the_writer_journal_and_render_threads_are_named(tmp_path):
    from openclaw_rl.dashboard.journal import TurnJournal
    from openclaw_rl.metrics import ProxyMetrics
    from openclaw_rl.spool import Spool
    from openclaw_rl.writer import SampleWriter

    writer = SampleWriter(Spool(tmp_path / "spool"), ProxyMetrics())
    journal = TurnJournal(tmp_path / "journal")
    pool = ThreadPoolExecutor(1, thread_name_prefix="openclaw-render", initializer=name_os_thread)
    try:
        pool.submit(lambda: None).result()
        writer.flush()  # each thread has answered a flush: it ran its first line, the naming
        journal.flush()
        assert {"oc-writer", "oc-journal", "oc-render_0"} <= os_names()
    finally:
        pool.shutdown()
        journal.close()
        writer.close()
