"""Shared fixtures. The suite never touches the network: the tiny model is built locally."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support import judge_reply, policy_reply, scripted_server

# huggingface_hub reads these at import time, so set them before any test imports transformers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


REPO = Path(__file__).resolve().parents[1]


def tiny_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the session's tiny model lives. Building it (tokenizer + pre-training) is the suite's largest
    fixed cost, so it is kept in the repository's ignored ``.cache/`` under a key of its sources (every file
    of ``openclaw_rl/embedded``), library versions and thread count: any change rebuilds it. A private,
    fresh build with ``OPENCLAW_TEST_FRESH_MODEL=1`` and in the full suite (``OPENCLAW_TEST_FULL=1``),
    shared by the workers of one ``pytest -n`` run."""
    import hashlib

    import tokenizers
    import torch
    import transformers

    import openclaw_rl.embedded as embedded

    if os.environ.get("OPENCLAW_TEST_FRESH_MODEL") == "1" or os.environ.get("OPENCLAW_TEST_FULL") == "1":
        base = tmp_path_factory.getbasetemp()
        return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "tiny-cache"
    key = hashlib.sha256()
    package = Path(embedded.__file__).parent
    for path in sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        key.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    key.update(f"{torch.__version__} {transformers.__version__} {tokenizers.__version__} "
               f"{torch.get_num_threads()}".encode())
    return REPO / ".cache" / "test-tiny-models" / key.hexdigest()[:16]


@contextmanager
def build_lock(cache: Path) -> Iterator[None]:
    """One builder at a time per cache: with ``pytest -n``, the first worker builds (minutes of CPU) while
    the others wait for it and then find the finished model, instead of each building its own copy."""
    import fcntl

    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.with_name(cache.name + ".lock"), "w") as lock:  # beside it: the cache holds only models
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default (h128, seed 0) tiny model, built once (see ``tiny_model_cache``)."""
    from openclaw_rl.embedded.tiny_model import ensure_tiny_model

    cache = tiny_model_cache(tmp_path_factory)
    with build_lock(cache):
        return ensure_tiny_model("h128", cache_dir=cache)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def policy_server(tokenizer: Any) -> Iterator[Any]:
    with scripted_server(tokenizer, policy_reply) as server:
        yield server


@pytest.fixture
def judge_server(tokenizer: Any) -> Iterator[Any]:
    with scripted_server(tokenizer, judge_reply) as server:
        yield server


@pytest.fixture
def make_proxy(tmp_path: Path, tiny_model_dir: Path, tokenizer: Any) -> Iterator[Callable[..., Any]]:
    """Start a proxy on loopback: make_proxy(policy_url, judge_url="", **settings) → (proxy, base_url)."""
    from openclaw_rl.config import load_settings
    from openclaw_rl.server import Proxy
    from openclaw_rl.servers import BackgroundServer

    started: list[tuple[Any, Any]] = []

    def start(policy_url: str, judge_url: str = "", gate_open: bool = True, **values: Any) -> tuple[Any, str]:
        settings = load_settings({"proxy_tokenizer": str(tiny_model_dir), "proxy_policy_url": policy_url,
                                  "judge_url": judge_url, "spool_dir": str(tmp_path / f"spool{len(started)}"),
                                  "judge_max_new_tokens": 256, **values}, env={})
        proxy = Proxy.build(settings, tokenizer=tokenizer, gate_open=gate_open)
        server = BackgroundServer(proxy.app).start()
        proxy.server = server  # tests reach the proxy's event loop through it (support.on_loop)
        started.append((proxy, server))
        return proxy, server.url

    yield start
    for proxy, server in started:
        server.stop()
        proxy.writer.close()  # its thread and record files end with the test, not at interpreter exit


@pytest.fixture
def teacher_server(tokenizer: Any) -> Iterator[Any]:
    """A judge whose teacher log-probs reveal whether the hint was in the prompt (see support.hint_aware_scorer)."""
    from support import hint_aware_scorer

    with scripted_server(tokenizer, judge_reply, scorer=hint_aware_scorer(tokenizer)) as server:
        yield server
