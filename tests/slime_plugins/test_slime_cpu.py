"""Every non-LoRA launch variant through a real Slime's own code on CPU, with Megatron's parallel_state on gloo.

Two Slimes, each with its own Megatron-LM checkout and a Python that can import them (``scripts/check_slime_cpu.sh``
prepares it under /tmp and runs this module):

* ``thudm``: THUDM/slime (checked at 624b824) with the Megatron-LM its Dockerfile pins, patched as its image
  does: ``OPENCLAW_SLIME_DIR``, ``OPENCLAW_MEGATRON_DIR``, ``OPENCLAW_SLIME_PYTHON``;
* ``bundled``: the Slime and Megatron-LM trees shipped in Gen-Verse/OpenClaw-RL (checked at 0d034dd):
  ``OPENCLAW_BUNDLED_SLIME_DIR``, ``OPENCLAW_BUNDLED_MEGATRON_DIR``, ``OPENCLAW_BUNDLED_SLIME_PYTHON``
  (default: ``OPENCLAW_SLIME_PYTHON``). The in-trainer teacher's tests need the later bundled tree of OpenClaw-RL
  f48ac35 (its actor passes the rollout data to the postprocess hook) and skip, saying why, on 0d034dd's.

Each target's tests are skipped, with the reason, when its directories are unset or its Slime does not
import. What runs and what is stubbed: ``slime_cpu_driver.py`` and docs/deployment.md ("CPU integration check").
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from check_ports import free_ports, port_range

from openclaw_rl.modes import launch_variant

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
STUBS = HERE / "slime_cpu_stubs"


@dataclass(frozen=True)
class SlimeTarget:
    name: str
    env_prefix: str  # OPENCLAW_<prefix>SLIME_DIR / _MEGATRON_DIR / _SLIME_PYTHON
    slime_dir: str
    megatron_dir: str
    python: str
    # TorchDynamo on torch 2.13 (CPU) refuses the bundled Megatron's torch.compile'd vocab-parallel
    # cross-entropy (an in-place division on a view made under no_grad); eager runs the same maths.
    rank_env: dict[str, str] = field(default_factory=dict)

    def pythonpath(self) -> str:
        return os.pathsep.join([str(STUBS), str(REPO_ROOT), self.megatron_dir, self.slime_dir])


def _target(name: str, prefix: str, rank_env: dict[str, str]) -> SlimeTarget:
    python = (os.environ.get(f"OPENCLAW_{prefix}SLIME_PYTHON") or os.environ.get("OPENCLAW_SLIME_PYTHON")
              or sys.executable)
    return SlimeTarget(name, prefix, os.environ.get(f"OPENCLAW_{prefix}SLIME_DIR", ""),
                       os.environ.get(f"OPENCLAW_{prefix}MEGATRON_DIR", ""), python, rank_env)


TARGETS = {"thudm": _target("thudm", "", {}), "bundled": _target("bundled", "BUNDLED_", {"TORCHDYNAMO_DISABLE": "1"})}


@functools.cache
def _slime_import_error(name: str) -> str | None:
    target = TARGETS[name]
    if not (target.slime_dir and target.megatron_dir):
        p = target.env_prefix
        return (f"{name} Slime: set OPENCLAW_{p}SLIME_DIR and OPENCLAW_{p}MEGATRON_DIR "
                "(scripts/check_slime_cpu.sh does)")
    probe = subprocess.run([target.python, "-c", "import slime.backends.megatron_utils.actor, slime.ray.rollout"],
                           env={**os.environ, "PYTHONPATH": target.pythonpath()}, capture_output=True, text=True,
                           timeout=300, check=False)
    return None if probe.returncode == 0 else f"{name} Slime does not import: {probe.stderr.strip().splitlines()[-1:]}"


def _targets() -> list:
    return [pytest.param(name, id=name, marks=pytest.mark.skipif(bool(reason := _slime_import_error(name)),
                                                                 reason=reason or ""))
            for name in TARGETS]


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


def _run(target: SlimeTarget, variant: str, tp: int, tmp_path: Path, tiny_model_dir: Path, model_args: Path,
         port: int, extra: tuple[str, ...] = (), script_env: dict[str, str] | None = None, cp: int = 1,
         driver_env: dict[str, str] | None = None) -> dict:
    env = {**os.environ, **(script_env or {}), "DRY_RUN": "1", "SLIME_DIR": target.slime_dir, "MEGATRON_DIR": target.megatron_dir,
           "PYTHON": target.python,
           "PYTHONPATH": str(STUBS), "RUN_DIR": str(tmp_path / "run"), "SAVE_CKPT": str(tmp_path / "ckpt"),
           "USE_WANDB": "0", "HF_CKPT": str(tiny_model_dir), "MODEL_ARGS_FILE": str(model_args),
           "ROTARY_BASE": "10000", "ROLLOUT_BATCH_SIZE": "4", "NUM_GPUS": str(tp * cp + 2), "ACTOR_GPUS": str(tp * cp),
           "ROLLOUT_GPUS": "1", "PRM_GPUS": "1", "TP": "1", "TRAIN_TP": str(tp), "CONTEXT_PARALLEL": str(cp),
           "PORT": str(next(PORTS)), "PRM_PORT": str(next(PORTS)),  # the driver's proxy and scripted judge
           # 1.0: the teacher's log-probs are then not temperature-rescaled, so they can be checked exactly
           "ROLLOUT_TEMPERATURE": "1.0"}
    dry = subprocess.run(["bash", str(REPO_ROOT / "scripts" / launch_variant(variant)[1].script), *extra], env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert dry.returncode == 0, dry.stderr
    assert "cannot run" not in dry.stderr and "cannot check the Slime" not in dry.stderr, dry.stderr
    (tmp_path / "dry_run.txt").write_text(dry.stdout)
    result = tmp_path / "result.json"
    rank_env = {**os.environ, "PYTHONPATH": target.pythonpath(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "OPENCLAW_CHECK_POLICY_PORT": str(next(PORTS)),
                "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1", **target.rank_env, **(driver_env or {})}
    ranks = [subprocess.Popen([target.python, str(HERE / "slime_cpu_driver.py"), str(tmp_path / "dry_run.txt"), variant,
                               str(tp), str(result)], env={**rank_env, "RANK": str(r)}, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(tp * cp)]
    logs = [rank.communicate(timeout=600)[0] for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), "\n".join(log[-4000:] for log in logs)
    return json.loads(result.read_text())


OEL = "qwen3_1.7b_oel_online"  # scripts/run_qwen3_1.7b_openclaw_oel_online.sh (mode oel)
EXPECTED = {  # what Slime itself decides for each script's flags
    "rl": {"loss_type": "policy_loss", "loss_keys": {"pg_loss", "ppo_kl"}},
    "opd": {"loss_type": "policy_loss", "loss_keys": {"pg_loss", "ppo_kl"}},
    "opd_topk": {"loss_type": "custom_loss", "loss_keys": {"kl_loss", "teacher_invalid_frac"}},
    "combine": {"loss_type": "custom_loss", "loss_keys": {"pg_loss", "ppo_kl"}},
    "topk_select": {"loss_type": "custom_loss", "loss_keys": {"pg_loss", "opd_loss", "distill_subset_size"}},
    OEL: {"loss_type": "custom_loss", "loss_keys": {"kl_loss", "teacher_invalid_frac"}},
}
# Whether Slime recomputes the old log-probs before the loss. THUDM/slime skips it for one step per rollout
# with its built-in loss and no KL (rl, opd: OPD must not depend on it); the bundled Slime recomputes them
# unless --use-rollout-logprobs. opd_topk disables advantages, so neither recomputes.
# topk_select: a custom loss with advantages on, like combine; OEL disables advantages, like opd_topk.
RECOMPUTED = {"thudm": {"rl": [], "opd": [], "opd_topk": [], "combine": ["old"], "topk_select": ["old"], OEL: []},
              "bundled": {"rl": ["old"], "opd": ["old"], "opd_topk": [], "combine": ["old"], "topk_select": ["old"],
                          OEL: []}}
TOPK = ("opd_topk", "topk_select", OEL)  # the variants whose samples carry the teacher's top-K
# Token-level OPD's advantage: THUDM/slime's custom advantage hook, the bundled Slime's own OPD estimator.
OPD_ESTIMATOR = {"thudm": "grpo", "bundled": "on_policy_distillation"}
PORTS = free_ports(port_range())  # OPENCLAW_CHECK_PORTS (check_ports.py)


class _LazyRuns(dict):
    """One TP=1 run per (Slime, variant), started the first time a test asks for it (so ``-k opd`` runs one)."""

    def __init__(self, make) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, key: tuple[str, str]) -> dict:
        self[key] = self._make(*key)
        return self[key]


@pytest.fixture(scope="module")
def results_tp1(tmp_path_factory, tiny_model_dir, tiny_model_args) -> dict[tuple[str, str], dict]:
    return _LazyRuns(lambda t, v: _run(TARGETS[t], v, 1, tmp_path_factory.mktemp(f"{t}-{v}-tp1"), tiny_model_dir,
                                       tiny_model_args, next(PORTS)))


@pytest.mark.parametrize("variant", list(EXPECTED))
@pytest.mark.parametrize("slime", _targets())
def test_variant_trains_through_slimes_own_code_at_tp1(results_tp1, slime, variant):
    got, want = results_tp1[slime, variant], EXPECTED[variant]
    assert got["parsed"]["loss_type"] == want["loss_type"] and got["parsed"]["save"], got["parsed"]
    assert got["recomputed"] == RECOMPUTED[slime][variant]
    if variant == "opd":
        assert got["parsed"]["advantage_estimator"] == OPD_ESTIMATOR[slime], got["parsed"]
    assert len(got["losses"]) == 1 and want["loss_keys"] <= set(got["losses"][0]), got["losses"]
    assert got["grad_finite"] and got["grad_abs_sum"] > 1e-6, got["grad_abs_sum"]  # a real gradient, not rounding
    # the pass line the check prints (scripts/check_slime_cpu.sh runs with -rP): what Slime trained on
    print(f"[slime-cpu] {slime} {variant} TP=1: loss_type {got['parsed']['loss_type']}, recomputed "
          f"{got['recomputed']}, losses {_fmt(got['losses'][0])}, |grad| sum {got['grad_abs_sum']:.6g}")
    if variant != "rl":
        assert got["teacher_dims"] == [1], "Slime's rollout metrics must see per-token teacher log-probs"
    if variant in TOPK:  # the bundled Slime forwards the top-K itself; THUDM/slime gets it packed
        assert ("teacher_topk_log_probs" in got["rollout_data_keys"]) == (slime == "bundled"), got["rollout_data_keys"]


@pytest.mark.parametrize("variant", list(EXPECTED))
@pytest.mark.parametrize("slime", _targets())
def test_slimes_rollout_manager_gets_exact_judged_turns_from_our_rollout_function(results_tp1, slime, variant):
    """RolloutManager.generate → our --rollout-function-path → proxy → scripted policy and judge."""
    rollout = results_tp1[slime, variant]["rollout"]
    checks = rollout["checks"]
    assert rollout["n_samples"] == len(checks) == 4, rollout  # ROLLOUT_BATCH_SIZE
    assert all(c["tokens_exact"] and c["log_probs_exact"] for c in checks), checks  # what the policy sampled
    if variant == OEL:  # every turn of an ended session is distilled: two sessions of two turns each
        assert sorted(c["turn"] for c in checks) == [1, 1, 2, 2], checks
        # the teacher scored the sampled tokens with the session's extracted experience in its prompt
        assert all(c["teacher_is_hinted"] and c["has_topk"] for c in checks), checks
        return
    assert all(c["turn"] == 1 for c in checks), checks  # the turn the follow-up is the next state of
    for c in checks:
        happy = c["follow_up"].startswith("thanks")
        if variant in ("rl", "combine", "topk_select"):
            assert c["reward"] == (1.0 if happy else -1.0), c  # the judge's vote on the next state
        if variant == "rl":
            assert not (c["teacher_is_hinted"] or c["teacher_is_rollout"]), c
        elif happy:  # combine (and topk_select) without a hint: no distillation signal (teacher = old log-probs)
            assert c["teacher_is_rollout"], c
        else:  # the teacher scored the sampled tokens with the judge's hint in its prompt
            assert c["teacher_is_hinted"], c
        assert c["has_topk"] == (variant in TOPK), c


@pytest.mark.parametrize("variant", ["combine", "opd_topk", "topk_select", OEL])
@pytest.mark.parametrize("slime", _targets())
def test_tp2_on_two_gloo_ranks_equals_tp1(results_tp1, tmp_path, tiny_model_dir, tiny_model_args, slime, variant):
    got = _run(TARGETS[slime], variant, 2, tmp_path, tiny_model_dir, tiny_model_args, next(PORTS))
    assert got["tp_group_size"] == 2 and got["parsed"]["tensor_model_parallel_size"] == 2
    assert got["grad_finite"] and got["grad_abs_sum"] > 1e-6, got["grad_abs_sum"]  # a real gradient, not rounding
    tp1 = results_tp1[slime, variant]["losses"][0]
    for key, value in tp1.items():
        assert got["losses"][0][key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    diff = max(abs(got["losses"][0][k] - v) for k, v in tp1.items())
    print(f"[slime-cpu] {slime} {variant} TP=2 (2 gloo ranks): losses {_fmt(got['losses'][0])}, "
          f"max |loss diff| vs TP=1 {diff:.3g} over {len(tp1)} values, |grad| sum (rank 0) {got['grad_abs_sum']:.6g}")


def _fmt(losses: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k} {v:.6g}" for k, v in sorted(losses.items())) + "}"


@pytest.mark.parametrize("slime", [p for p in _targets() if p.id == "thudm"])  # the bundled Slime has no --use-opd
def test_slimes_megatron_opd_teacher_scores_the_students_own_prompt_not_the_hinted_one(tmp_path, tiny_model_dir,
                                                                                       tiny_model_args, slime):
    """Why OPENCLAW_COMBINE_OPD_TEACHER_SOURCE=trainer runs our own actor-side teacher (trainer_teacher.py), shown through
    THUDM/slime's own code: the opd script plus --use-opd --opd-type megatron --opd-teacher-load. Slime swaps
    the teacher's weights in (a second table here), runs them over the Sample's own tokens, and replaces the
    hinted teacher log-probs the Sample carried with that result."""
    teacher_dir = tmp_path / "teacher"
    teacher_dir.mkdir()
    got = _run(TARGETS[slime], "opd", 1, tmp_path, tiny_model_dir, tiny_model_args, next(PORTS),
               extra=("--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(teacher_dir)))
    assert got["parsed"]["use_opd"] and got["parsed"]["opd_type"] == "megatron", got["parsed"]
    assert got["recomputed"] == ["teacher_", "old"], got["recomputed"]  # Slime's teacher pass, then the old policy
    assert all(c["teacher_is_hinted"] for c in got["rollout"]["checks"]), got["rollout"]  # what the Sample carried
    report = got["megatron_teacher"]
    assert report["n"] == 4 and report["vs_own_tokens"] < 1e-5, report  # the teacher on the student's own prompt
    assert report["vs_sample"] > 0.1 and report["sample_vs_own_tokens"] > 0.1, report  # the hinted one is gone
    print(f"[slime-cpu] {slime} opd + --use-opd --opd-type megatron TP=1: Slime's teacher_log_probs vs the teacher "
          f"on Sample.tokens max |diff| {report['vs_own_tokens']:.3g}; vs the hinted teacher the Sample carried "
          f"{report['vs_sample']:.3g} ({report['n']} samples)")


def _postprocess_gets_data(name: str) -> bool:
    """Whether this Slime's actor hands rollout_data to --rollout-data-postprocess-path (the bundled Slime of
    0d034dd calls fn(args): the launch refuses the in-trainer teacher there; f48ac35's calls fn(args, data))."""
    actor = Path(TARGETS[name].slime_dir) / "slime" / "backends" / "megatron_utils" / "actor.py"
    return not actor.is_file() or re.search(r"rollout_data_postprocess\(\s*self\.args\s*\)", actor.read_text()) is None


