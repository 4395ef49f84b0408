"""A ``Stack`` with ``code_root`` (``bench_stream_ab.py --other DIR``) runs that checkout's code.

``python -m`` puts the working directory first on ``sys.path``, ahead of ``PYTHONPATH``: the processes of
``--other DIR``, started from this checkout's root (where the benchmarks are run), imported this checkout's
``openclaw_rl`` and measured it against itself. They now start in the bench's work directory.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from openclaw_rl.bench.processes import Stack


def test_a_stack_with_a_code_root_imports_that_checkouts_package(tmp_path: Path, monkeypatch) -> None:
    here = Path(__file__).resolve().parents[2]
    other = tmp_path / "other"
    (other / "openclaw_rl").mkdir(parents=True)
    (other / "openclaw_rl" / "__init__.py").write_text("")
    (other / "openclaw_rl" / "where.py").write_text("import openclaw_rl\nprint('ROOT', openclaw_rl.__file__)\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(here)  # as the benchmarks are run: from this checkout's root
    stack = Stack(str(tmp_path), work, reply_tokens=8)
    stack.code_root = str(other)
    proc = stack._spawn("where", [sys.executable, "-m", "openclaw_rl.where"])
    try:
        assert proc.wait(60) == 0
    finally:
        stack.stop()
    out = (work / "where.log").read_text()
    assert f"ROOT {other / 'openclaw_rl' / '__init__.py'}" in out, (out, os.getcwd())
