"""Our ``slime_plugins`` must extend Slime's own top-level ``slime_plugins`` package, never shadow it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import slime_plugins.models as models, openclaw_rl.losses.policy_math as math_mod; "
    "assert models.ORIGIN == 'slime', models.ORIGIN; "
    "assert callable(math_mod.compute_policy_loss)"
)


def _fake_slime_checkout(root: Path, with_init: bool) -> Path:
    """The shape of a Slime checkout: slime_plugins/models/ with or without a top-level __init__.py."""
    models = root / "slime_plugins" / "models"
    models.mkdir(parents=True)
    (models / "__init__.py").write_text("ORIGIN = 'slime'\n")
    if with_init:
        (root / "slime_plugins" / "__init__.py").write_text("")
    return root


def _probe(path_entries: list[Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in path_entries)}
    return subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True,
                          check=False)


@pytest.mark.parametrize("slime_has_init", [True, False])
def test_both_packages_import_with_our_repo_first_on_the_path(tmp_path: Path, slime_has_init: bool) -> None:
    slime = _fake_slime_checkout(tmp_path / "slime", with_init=slime_has_init)
    result = _probe([REPO_ROOT, slime], cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_slime_namespace_portion_first_on_the_path_also_works(tmp_path: Path) -> None:
    slime = _fake_slime_checkout(tmp_path / "slime", with_init=False)
    result = _probe([slime, REPO_ROOT], cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_regular_slime_package_first_on_the_path_never_fails_silently(tmp_path: Path) -> None:
    """Why the launch scripts put this repository first on PYTHONPATH: with a plain checkout, Slime's
    regular package would shadow ours. With `pip install -e .` the installed finder still finds ours.
    Either way the outcome is loud: both packages import, or the import error names ours."""
    slime = _fake_slime_checkout(tmp_path / "slime", with_init=True)
    result = _probe([slime, REPO_ROOT], cwd=tmp_path)
    assert result.returncode == 0 or "slime_plugins.openclaw" in result.stderr, result.stderr
