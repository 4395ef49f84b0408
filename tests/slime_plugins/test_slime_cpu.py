"""Every non-LoRA launch variant through THUDM/slime's own code on CPU, with Megatron's parallel_state on gloo.

Needs a Slime checkout and a Megatron-LM checkout (the commit Slime's Dockerfile pins, with its patch) and
a Python that can import them: ``scripts/check_slime_cpu.sh SLIME_DIR MEGATRON_DIR`` prepares all of it
under /tmp and runs this module. Skipped, with the reason, when ``OPENCLAW_SLIME_DIR`` /
``OPENCLAW_MEGATRON_DIR`` are unset or Slime does not import. What runs and what is stubbed:
``slime_cpu_driver.py`` and docs/deployment.md ("CPU integration check").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from openclaw_rl.servers import free_port

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
STUBS = HERE / "slime_cpu_stubs"
SLIME_DIR = os.environ.get("OPENCLAW_SLIME_DIR", "")
MEGATRON_DIR = os.environ.get("OPENCLAW_MEGATRON_DIR", "")
PYTHON = os.environ.get("OPENCLAW_SLIME_PYTHON", sys.executable)


def _pythonpath() -> str:
    return os.pathsep.join([str(STUBS), str(REPO_ROOT), MEGATRON_DIR, SLIME_DIR])


def _slime_import_error() -> str | None:
    if not (SLIME_DIR and MEGATRON_DIR):
        return "set OPENCLAW_SLIME_DIR and OPENCLAW_MEGATRON_DIR (scripts/check_slime_cpu.sh does)"
    probe = subprocess.run([PYTHON, "-c", "import slime.backends.megatron_utils.actor, slime.ray.rollout"],
                           env={**os.environ, "PYTHONPATH": _pythonpath()}, capture_output=True, text=True,
                           timeout=300, check=False)
    return None if probe.returncode == 0 else f"Slime does not import: {probe.stderr.strip().splitlines()[-1:]}"


pytestmark = pytest.mark.skipif(bool(reason := _slime_import_error()), reason=reason or "")


@pytest.fixture(scope="module")
def tiny_model_args(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """MODEL_ARGS_FILE for the tiny Qwen3 (the scripts' own hook for another model's shape)."""
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    path = tmp_path_factory.mktemp("model-args") / "tiny.sh"
    path.write_text("MODEL_ARGS=(--swiglu --num-layers {num_hidden_layers} --hidden-size {hidden_size} "
                    "--ffn-hidden-size {intermediate_size} --num-attention-heads {num_attention_heads} "
                    "--group-query-attention --num-query-groups {num_key_value_heads} "
                    "--use-rotary-position-embeddings --disable-bias-linear --normalization RMSNorm "
                    "--norm-epsilon 1e-6 --vocab-size {vocab_size} --kv-channels {head_dim} --qk-layernorm)\n"
                    .format(**cfg))
    return path


def _run(variant: str, tp: int, tmp_path: Path, tiny_model_dir: Path, model_args: Path, port: int) -> dict:
    env = {**os.environ, "DRY_RUN": "1", "SLIME_DIR": SLIME_DIR, "MEGATRON_DIR": MEGATRON_DIR, "PYTHON": PYTHON,
           "PYTHONPATH": str(STUBS), "RUN_DIR": str(tmp_path / "run"), "SAVE_CKPT": str(tmp_path / "ckpt"),
           "USE_WANDB": "0", "HF_CKPT": str(tiny_model_dir), "MODEL_ARGS_FILE": str(model_args),
           "ROTARY_BASE": "10000", "ROLLOUT_BATCH_SIZE": "4", "NUM_GPUS": str(tp + 2), "ACTOR_GPUS": str(tp),
           "ROLLOUT_GPUS": "1", "PRM_GPUS": "1", "TP": "1", "TRAIN_TP": str(tp),
           "PORT": str(free_port()), "PRM_PORT": str(free_port()),  # the driver's proxy and scripted judge
           # 1.0: the teacher's log-probs are then not temperature-rescaled, so they can be checked exactly
           "ROLLOUT_TEMPERATURE": "1.0"}
    dry = subprocess.run(["bash", str(REPO_ROOT / "scripts" / f"run_qwen3_4b_openclaw_{variant}.sh")], env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert dry.returncode == 0, dry.stderr
    assert "cannot run" not in dry.stderr and "cannot check the Slime" not in dry.stderr, dry.stderr
    (tmp_path / "dry_run.txt").write_text(dry.stdout)
    result = tmp_path / "result.json"
    rank_env = {**os.environ, "PYTHONPATH": _pythonpath(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([PYTHON, str(HERE / "slime_cpu_driver.py"), str(tmp_path / "dry_run.txt"), variant,
                               str(tp), str(result)], env={**rank_env, "RANK": str(r)}, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(tp)]
    logs = [rank.communicate(timeout=600)[0] for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), "\n".join(log[-4000:] for log in logs)
    return json.loads(result.read_text())


EXPECTED = {  # what Slime itself decides for each script's flags
    "rl": {"loss_type": "policy_loss", "recomputed": [], "loss_keys": {"pg_loss", "ppo_kl"}},
    "opd": {"loss_type": "policy_loss", "recomputed": [], "loss_keys": {"pg_loss", "ppo_kl"}},
    "opd_topk": {"loss_type": "custom_loss", "recomputed": [], "loss_keys": {"kl_loss", "teacher_invalid_frac"}},
    "combine": {"loss_type": "custom_loss", "recomputed": ["old"], "loss_keys": {"pg_loss", "ppo_kl"}},
}
PORTS = iter(range(29700, 29800))


class _LazyRuns(dict):
    """One TP=1 run per variant, started the first time a test asks for it (so ``-k opd`` runs one)."""

    def __init__(self, make) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, variant: str) -> dict:
        self[variant] = self._make(variant)
        return self[variant]


@pytest.fixture(scope="module")
def results_tp1(tmp_path_factory, tiny_model_dir, tiny_model_args) -> dict[str, dict]:
    return _LazyRuns(lambda v: _run(v, 1, tmp_path_factory.mktemp(f"{v}-tp1"), tiny_model_dir, tiny_model_args,
                                    next(PORTS)))


@pytest.mark.parametrize("variant", list(EXPECTED))
def test_variant_trains_through_slimes_own_code_at_tp1(results_tp1, variant):
    got, want = results_tp1[variant], EXPECTED[variant]
    assert got["parsed"]["loss_type"] == want["loss_type"] and got["parsed"]["save"], got["parsed"]
    assert got["recomputed"] == want["recomputed"]  # OPD must not need Slime's recompute (it skips it)
    assert len(got["losses"]) == 1 and want["loss_keys"] <= set(got["losses"][0]), got["losses"]
    assert got["grad_finite"] and got["grad_abs_sum"] > 1e-6, got["grad_abs_sum"]  # a real gradient, not rounding
    if variant != "rl":
        assert got["teacher_dims"] == [1], "Slime's rollout metrics must see per-token teacher log-probs"


@pytest.mark.parametrize("variant", list(EXPECTED))
def test_slimes_rollout_manager_gets_exact_judged_turns_from_our_rollout_function(results_tp1, variant):
    """RolloutManager.generate → our --rollout-function-path → proxy → scripted policy and judge."""
    rollout = results_tp1[variant]["rollout"]
    checks = rollout["checks"]
    assert rollout["n_samples"] == len(checks) == 4, rollout  # ROLLOUT_BATCH_SIZE
    assert all(c["tokens_exact"] and c["log_probs_exact"] for c in checks), checks  # what the policy sampled
    assert all(c["turn"] == 1 for c in checks), checks  # the turn the follow-up is the next state of
    for c in checks:
        happy = c["follow_up"].startswith("thanks")
        if variant in ("rl", "combine"):
            assert c["reward"] == (1.0 if happy else -1.0), c  # the judge's vote on the next state
        if variant == "rl":
            assert not (c["teacher_is_hinted"] or c["teacher_is_rollout"]), c
        elif happy:  # combine without a hint: no distillation signal (teacher = old log-probs)
            assert c["teacher_is_rollout"], c
        else:  # the teacher scored the sampled tokens with the judge's hint in its prompt
            assert c["teacher_is_hinted"], c
        assert c["has_topk"] == (variant == "opd_topk"), c


@pytest.mark.parametrize("variant", ["combine", "opd_topk"])
def test_tp2_on_two_gloo_ranks_equals_tp1(results_tp1, tmp_path, tiny_model_dir, tiny_model_args, variant):
    got = _run(variant, 2, tmp_path, tiny_model_dir, tiny_model_args, next(PORTS))
    assert got["tp_group_size"] == 2 and got["parsed"]["tensor_model_parallel_size"] == 2
    assert got["grad_finite"] and got["grad_abs_sum"] > 1e-6, got["grad_abs_sum"]  # a real gradient, not rounding
    for key, value in results_tp1[variant]["losses"][0].items():
        assert got["losses"][0][key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
