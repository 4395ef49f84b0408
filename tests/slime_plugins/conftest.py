"""The ``launch`` fixture: run a launch script (dry by default) against fake Slime checkouts and models."""

from __future__ import annotations

import subprocess

import pytest
from launch_support import THIS_PYTHON_FIRST, Run, fake_slime, script


@pytest.fixture
def launch(tmp_path):
    models = tmp_path / "models"
    (models / "Qwen3-4B").mkdir(parents=True)
    (models / "judge").mkdir()
    slimes = {f: fake_slime(tmp_path / f"slime-{f}", f) for f in ("bundled", "thudm", "bundled_pr85")}
    counter = iter(range(1000))

    def run(variant: str, *args: str, flavour: str = "bundled", **env: str) -> Run:
        run_dir = tmp_path / f"run{next(counter)}"
        base = {"PATH": THIS_PYTHON_FIRST, "HOME": str(tmp_path), "LANG": "C.UTF-8", "DRY_RUN": "1",
                "SLIME_DIR": str(slimes[flavour]), "HF_CKPT": str(models / "Qwen3-4B"),
                "PRM_MODEL_PATH": str(models / "judge"), "SAVE_CKPT": str(tmp_path / "ckpt"),
                "RUN_DIR": str(run_dir), "USE_WANDB": "0"}
        base.update(env)
        res = subprocess.run(["bash", str(script(variant)), *args], env=base, cwd=tmp_path, capture_output=True,
                             text=True, timeout=60, check=False)
        return Run(res.returncode, res.stdout, res.stderr, run_dir)

    return run