def _trainer_teacher_targets() -> list:
    return [pytest.param(p.values[0], id=p.id, marks=[*p.marks, pytest.mark.skipif(
        not _postprocess_gets_data(p.id), reason=f"{p.id} Slime calls its postprocess hook with args only (0d034dd): "
        "the in-trainer teacher is refused there; the bundled Slime of OpenClaw-RL f48ac35 passes the data")])
        for p in _targets()]


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("variant", ["opd", "combine", "opd_topk", "topk_select"])
@pytest.mark.parametrize("slime", _trainer_teacher_targets())
def test_the_teacher_inside_the_trainer_scores_the_hinted_prompt_in_slimes_actor(tmp_path, tiny_model_dir,
                                                                                tiny_model_args, slime, variant, tp):
    """OPENCLAW_COMBINE_OPD_TEACHER_SOURCE=trainer: the Sample carries the hinted prompt's ids (packed in its
    teacher_log_probs); the actor's frozen HF teacher (the policy's checkpoint, slime_hooks/trainer_teacher.py)
    scores them in Slime's own actor, in the opd advantage hook or the postprocess hook (opd on the bundled
    Slime: its grpo estimator, then the postprocess hook sets teacher - old); the loss reads a plain forward of
    that teacher on prompt + hint + response."""
    got = _run(TARGETS[slime], variant, tp, tmp_path, tiny_model_dir, tiny_model_args, next(PORTS),
               script_env={"OPENCLAW_COMBINE_OPD_TEACHER_SOURCE": "trainer"})
    _check_trainer_teacher(got, slime, variant, f"TP={tp}")


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("variant", ["opd_topk", "topk_select"])
@pytest.mark.parametrize("slime", _trainer_teacher_targets())
def test_the_teacher_inside_the_trainer_is_read_at_the_students_top_k_ids_in_slimes_actor(
        tmp_path, tiny_model_dir, tiny_model_args, slime, variant, tp):
    """distill_subset student: each hinted Sample also carries the student's top-K ids per response position
    (packed beside the prompt; here the HF policy's top-K on the Sample's own tokens, the rollout engine's
    stand-in); Slime's actor carries them to the hook, which reads the frozen teacher there: the top-K the loss
    reads equals a direct forward of the teacher gathered at those ids, the ids are the student's."""
    got = _run(TARGETS[slime], variant, tp, tmp_path, tiny_model_dir, tiny_model_args, next(PORTS),
               script_env={"OPENCLAW_COMBINE_OPD_TEACHER_SOURCE": "trainer"},
               driver_env={"OPENCLAW_CHECK_STUDENT_IDS": "1"})
    report = got["trainer_teacher"]
    assert report["n_at_student_ids"] == report["n_scored"] >= 1, report
    _check_trainer_teacher(got, slime, variant, f"TP={tp} student ids")
    print(f"[slime-cpu] {slime} {variant} TP={tp} distill_subset student: teacher log-probs at the student's top-K "
          f"ids vs a direct forward max |diff| {report['topk_max_abs_diff']:.3g} ({report['n_at_student_ids']} samples, "
          f"{report['n_student_ids_not_teacher_topk']} whose student ids differ from the teacher's own top-K)")


