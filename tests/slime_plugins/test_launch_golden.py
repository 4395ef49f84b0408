"""The launch scripts' dry-run output, byte for byte, against recorded expectations (tests/data/launch-golden/).

The expectations were recorded from the Bash implementation of ``scripts/lib/common.sh`` (commit
"launch golden: record ...") before the Slime flags, the GPU-split checks and the per-variant defaults
moved into ``openclaw_rl.launch``; this test proves the typed path prints the same plan, the same
``ray job submit`` argv, the same run config and the same warnings and refusals. Paths under the test's
temporary directory and the repository are written as ``<TMP>`` and ``<REPO>``; the tools the scripts
probe (nvidia-smi, ray, curl, setsid) are stubs first on PATH, so the output does not depend on the host.
``OPENCLAW_UPDATE_LAUNCH_GOLDEN=1`` rewrites the files (then review the diff: every change is a change
of what users launch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launch_support import THIS_PYTHON_FIRST, fake_slime, parse_submit, script

REPO_ROOT = Path(__file__).resolve().parents[2]
GOLDEN = REPO_ROOT / "tests" / "data" / "launch-golden"
UPDATE = os.environ.get("OPENCLAW_UPDATE_LAUNCH_GOLDEN") == "1"

NVIDIA_SMI = "#!/usr/bin/env bash\nfor ((i = 0; i < ${STUB_GPUS:-8}; i++)); do echo \"GPU $i: Fake (UUID: GPU-$i)\"; done\n"

# The run config base of the newer cases: a fixed file (written by _env), so that comment edits in configs/
# change only the older cases' goldens
FIXED = "<TMP>/fixed-config/openclaw_{}.yaml"
# two nodes of 8: the judge on the head (2 GPUs outside Ray), 8 actor + 6 rollout GPUs over 14 Ray GPUs
NODES2 = {"NUM_NODES": "2", "GPUS_PER_NODE": "8", "MASTER_ADDR": "10.0.0.1", "ACTOR_GPUS": "8", "ROLLOUT_GPUS": "6",
          "PRM_GPUS": "2"}
# four nodes of 8 with an external judge: 16 actor + 16 rollout GPUs, every node gives Ray all 8
NODES4 = {"NUM_NODES": "4", "GPUS_PER_NODE": "8", "MASTER_ADDR": "10.0.0.1", "ACTOR_GPUS": "16", "ROLLOUT_GPUS": "16",
          "PRM_URL": "http://judge.lan:30000", "PRM_MODEL_PATH": ""}
# name: (variant, script arguments, environment, Slime flavour)
CASES: dict[str, tuple[str, tuple[str, ...], dict[str, str], str]] = {
    "rl": ("rl", (), {}, "bundled"),
    "rl_lora": ("rl_lora", (), {}, "bundled"),
    "opd": ("opd", (), {}, "bundled"),
    "opd_thudm": ("opd", (), {}, "thudm"),
    "opd_topk": ("opd_topk", (), {}, "bundled"),
    "opd_topk_thudm": ("opd_topk", (), {}, "thudm"),
    "combine": ("combine", (), {}, "bundled"),
    "combine_lora_refused": ("combine_lora", (), {}, "bundled"),
    "combine_lora_fallback": ("combine_lora", (), {"ALLOW_LORA_FALLBACK": "1"}, "bundled"),
    "opd_topk_lora_refused": ("opd_topk_lora", (), {"ALLOW_LORA_FALLBACK": "1"}, "bundled"),
    "rl_lora_thudm": ("rl_lora", (), {}, "thudm"),
    "rl_extra_args": ("rl", ("--dry-run", "--num-rollout", "10", "--lr", "3e-6"), {"DRY_RUN": "0"}, "bundled"),
    "rl_layout": ("rl", (), {"NUM_GPUS": "10", "ACTOR_GPUS": "2", "ROLLOUT_GPUS": "4", "PRM_GPUS": "4", "TP": "1",
                             "PRM_TP": "2", "TRAIN_TP": "2", "CUDA_VISIBLE_DEVICES": "9,8,7,6,5,4,3,2,1,0",
                             "STUB_GPUS": "10"}, "bundled"),
    "rl_training": ("rl", (), {"ROLLOUT_BATCH_SIZE": "8", "LR": "2e-6", "SAVE_INTERVAL": "5", "KL_LOSS_COEF": "0.01",
                               "MEM_FRACTION_STATIC": "0.7", "PRM_MEM_FRACTION": "0.5", "MAX_TOKENS_PER_GPU": "1000",
                               "ROTARY_BASE": "1000000", "CONTEXT_LENGTH": "16384", "PRM_PORT": "31111",
                               "REF_LOAD": "ref", "SAVE_CKPT": "/ckpt2"}, "bundled"),
    "rl_external_judge": ("rl", (), {"PRM_URL": "http://judge.lan:30000/", "NUM_GPUS": "6", "PRM_API_KEY": "judge-k3y",
                                     "PRM_MODEL_PATH": ""}, "bundled"),
    "opd_external_teacher": ("opd", (), {"TEACHER_URL": "http://teacher.lan:30020", "TEACHER_API_KEY": "t3acher",
                                         "TEACHER_MODEL_PATH": "<TMP>/models/judge",
                                         "OPENCLAW_TOPK_HINT_SELECTION": "sequence_optimal"}, "bundled"),
    "rl_teacher_ignored": ("rl", (), {"TEACHER_URL": "http://teacher.lan:30020"}, "bundled"),
    "rl_external_judge_idle_gpus": ("rl", (), {"PRM_URL": "http://judge:30000", "PRM_GPUS": "2"}, "bundled"),
    "rl_proxy_public_key": ("rl", (), {"PROXY_HOST": "0.0.0.0", "SGLANG_API_KEY": "s3cret", "PORT": "30123",
                                       "SERVED_MODEL_NAME": "m2", "TOOL_CALL_PARSER": "hermes",
                                       "ROLLOUT_TEMPERATURE": "0.9", "OPENCLAW_RECORD_ENABLED": "0",
                                       "PRM_M": "5", "PRM_TEMPERATURE": "0.3", "PRM_MAX_NEW_TOKENS": "1234"}, "bundled"),
    "rl_proxy_insecure": ("rl", (), {"PROXY_HOST": "0.0.0.0", "ALLOW_INSECURE_BIND": "1"}, "bundled"),
    "rl_proxy_refused": ("rl", (), {"PROXY_HOST": "0.0.0.0"}, "bundled"),
    "rl_wandb": ("rl", (), {"USE_WANDB": "1", "WANDB_API_KEY": "w", "WANDB_PROJECT": "p2"}, "bundled"),
    "rl_wandb_no_key": ("rl", (), {"USE_WANDB": "1"}, "bundled"),
    "rl_ray": ("rl", (), {"MASTER_ADDR": "10.0.0.1", "RAY_PORT": "6390", "RAY_DASHBOARD_PORT": "8290",
                          "RAY_TEMP_DIR": "ray-tmp", "PYTHONPATH": "/extra:/more", "PYTHON": "python3"}, "bundled"),
    "rl_megatron_beside_slime": ("rl", (), {"SLIME_DIR": "<TMP>/stack/slime"}, "bundled"),
    "rl_model_args_file": ("rl", (), {"MODEL_ARGS_FILE": "<TMP>/model.sh"}, "bundled"),
    "rl_quoting": ("rl", (), {"RUN_DIR": "<TMP>/it's a run", "WANDB_PROJECT": "x"}, "bundled"),
    "rl_missing_paths": ("rl", (), {"HF_CKPT": "<TMP>/nope", "SLIME_DIR": "<TMP>/no-slime", "STUB_GPUS": "2"},
                         "bundled"),
    "rl_missing_paths_real": ("rl", (), {"DRY_RUN": "0", "SLIME_DIR": "<TMP>/no-slime"}, "bundled"),
    "rl_skip_feature_check": ("rl", (), {"SKIP_SLIME_FEATURE_CHECK": "yes"}, "bundled"),
    "rl_bad_split": ("rl", (), {"NUM_GPUS": "4"}, "bundled"),
    "rl_no_judge": ("rl", (), {"PRM_GPUS": "0"}, "bundled"),
    "rl_bad_tp": ("rl", (), {"ROLLOUT_GPUS": "3", "NUM_GPUS": "9"}, "bundled"),
    "rl_bad_train_tp": ("rl", (), {"ACTOR_GPUS": "5", "NUM_GPUS": "9"}, "bundled"),
    "rl_bad_prm_tp": ("rl", (), {"PRM_GPUS": "3", "NUM_GPUS": "9"}, "bundled"),
    "rl_not_a_number": ("rl", (), {"ACTOR_GPUS": "four"}, "bundled"),
    "rl_bad_lr": ("rl", (), {"LR": "fast"}, "bundled"),
    "rl_bad_prm_url": ("rl", (), {"PRM_URL": "judge:30000"}, "bundled"),
    "rl_too_few_visible": ("rl", (), {"CUDA_VISIBLE_DEVICES": "0,1"}, "bundled"),
    "opd_estimator_on_thudm": ("opd", (), {"OPD_ADVANTAGE": "estimator"}, "thudm"),
    "opd_custom_on_bundled": ("opd", (), {"OPD_ADVANTAGE": "custom", "OPENCLAW_EVAL_MODE": "0",
                                          "OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY": "7"}, "bundled"),
    "opd_bad_advantage": ("opd", (), {"OPD_ADVANTAGE": "bogus"}, "bundled"),
    "opd_skip_check": ("opd", (), {"SKIP_SLIME_FEATURE_CHECK": "1"}, "thudm"),
    "combine_weights": ("combine", (), {"OPENCLAW_COMBINE_W_OPD": "0.5", "OPENCLAW_COMBINE_W_RL": "0.25",
                                        "KL_LOSS_COEF": "1e-3"}, "bundled"),
    "topk_select": ("topk_select", (), {"OPENCLAW_CONFIG": FIXED.format("combine")}, "bundled"),
    "topk_select_knobs": ("topk_select", (), {"OPENCLAW_CONFIG": FIXED.format("combine"), "OPENCLAW_TOPK_K": "8",
                                              "OPENCLAW_TOPK_SUBSET_MODE": "overlap", "OPENCLAW_TOPK_ADV_DIFF_CLIP": "2.0",
                                              "OPENCLAW_TOPK_HINT_SELECTION": "token_optimal"}, "bundled"),
    "topk_select_student_refused": ("topk_select", (), {"OPENCLAW_TOPK_SUBSET_MODE": "student"}, "bundled"),
    "topk_select_student_trainer_refused": ("topk_select", (), {"OPENCLAW_TOPK_SUBSET_MODE": "student",
                                                               "OPENCLAW_COMBINE_OPD_TEACHER_SOURCE": "trainer"}, "thudm"),
    "topk_select_loss_mismatch": ("topk_select", (), {"OPENCLAW_COMBINE_LOSS": "ppo"}, "bundled"),
    "combine_topk_select_refused": ("combine", (), {"OPENCLAW_COMBINE_LOSS": "topk_select", "OPENCLAW_TOPK_K": "4"},
                                    "bundled"),
    "topk_select_2nodes_head": ("topk_select_2nodes", (), {"OPENCLAW_CONFIG": FIXED.format("combine"),
                                                           "MASTER_ADDR": "10.0.0.1"}, "bundled"),
    "topk_select_2nodes_worker": ("topk_select_2nodes", (), {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "1"}, "bundled"),
    "topk_select_2nodes_loopback": ("topk_select_2nodes", (), {}, "bundled"),
    "topk_select_2nodes_actor_over_nodes": ("topk_select_2nodes", (), {"MASTER_ADDR": "10.0.0.1", "ACTOR_GPUS": "12",
                                                                       "ROLLOUT_GPUS": "2", "PRM_GPUS": "2"}, "bundled"),
    **{f"qwen35_{m}": (f"qwen35_{m}", (), {"OPENCLAW_CONFIG": FIXED.format(m), "HF_CKPT": "<TMP>/models/Qwen3.5-4B"},
                       "bundled") for m in ("rl", "opd", "combine")},
    # issue #31: one node of 8, two nodes of 8, four nodes of 8 (a 32B model), an existing Ray cluster, and the
    # layouts refused (a TP group over two nodes, ROLLOUT_GPUS read per node, Slime's engine hosts)
    "nodes_1x8": ("rl", (), {"OPENCLAW_CONFIG": FIXED.format("rl"), "CONTEXT_LENGTH": "24576"}, "bundled"),
    "nodes_2x8_head": ("rl", (), {**NODES2, "OPENCLAW_CONFIG": FIXED.format("rl"), "PROXY_HOST": "0.0.0.0",
                                  "SGLANG_API_KEY": "s3cret-proxy", "PRM_API_KEY": "s3cret-judge"}, "bundled"),
    "nodes_2x8_worker": ("rl", (), {**NODES2, "NODE_RANK": "1", "NODE_IP": "10.0.0.2"}, "bundled"),
    "nodes_4x8_head": ("rl", (), {**NODES4, "OPENCLAW_CONFIG": FIXED.format("rl")}, "bundled"),
    "nodes_4x8_32b": ("rl", (), {**NODES4, "OPENCLAW_CONFIG": FIXED.format("rl"), "MODEL_ARGS_FILE": "<TMP>/qwen3-32b.sh",
                                 "TP": "8", "ROTARY_BASE": "1000000"}, "bundled"),
    "nodes_ray_address": ("rl", (), {"NUM_NODES": "2", "GPUS_PER_NODE": "8", "RAY_ADDRESS": "http://10.0.0.1:8265",
                                     "PRM_URL": "http://judge.lan:30000", "ACTOR_GPUS": "8", "ROLLOUT_GPUS": "8",
                                     "OPENCLAW_CONFIG": FIXED.format("rl"), "SGLANG_API_KEY": "s3cret-proxy",
                                     "PROXY_HOST": "0.0.0.0"}, "bundled"),
    "nodes_ray_address_no_judge": ("rl", (), {"NUM_NODES": "2", "GPUS_PER_NODE": "8", "RAY_ADDRESS": "http://10.0.0.1:8265",
                                              "ACTOR_GPUS": "8", "ROLLOUT_GPUS": "6"}, "bundled"),
    "nodes_tp_across_refused": ("rl", (), {**NODES2, "TRAIN_TP": "4"}, "bundled"),
    "nodes_rollout_per_node_refused": ("rl", (), {**NODES2, "ROLLOUT_GPUS": "4"}, "bundled"),
    "nodes_engine_host_refused": ("rl", (), {**NODES4, "NUM_NODES": "2", "ACTOR_GPUS": "4", "ROLLOUT_GPUS": "12"},
                                  "bundled"),
    "rl_lora_options": ("rl_lora", (), {"LORA_RANK": "8", "LORA_ALPHA": "16", "MAX_TOKENS_PER_GPU": "4096",
                                        "TP": "1", "PRM_TP": "1"}, "bundled"),
    # the teacher inside the trainer (slime_hooks/trainer_teacher.py): THUDM/slime's hooks; refused where it cannot run
    "topk_select_teacher_in_trainer": ("topk_select", (), {"OPENCLAW_COMBINE_OPD_TEACHER_SOURCE": "megatron",
                                                           "CONTEXT_LENGTH": "24576"}, "thudm"),
    "topk_select_teacher_in_trainer_scored_refused": ("topk_select", (), {"OPENCLAW_COMBINE_OPD_TEACHER_SOURCE": "megatron",
                                                                          "OPENCLAW_TOPK_HINT_SELECTION": "sequence_optimal",
                                                                          "CONTEXT_LENGTH": "24576"}, "thudm"),
    "opd_teacher_in_trainer": ("opd", (), {"OPENCLAW_COMBINE_OPD_TEACHER_SOURCE": "trainer", "CONTEXT_LENGTH": "24576"}, "thudm"),
    "combine_teacher_in_trainer": ("combine", (), {"OPENCLAW_COMBINE_OPD_TEACHER_SOURCE": "trainer", "CONTEXT_LENGTH": "24576"}, "thudm"),
    "opd_topk_teacher_in_trainer": ("opd_topk", (), {"OPENCLAW_COMBINE_OPD_TEACHER_SOURCE": "trainer", "CONTEXT_LENGTH": "24576"}, "thudm"),
    "combine_teacher_in_trainer_bundled_refused": ("combine", (), {"OPENCLAW_COMBINE_OPD_TEACHER_SOURCE": "trainer", "CONTEXT_LENGTH": "24576"},
                                                   "bundled"),
    "opd_teacher_in_trainer_cp2": ("opd", (), {"OPENCLAW_COMBINE_OPD_TEACHER_SOURCE": "trainer",
                                               "CONTEXT_PARALLEL": "2"}, "thudm"),
    "opd_teacher_in_trainer_estimator_refused": ("opd", (), {"OPENCLAW_COMBINE_OPD_TEACHER_SOURCE": "trainer",
                                                         "CONTEXT_LENGTH": "24576"},
                                                 "bundled"),
    # the bundled Slime of OpenClaw-RL f48ac35 (after its PR #85) passes the data to the postprocess hook
    **{f"{m}_teacher_in_trainer_bundled_pr85": (m, (), {"OPENCLAW_COMBINE_OPD_TEACHER_SOURCE": "trainer",
                                                        "CONTEXT_LENGTH": "24576"}, "bundled_pr85")
       for m in ("opd", "combine", "opd_topk")},
    "rl_lora_teacher_in_trainer_refused": ("rl_lora", (), {"OPENCLAW_COMBINE_OPD_TEACHER_SOURCE": "trainer"},
                                           "bundled"),
    # upstream's run_qwen3_1.7b_openclaw_oel_online.sh: 4 GPUs (2 actor + 1 rollout + 1 judge/teacher)
    **{f"qwen3_1.7b_oel_online{suffix}": ("qwen3_1.7b_oel_online", (), {
        "OPENCLAW_CONFIG": FIXED.format("oel"), "HF_CKPT": "<TMP>/models/Qwen3-1.7B", "STUB_GPUS": "4"}, flavour)
       for suffix, flavour in (("", "bundled"), ("_thudm", "thudm"))},
}


def _env(tmp_path: Path, env: dict[str, str], flavour: str) -> dict[str, str]:
    """Fake Slime checkouts, models and tools under ``tmp_path``; the environment of a dry run."""
    models = tmp_path / "models"
    (models / "Qwen3-4B").mkdir(parents=True)
    (models / "Qwen3.5-4B").mkdir()
    (models / "Qwen3-1.7B").mkdir()
    fixed = tmp_path / "fixed-config"  # the newer cases' run config base: this, not configs/ (whose comments change)
    fixed.mkdir()
    for mode in ("rl", "opd", "combine", "oel"):
        (fixed / f"openclaw_{mode}.yaml").write_text(f"# a fixed {mode} config of the launch goldens\n")
    (models / "judge").mkdir()
    (tmp_path / "ref").mkdir()
    slime = fake_slime(tmp_path / f"slime-{flavour}", flavour)
    stack = tmp_path / "stack"  # a Slime checkout with Megatron-LM beside it
    fake_slime(stack / "slime", flavour)
    (stack / "Megatron-LM").mkdir()
    (tmp_path / "model.sh").write_text("MODEL_ARGS=(--num-layers 2 --hidden-size 64 --norm-epsilon '1e-6')\n")
    (tmp_path / "qwen3-32b.sh").write_text(  # Qwen3-32B's shape (its config.json), as Slime's scripts/models/*.sh
        "MODEL_ARGS=(--swiglu --num-layers 64 --hidden-size 5120 --ffn-hidden-size 25600 --num-attention-heads 64 "
        "--group-query-attention --num-query-groups 8 --use-rotary-position-embeddings --disable-bias-linear "
        "--normalization RMSNorm --norm-epsilon 1e-6 --vocab-size 151936 --kv-channels 128 --qk-layernorm)\n")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in {"nvidia-smi": NVIDIA_SMI, "ray": "#!/bin/sh\nexit 1\n", "curl": "#!/bin/sh\nexit 1\n",
                       "setsid": "#!/bin/sh\nexit 1\n"}.items():
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    base = {"PATH": f"{stubs}:{THIS_PYTHON_FIRST}", "HOME": str(tmp_path), "LANG": "C.UTF-8", "DRY_RUN": "1",
            "SLIME_DIR": str(slime), "HF_CKPT": str(models / "Qwen3-4B"), "PRM_MODEL_PATH": str(models / "judge"),
            "SAVE_CKPT": str(tmp_path / "ckpt"), "RUN_DIR": str(tmp_path / "run"), "USE_WANDB": "0"}
    base.update({k: v.replace("<TMP>", str(tmp_path)) for k, v in env.items()})
    return base


def _run(tmp_path: Path, variant: str, args: tuple[str, ...], env: dict[str, str], flavour: str) -> str:
    res = subprocess.run(["bash", str(script(variant)), *args], env=_env(tmp_path, env, flavour), cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=False)
    text = f"# status {res.returncode}\n# --- stdout\n{res.stdout}# --- stderr\n{res.stderr}"
    return text.replace(str(tmp_path), "<TMP>").replace(str(REPO_ROOT), "<REPO>")


@pytest.mark.parametrize("name", list(CASES))
def test_dry_run_matches_the_recorded_launch(tmp_path: Path, name: str) -> None:
    got = _run(tmp_path, *CASES[name])
    path = GOLDEN / f"{name}.txt"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
    assert path.is_file(), f"{path} missing: record it with OPENCLAW_UPDATE_LAUNCH_GOLDEN=1"
    assert got == path.read_text()


def test_every_recorded_case_is_run() -> None:
    assert {p.stem for p in GOLDEN.glob("*.txt")} == set(CASES)


def test_the_plan_is_read_back_by_bash_word_for_word() -> None:
    """The script evals ``python -m openclaw_rl.launch plan``'s output: every word must come back unchanged."""
    from openclaw_rl.launch.plan import shell_assignments

    words = ["plain", "", "it's", "a b", "$HOME", "`id`", "$(id)", "line\nbreak", "back\\slash", '"dq"', "*", "ünï",
             "--flag=a,b", "'", "''"]
    text = shell_assignments({"OC_X": words, "OC_Y": "it's $x", "OC_Z": ""})
    res = subprocess.run(["bash", "-c", text + '\nprintf "%s\\0" "${OC_X[@]}" "$OC_Y" "$OC_Z"'],
                         capture_output=True, check=True)
    assert res.stdout.decode().split("\0")[:-1] == [*words, "it's $x", ""]


