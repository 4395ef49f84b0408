"""Shared fixtures. The suite never touches the network: the tiny model is built locally."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# huggingface_hub reads these at import time, so set them before any test imports transformers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default (h128, seed 0) tiny model, built once per session into a private cache."""
    from openclaw_rl.embedded.tiny_model import ensure_tiny_model

    return ensure_tiny_model("h128", cache_dir=tmp_path_factory.mktemp("tiny-cache"))
