"""Every hook the launch scripts name imports with a Slime checkout first on ``sys.path``, however installed.

A Slime checkout ships a *regular* ``slime_plugins`` package (``slime_plugins/__init__.py`` plus
``slime_plugins.models``), and Ray puts the job's script directory (that checkout) at ``sys.path[0]`` in
the driver and every actor. Whatever our own ``slime_plugins`` does, it loses that name there. So the
hooks live under ``openclaw_rl`` / ``openclaw_opd`` / ``openclaw_combine``; this test imports each
hook the dry runs print, plus Slime's ``slime_plugins.models``, in a fresh interpreter with a
Slime-shaped checkout first on the path, for the three ways the project can be installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HOOKS = [  # every dotted path a launch script hands to Slime (tests/slime_plugins/test_launch_*.py)
    "openclaw_rl.rollout.generate_rollout_openclaw", "openclaw_rl.rollout.generate", "openclaw_rl.rollout.reward_func",
    "openclaw_opd.rollout.generate_rollout_openclaw_opd", "openclaw_opd.rollout.generate",
    "openclaw_opd.rollout.reward_func", "openclaw_opd.loss.on_policy_distillation_advantages",
    "openclaw_opd.loss.topk_distillation_loss_function", "openclaw_rl.slime_hooks.topk.unpack_teacher_topk",
    "openclaw_combine.rollout.generate_rollout_openclaw_combine", "openclaw_combine.rollout.generate",
    "openclaw_combine.rollout.reward_func", "openclaw_combine.loss.combine_loss_function",
]
PROBE = f"""
import importlib, sys
import slime_plugins, slime_plugins.models
assert slime_plugins.models.ORIGIN == "slime", "Slime's own slime_plugins.models must import"
assert slime_plugins.__file__.startswith(sys.argv[1]), ("Slime's regular package wins the name", slime_plugins.__file__)
for path in {HOOKS!r}:
    module, _, name = path.rpartition(".")
    assert callable(getattr(importlib.import_module(module), name)), path
    assert "slime_plugins.openclaw" not in sys.modules, path + " pulled in our slime_plugins"
import openclaw_rl
print("hooks ok from", openclaw_rl.__file__)
"""


@pytest.fixture
def slime_checkout(tmp_path: Path) -> Path:
    """The shape that matters of a Slime checkout: a regular slime_plugins package with models/."""
    root = tmp_path / "slime"
    (root / "slime_plugins" / "models").mkdir(parents=True)
    (root / "slime_plugins" / "__init__.py").write_text("")
    (root / "slime_plugins" / "models" / "__init__.py").write_text("ORIGIN = 'slime'\n")
    (root / "train_async.py").write_text("# the script Ray runs from here\n")
    return root


def _probe(python: str, slime: Path, extra_path: list[Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in [slime, *extra_path])  # Slime first, as under Ray
    return subprocess.run([python, "-c", PROBE, str(slime)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_plain_pythonpath_with_slime_first(slime_checkout: Path, tmp_path: Path) -> None:
    result = _probe(sys.executable, slime_checkout, [REPO_ROOT], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert str(REPO_ROOT) in result.stdout


def test_editable_install_with_slime_first(slime_checkout: Path, tmp_path: Path) -> None:
    """scripts/setup.sh installs this project with ``pip install -e .`` into .venv."""
    if not any(Path(p).glob("__editable__*openclaw_rl*.pth") for p in sys.path if p.endswith("site-packages")):
        pytest.skip("this interpreter has no editable install of openclaw-rl (run scripts/setup.sh)")
    result = _probe(sys.executable, slime_checkout, [], cwd=tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_regular_install_with_slime_first(slime_checkout: Path, tmp_path: Path) -> None:
    """``pip install .`` (as a built wheel) into a fresh venv; the dependencies come from this interpreter's site-packages
    through a .pth line, which does not activate its editable finder (.pth files there are not run). The venv gets no
    pip of its own (seeding one is most of this test's cost): this interpreter's pip installs into it (``--python``)."""
    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(target)
    python = target / "bin" / "python"
    site = next(Path(p) for p in sys.path if p.endswith("site-packages"))
    venv_site = next((target / "lib").glob("python*/site-packages"))
    (venv_site / "openclaw_deps.pth").write_text(f"{site}\n")
    source = tmp_path / "src"  # a copy, so the build leaves nothing in the checkout
    for name in ("pyproject.toml", "README.md"):
        source.mkdir(exist_ok=True)
        shutil.copy(REPO_ROOT / name, source / name)
    for package in ("openclaw_rl", "openclaw_opd", "openclaw_combine", "slime_plugins"):
        shutil.copytree(REPO_ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"  # built with this interpreter's setuptools (the fresh venv's may be too old)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-q", "-w", str(wheels), str(source)], capture_output=True, text=True, timeout=600,
                           check=False)
    assert build.returncode == 0, build.stderr
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                              *map(str, wheels.glob("*.whl"))], capture_output=True, text=True, timeout=600,
                             check=False)
    assert install.returncode == 0, install.stderr
    result = _probe(str(python), slime_checkout, [], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert str(venv_site) in result.stdout, result.stdout  # the installed copy, not the checkout
