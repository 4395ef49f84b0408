"""Which tiny model a test session uses: the repository's cache, unless a fresh build is asked for.

``OPENCLAW_TEST_FULL=1`` alone (one full-size test, e.g. ``test_workers``' SIGKILL test) reuses the cached
model; ``OPENCLAW_TEST_FRESH_MODEL=1`` (which ``scripts/run_full_tests.sh`` sets) builds a private one.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def top_conftest(config: pytest.Config) -> ModuleType:
    """tests/conftest.py as pytest loaded it, found among its plugins by file: ``import conftest`` takes
    whichever conftest.py was imported under that name last (tests/users' one, when both are collected)."""
    want = REPO / "tests" / "conftest.py"
    for plugin in config.pluginmanager.get_plugins():
        if isinstance(plugin, ModuleType) and Path(getattr(plugin, "__file__", None) or "/").resolve() == want:
            return plugin
    raise LookupError(f"{want} is not loaded")


@pytest.mark.parametrize("env, private", [({"OPENCLAW_TEST_FULL": "1"}, False), ({}, False),
                                          ({"OPENCLAW_TEST_FRESH_MODEL": "1"}, True),
                                          ({"OPENCLAW_TEST_FULL": "1", "OPENCLAW_TEST_FRESH_MODEL": "1"}, True)])
def test_only_a_fresh_model_request_builds_a_private_model(env, private, monkeypatch, tmp_path_factory, pytestconfig):
    for name in ("OPENCLAW_TEST_FULL", "OPENCLAW_TEST_FRESH_MODEL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cache = top_conftest(pytestconfig).tiny_model_cache(tmp_path_factory)
    assert (cache.name == "tiny-cache") is private
    assert (REPO / ".cache" in cache.parents) is not private


def test_the_full_suite_script_still_asks_for_a_fresh_build():
    assert "OPENCLAW_TEST_FRESH_MODEL=1" in (REPO / "scripts" / "run_full_tests.sh").read_text()
