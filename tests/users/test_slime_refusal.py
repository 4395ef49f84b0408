"""Per-user adapters are refused on Slime, clearly, by the launcher and by the rollout hooks."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from openclaw_rl.launch.refusals import PER_USER_ON_SLIME, check_variant
from openclaw_rl.launch.run_config import LaunchError
from openclaw_rl.launch.script import Console
from openclaw_rl.slime_hooks.bridge import settings_from_args


def test_the_launcher_refuses_per_user_adapters_on_slime() -> None:
    console = Console(dry_run=True, stream=io.StringIO())
    assert check_variant("rl", {}, "run_qwen3_4b_openclaw_rl.sh", console) == {}
    with pytest.raises(LaunchError, match="cannot run on Slime") as refused:
        check_variant("rl", {"OPENCLAW_PROXY_PER_USER_ADAPTERS": "1"}, "run_qwen3_4b_openclaw_rl.sh", console)
    assert "train" in str(refused.value) and "docs/users.md" in str(refused.value)


def test_the_rollout_hooks_refuse_per_user_adapters() -> None:
    assert not settings_from_args(SimpleNamespace(), "rl").proxy.per_user_adapters
    with pytest.raises(RuntimeError) as refused:
        settings_from_args(SimpleNamespace(openclaw_proxy_per_user_adapters=True), "rl")
    assert str(refused.value) == PER_USER_ON_SLIME
