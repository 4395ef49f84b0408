"""Servers the external-engine tests train against: a policy engine and the rule judge, each a separate
SGLang-compatible HTTP server on loopback (what ``openclaw-rl train`` sees from real SGLang)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def policy_engine(tiny_model_dir: Path, tokenizer: Any) -> Iterator[Any]:
    from external_support import engine_for

    with engine_for(tiny_model_dir, tokenizer) as server:
        yield server


@pytest.fixture
def rule_judge(tiny_model_dir: Path, tokenizer: Any) -> Iterator[Any]:
    from openclaw_rl.embedded.rule_judge import RuleJudgeModel
    from openclaw_rl.engine.app import make_engine_app
    from openclaw_rl.servers import BackgroundServer

    app = make_engine_app(RuleJudgeModel(tokenizer), tokenizer, served_model_name="rule-judge",
                          model_path=str(tiny_model_dir))
    with BackgroundServer(app) as server:
        yield server
