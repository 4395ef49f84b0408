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


def _checkout_and_workdir(tmp_path: Path) -> tuple[Path, Path]:
    """A fake checkout whose ``openclaw_rl.where`` prints which package it imported, and a work directory."""
    other = tmp_path / "other"
    (other / "openclaw_rl").mkdir(parents=True)
    (other / "openclaw_rl" / "__init__.py").write_text("")
    (other / "openclaw_rl" / "where.py").write_text("import openclaw_rl\nprint('ROOT', openclaw_rl.__file__)\n")
    work = tmp_path / "work"
    work.mkdir()
    return other, work


def test_a_stack_with_a_code_root_imports_that_checkouts_package(tmp_path: Path, monkeypatch) -> None:
    here = Path(__file__).resolve().parents[2]
    other, work = _checkout_and_workdir(tmp_path)
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


def test_a_relative_code_root_names_the_checkout_from_where_the_bench_runs(tmp_path: Path, monkeypatch) -> None:
    """``bench_stream_events.py --code-root ../before`` hands the path over as given. The processes start in the
    work directory, where a relative ``PYTHONPATH`` entry names nothing, so they fell back to the installed
    (editable) package: this checkout, measured as the other one."""
    other, work = _checkout_and_workdir(tmp_path)
    monkeypatch.chdir(tmp_path)
    stack = Stack(str(tmp_path), work, reply_tokens=8)
    stack.code_root = "other"  # relative to where the bench was started
    proc = stack._spawn("where", [sys.executable, "-m", "openclaw_rl.where"])
    try:
        proc.wait(60)
    finally:
        stack.stop()
    out = (work / "where.log").read_text()
    assert f"ROOT {other / 'openclaw_rl' / '__init__.py'}" in out, out
