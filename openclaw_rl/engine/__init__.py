"""The embedded engine: an SGLang-compatible ``/generate`` server over a pluggable token-level core.

``protocol`` (wire schemas) → ``server`` (routes, SGLang's rules) → ``model`` (the core Protocol), with
``scripted`` as the deterministic fake core for tests and benchmarks.
"""

from openclaw_rl.engine.model import EngineModel, InputScores, SamplingConfig, TokenStep
from openclaw_rl.engine.scripted import ScriptedModel
from openclaw_rl.engine.server import EngineApp, make_engine_app

__all__ = ["EngineApp", "EngineModel", "InputScores", "SamplingConfig", "ScriptedModel", "TokenStep",
           "make_engine_app"]
