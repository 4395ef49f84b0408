"""The benchmarks' ``Stack`` (``openclaw_rl/bench/processes.py``) when a process cannot start.

``scripts/bench_turn_cpu.py --workers 2 --profile X.pstat`` in a fresh ``scripts/setup.sh`` environment
(no yappi: a benchmark-only dependency) failed at start-up with only ``…/healthz did not come up; see the
logs in /tmp/openclaw-turn-cpu-…``, a temporary directory already deleted when the error printed: the
proxy's own message (``--profile-proxy *.pstat needs yappi``) was lost. Now a missing profiler is one
clear error before anything starts, and a process that exits while awaited is named with its exit status
and its last output.
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import sys
from pathlib import Path

import httpx
import pytest

from openclaw_rl.bench.processes import Stack


def test_a_process_that_exits_at_start_is_reported_with_its_own_last_words(tmp_path: Path):
    stack = Stack(str(tmp_path), tmp_path, reply_tokens=8)
    proc = stack._spawn("proxy", [sys.executable, "-c", "import sys; print('starting'); "
                                                        "sys.exit('--profile-proxy *.pstat needs yappi')"])

    async def wait() -> None:
        async with httpx.AsyncClient(trust_env=False) as http:
            await stack._wait_healthy(http, [(proc, f"{stack.proxy_url}/healthz")], 60)

    try:
        with pytest.raises(RuntimeError) as err:
            asyncio.run(wait())
    finally:
        stack.stop()
    assert "exited with status 1" in str(err.value), err.value
    assert "needs yappi" in str(err.value) and "starting" in str(err.value), err.value


@pytest.mark.parametrize("suffix, tool", [(".pstat", "yappi"), (".folded", "py-spy")])
def test_a_missing_profiler_is_one_clear_error_before_anything_starts(suffix, tool, tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "yappi" else find_spec(name, *a))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))  # no py-spy beside it either
    stack = Stack(str(tmp_path), tmp_path, reply_tokens=8, profile_proxy=str(tmp_path / f"p{suffix}"),
                  proxy_args=["--workers", "2"])
    with pytest.raises(RuntimeError, match=f"needs {tool}: pip install {tool}"):
        stack._proxy_args()
    assert stack.procs == []