def _check_trainer_teacher(got: dict, slime: str, variant: str, layout: str) -> None:
    report = got["trainer_teacher"]
    if variant == "opd" and slime == "bundled":  # no advantage hook: grpo, then A = teacher - old after it
        assert got["parsed"]["advantage_estimator"] == "grpo", got["parsed"]
        assert got["parsed"]["rollout_data_postprocess_path"].endswith("score_opd_advantages"), got["parsed"]
    assert report["n_scored"] >= 1 and report["n_hinted_prompt"] == report["n_scored"], report
    assert report["n_scored"] + report["n_own_teacher"] == 4, report
    if variant == "opd":
        assert report["n_own_teacher"] == 0, report
        assert report["opd_adv_max_abs_diff"] < 1e-6, report  # the advantages trained on: filled teacher - old
    assert report["max_abs_diff"] < 1e-4, report
    if variant in ("opd_topk", "topk_select"):  # the top-K the loss reads: the frozen teacher's, on the actor
        assert report["topk_max_abs_diff"] < 1e-4 and report["topk_ids_equal"], report
    assert got["teacher_dims"] == [1] and got["grad_finite"] and got["grad_abs_sum"] > 1e-6, got
    print(f"[slime-cpu] {slime} {variant} {layout} teacher in the trainer: {report['n_scored']} samples scored on "
          f"the hinted prompt ({report['n_own_teacher']} kept their own), loss's teacher log-probs vs a direct "
          f"forward of the frozen teacher max |diff| {report['max_abs_diff']:.3g} (top-K {report['topk_max_abs_diff']}; "
          f"opd advantages vs teacher - old {report.get('opd_adv_max_abs_diff')}); losses {_fmt(got['losses'][0])}")


