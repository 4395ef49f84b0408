"""The embedded engine: an SGLang-compatible ``/generate`` server over a pluggable token-level core.

``protocol`` (wire schemas) → ``server`` (routes, SGLang's rules) → ``model`` (the core Protocol), with
``scripted`` as the deterministic fake core for tests and benchmarks.

The names below load on first use: the CLI imports ``engine.serve`` to register its command, and that
must not cost the FastAPI import of ``server`` (every ``openclaw-rl`` invocation would pay it).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openclaw_rl.engine.app import EngineApp, make_engine_app
    from openclaw_rl.engine.model import EngineModel, InputScores, SamplingConfig, TokenStep
    from openclaw_rl.engine.scripted import ScriptedModel

_WHERE = {"EngineModel": "model", "InputScores": "model", "SamplingConfig": "model", "TokenStep": "model",
          "ScriptedModel": "scripted", "EngineApp": "app", "make_engine_app": "app"}

__all__ = ["EngineApp", "EngineModel", "InputScores", "SamplingConfig", "ScriptedModel", "TokenStep",
           "make_engine_app"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
