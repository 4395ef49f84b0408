"""Fixtures of the per-user adapter tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from openclaw_rl.engine.adapters import lora_config
from openclaw_rl.engine.app import make_engine_app
from openclaw_rl.engine.torch_core import TorchModel
from openclaw_rl.servers import BackgroundServer


@pytest.fixture
def lora_engine(tiny_model_dir: Path, tokenizer: Any) -> Any:
    core = TorchModel.from_pretrained(str(tiny_model_dir), seed=0)
    core.enable_lora(lora_config())
    server = BackgroundServer(make_engine_app(core, tokenizer, served_model_name="tiny",
                                              model_path=str(tiny_model_dir))).start()
    yield core, server.url
    server.stop()
    core.close()