@pytest.mark.parametrize("name", ["rl", "rl_lora", "opd_thudm", "opd_topk", "combine", "rl_extra_args", "rl_quoting",
                                  "rl_model_args_file"])
def test_the_python_argv_is_the_recorded_argv(tmp_path: Path, name: str) -> None:
    """``python -m openclaw_rl.launch plan --json`` (no Bash) gives the recorded ``ray job submit`` words."""
    variant, args, env, flavour = CASES[name]
    base = _env(tmp_path, env, flavour)
    extra = list(args[1:] if args[:1] == ("--dry-run",) else args)
    res = subprocess.run([sys.executable, "-m", "openclaw_rl.launch", "plan", variant, "--script", script(variant).name,
                          "--repo-root", str(REPO_ROOT), "--cwd", str(tmp_path), "--dry-run", "--json", "--", *extra],
                         env=base, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    argv = [w.replace(str(tmp_path), "<TMP>").replace(str(REPO_ROOT), "<REPO>") for w in json.loads(res.stdout)["OC_TRAIN_CMD"]]
    recorded = parse_submit((GOLDEN / f"{name}.txt").read_text().split("# --- stdout\n", 1)[1])
    assert argv == [*recorded.submit, "--", *recorded.entry, *(w for pair in recorded.pairs for w in
                                                                 ((pair[0],) if pair[1] is True else pair))]
