"""The proxy makes young collections rare once it has started (server.rare_young_collections, issue #33 item 2):
the helper's rule, and that the real start paths apply it (``Proxy.start``, which ``serve``'s lifespan and a
``--workers`` owner run, and a worker's lifespan). Each test puts the collector's thresholds back and unfreezes
what it froze, so no other test runs with the proxy's settings."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from openclaw_rl.config import load_settings
from openclaw_rl.server import YOUNG_GC_THRESHOLD, Proxy, rare_young_collections
from openclaw_rl.servers import free_port
from openclaw_rl.workers.app import Worker


@pytest.fixture
def python_default_gc() -> Iterator[None]:
    """Python's default thresholds for the test (an earlier test's proxy may have left 10,000); the collector's
    thresholds and frozen objects as they were afterwards."""
    saved, frozen = gc.get_threshold(), gc.get_freeze_count()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*saved)
        if not frozen:  # what the start path froze goes back (objects frozen before cannot be told apart)
            gc.unfreeze()


def test_start_up_raises_the_young_threshold_and_keeps_the_older_ones(python_default_gc: None) -> None:
    rare_young_collections()
    assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, 10, 10)
    gc.set_threshold(50_000, 5, 5)  # a higher one set by whoever runs the proxy stays
    rare_young_collections()
    assert gc.get_threshold() == (50_000, 5, 5)
    gc.set_threshold(0)  # collection switched off stays off
    rare_young_collections()
    assert gc.get_threshold()[0] == 0


@pytest.fixture
def settings(tmp_path: Path, tiny_model_dir: Path) -> Any:
    """A proxy whose policy is a closed loopback port (the start-up probe finds it unreachable at once)."""
    return load_settings({"proxy_tokenizer": str(tiny_model_dir), "proxy_policy_url": f"http://127.0.0.1:{free_port()}",
                          "judge_url": "", "spool_dir": str(tmp_path / "spool")}, env={})


def test_the_proxys_start_path_raises_the_young_threshold(python_default_gc: None, settings: Any,
                                                         tokenizer: Any) -> None:
    proxy = Proxy.build(settings, tokenizer=tokenizer)

    async def start_and_stop() -> tuple[int, int, int]:
        await proxy.start()
        try:
            return gc.get_threshold()
        finally:
            await proxy.shutdown()
    assert asyncio.run(start_and_stop()) == (YOUNG_GC_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() > 0  # the start-up objects were frozen first, as the helper's docstring says


def test_a_workers_start_path_raises_the_young_threshold(python_default_gc: None, settings: Any, tokenizer: Any,
                                                         monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    worker = Worker.build(settings, str(tmp_path / "no-owner.sock"), 0, tokenizer=tokenizer)

    async def nothing(*_: Any) -> None:
        return None
    monkeypatch.setattr(worker.owner, "connect", nothing)  # no owner here: the lifespan's own steps only
    monkeypatch.setattr(worker, "shutdown", nothing)
    app = worker.app.app  # the FastAPI app behind DirectRoute: its lifespan

    async def lifespan() -> tuple[int, int, int]:
        async with app.router.lifespan_context(app):
            return gc.get_threshold()
    try:
        assert asyncio.run(lifespan()) == (YOUNG_GC_THRESHOLD, 10, 10)
    finally:
        asyncio.run(Worker.shutdown(worker))
