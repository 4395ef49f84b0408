"""The OpenClaw variant of the tiny model ships in the package: `local`'s first run copies it, not builds it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from openclaw_rl.embedded import shipped_model, tiny_model
from openclaw_rl.embedded.shipped_model import SHIPPED_DIR, SUMS_FILE, shipped_copy
from openclaw_rl.embedded.tiny_model import MARKER_FILE, ensure_tiny_model, tiny_model_path

NAME = tiny_model_path(seed=0, openclaw=True).name


def test_the_shipped_build_is_todays_version_and_intact() -> None:
    """Bumping FORMAT_VERSION or OPENCLAW_PHASE_VERSION without re-shipping fails here (the name carries them)."""
    assert [p.name for p in SHIPPED_DIR.iterdir() if p.is_dir()] == [NAME]
    src = shipped_copy(NAME)
    assert src is not None and (src / MARKER_FILE).is_file() and (src / "model.safetensors").stat().st_size > 1e6


def test_a_first_run_copies_the_shipped_build_instead_of_training(tmp_path: Path, monkeypatch) -> None:
    def no_build(*args, **kwargs):
        raise AssertionError("built the OpenClaw variant although the package ships it")

    monkeypatch.setattr(tiny_model, "build_tiny_model", no_build)
    got = ensure_tiny_model(cache_dir=tmp_path, openclaw=True)
    assert got == tmp_path / NAME
    shipped = {p.name: p.read_bytes() for p in (SHIPPED_DIR / NAME).iterdir() if p.name != SUMS_FILE}
    assert {p.name: p.read_bytes() for p in got.iterdir()} == shipped


def test_a_damaged_or_overridden_shipped_build_is_not_used(tmp_path: Path, monkeypatch) -> None:
    copy = tmp_path / "shipped"
    shutil.copytree(SHIPPED_DIR, copy)
    monkeypatch.setattr(shipped_model, "SHIPPED_DIR", copy)
    assert shipped_copy(NAME) is not None
    monkeypatch.setenv("OPENCLAW_RL_BUILD_TINY", "1")
    assert shipped_copy(NAME) is None
    monkeypatch.delenv("OPENCLAW_RL_BUILD_TINY")
    weights = copy / NAME / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert shipped_copy(NAME) is None


@pytest.mark.parametrize("name", ["tiny-h128-s0-v6", "tiny-h64-openclaw3-s0-v6"])
def test_only_the_shipped_name_is_copied(name: str) -> None:
    assert shipped_copy(name) is None