@pytest.mark.parametrize("variant", ["opd", "combine", "opd_topk", "topk_select"])
@pytest.mark.parametrize("slime", _trainer_teacher_targets())
def test_the_teacher_inside_the_trainer_at_context_parallel_2_is_split_as_the_student(tmp_path, tiny_model_dir,
                                                                                     tiny_model_args, slime, variant):
    """CONTEXT_PARALLEL=2 (two gloo ranks, TP 1): Slime gives each CP rank its rows of the packed prompt; the hook
    gathers them, scores the whole sequence and keeps the rank's own rows (Slime's own slice). The teacher the
    loss reads on each rank equals that slice of a direct forward, and the losses equal CP 1's."""
    env = {"OPENCLAW_COMBINE_OPD_TEACHER_SOURCE": "trainer"}
    (tmp_path / "cp2").mkdir()
    got = _run(TARGETS[slime], variant, 1, tmp_path / "cp2", tiny_model_dir, tiny_model_args, next(PORTS),
               script_env=env, cp=2)
    assert got["parsed"]["context_parallel_size"] == 2, got["parsed"]
    _check_trainer_teacher(got, slime, variant, "TP=1 CP=2")
    # The two runs' losses compare only over the same batch: which 4 turns fill it (and so which are hinted)
    # can differ between two live rollouts of the combine proxy (measured once for topk_select). A CP 1 run
    # with another batch is run again, at most twice more.
    def batch(result: dict) -> list:
        return sorted((c["session"], c["turn"], c["reward"], c["teacher_is_hinted"]) for c in result["rollout"]["checks"])

    for attempt in range(3):
        (tmp_path / f"cp1-{attempt}").mkdir()
        one = _run(TARGETS[slime], variant, 1, tmp_path / f"cp1-{attempt}", tiny_model_dir, tiny_model_args,
                   next(PORTS), script_env=env)
        if batch(one) == batch(got):
            break
    assert batch(one) == batch(got), (batch(one), batch(got))
    cp1 = one["losses"][0]
    print(f"[slime-cpu] {slime} {variant} CP=2 vs CP=1 teacher in the trainer: CP=1 losses {_fmt(cp1)}; CP=2 summed "
          f"over the two ranks {_fmt(got['losses'][0])}; max |loss diff| "
          f"{max(abs(got['losses'][0][k] - v) for k, v in cp1.items()):.3g} over {len(cp1)} values")
    for key, value in cp1.items():
        assert got["losses"][0][key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
