"""Processes that only read the settings stay light: the launch scripts' planner (one ``python -m
openclaw_rl.launch plan`` per dry run, ~280 of them in the default suite) imports no pydantic wire schemas.

``config`` checks parser names through ``parsers``, which once took its lone-surrogate check from
``protocol`` and with it built every pydantic schema at each start (0.46 → 0.25 CPU-s per dry run).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_launch_planner_and_settings_import_no_pydantic():
    code = ("import sys\n"
            "from openclaw_rl.launch import plan\n"
            "from openclaw_rl.config import load_settings\n"
            "load_settings({'openclaw_proxy_tool_parser': 'qwen25', 'openclaw_proxy_reasoning_parser': 'qwen3'}, env={})\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'openclaw_rl')))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "openclaw_rl.parsers" in out, out  # the parser names were checked
    assert "pydantic" not in out and "openclaw_rl.protocol" not in out, out
