"""Every documented variable of the launch scripts changes the launch, and the mistakes an adversarial
review made on purpose are refused before anything starts."""

from __future__ import annotations

import os
import re
import shutil

import pytest
from launch_support import (
    COMMON,
    OEL,
    REPO_ROOT,
    Run,
)

from openclaw_rl.config import teacher_source_name

# --- every documented variable of the scripts has an effect ----------------------------------------------

# (variable, value, variant, extra env): each changes the run config or the printed launch plan
SCRIPT_VARIABLES = [
    ("NUM_GPUS", "10", "rl", {}), ("ACTOR_GPUS", "2", "rl", {}), ("ROLLOUT_GPUS", "4", "rl", {"NUM_GPUS": "10"}),
    ("PRM_GPUS", "1", "rl", {"PRM_TP": "1"}), ("TP", "1", "rl", {}), ("PRM_TP", "1", "rl", {}),
    ("TRAIN_TP", "2", "rl", {}), ("REF_LOAD", "/ref", "rl", {}), ("SAVE_CKPT", "/ckpt2", "rl", {}),
    ("PRM_URL", "http://judge:1", "rl", {}), ("PRM_PORT", "31111", "rl", {}), ("PRM_M", "5", "rl", {}),
    ("PRM_TEMPERATURE", "0.3", "rl", {}), ("PRM_MAX_NEW_TOKENS", "1234", "rl", {}),
    ("PRM_MEM_FRACTION", "0.5", "rl", {}), ("PROXY_HOST", "0.0.0.0", "rl", {"ALLOW_INSECURE_BIND": "1"}),
    ("PORT", "30123", "rl", {}), ("SGLANG_API_KEY", "k", "rl", {}),
    ("ALLOW_INSECURE_BIND", "1", "rl", {"PROXY_HOST": "0.0.0.0", "SGLANG_API_KEY": "k"}),
    ("SERVED_MODEL_NAME", "m2", "rl", {}), ("TOOL_CALL_PARSER", "hermes", "rl", {}),
    ("OPENCLAW_RECORD_ENABLED", "0", "rl", {}), ("ROLLOUT_TEMPERATURE", "0.9", "rl", {}),
    ("OPENCLAW_EVAL_MODE", "0", "opd", {}), ("OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY", "7", "opd", {}),
    ("OPENCLAW_COMBINE_W_RL", "0.5", "combine", {}), ("OPENCLAW_COMBINE_W_OPD", "0.25", "combine", {}),
    ("TEACHER_URL", "http://teacher:1", "opd", {}), ("TEACHER_MODEL_PATH", "/teacher", "combine", {}),
    ("TEACHER_API_KEY", "k", "opd", {}), ("OPENCLAW_TOPK_HINT_SELECTION", "token_optimal", "combine", {}),
    ("OPENCLAW_TOPK_MAX_CAND", "2", "opd", {}), ("OPENCLAW_TOPK_SUBSET_MODE", "overlap", "opd_topk", {}),
    ("ROLLOUT_BATCH_SIZE", "8", "rl", {}), ("LR", "2e-6", "rl", {}), ("SAVE_INTERVAL", "5", "rl", {}),
    ("MEM_FRACTION_STATIC", "0.7", "rl", {}), ("MAX_TOKENS_PER_GPU", "1000", "rl", {}),
    ("KL_LOSS_COEF", "0.01", "rl", {}), ("ROTARY_BASE", "1000000", "rl", {}), ("CONTEXT_LENGTH", "16384", "rl", {}),
    ("LORA_RANK", "8", "rl_lora", {}), ("LORA_ALPHA", "16", "rl_lora", {}),
    ("LORA_TARGET_MODULES", "q_proj,v_proj", "rl_lora", {}),
    ("USE_WANDB", "1", "rl", {"WANDB_API_KEY": "w"}), ("WANDB_PROJECT", "p2", "rl", {"USE_WANDB": "1", "WANDB_KEY": "w"}),
    ("WANDB_KEY", "w", "rl", {"USE_WANDB": "1"}), ("WANDB_API_KEY", "w", "rl", {"USE_WANDB": "1"}),
    ("MASTER_ADDR", "10.0.0.1", "rl", {}), ("RAY_PORT", "6390", "rl", {}), ("RAY_DASHBOARD_PORT", "8290", "rl", {}),
    ("RAY_TEMP_DIR", "/tmp/r2", "rl", {}), ("PYTHON", shutil.which("python3") or "python3", "rl", {}),
    ("PYTHONPATH", "/extra", "rl", {}),
    ("OPD_ADVANTAGE", "estimator", "opd", {"SKIP_SLIME_FEATURE_CHECK": "1"}),
    ("SKIP_SLIME_FEATURE_CHECK", "1", "rl", {}), ("ALLOW_LORA_FALLBACK", "1", "combine_lora", {}),
    ("OPENCLAW_TOPK_K", "8", "topk_select", {}), ("OPENCLAW_TOPK_ADV_DIFF_CLIP", "2.0", "topk_select", {}),
    ("NUM_NODES", "2", "rl", {"MASTER_ADDR": "10.0.0.1", "ACTOR_GPUS": "8", "ROLLOUT_GPUS": "6"}),
    ("GPUS_PER_NODE", "10", "topk_select_2nodes", {"MASTER_ADDR": "10.0.0.1", "ROLLOUT_GPUS": "8"}),
    ("NODE_IP", "10.0.0.2", "topk_select_2nodes", {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "1"}),
    ("RAY_ADDRESS", "http://10.0.0.1:8265", "topk_select_2nodes", {"PRM_URL": "http://judge:1", "ROLLOUT_GPUS": "8"}),
    ("SINGLE_HOST_NODES", "1", "topk_select_2nodes", {}),
    ("CONTEXT_PARALLEL", "4", "rl", {}), ("GPU_MEMORY_GB", "141", "rl", {}),

]
# Documented variables that change what a real launch does but not the dry-run printout (fixture paths,
# timeouts of the waits), or whose dry-run effect other tests check with their own files.
NOT_IN_DRY_RUN = {"SLIME_DIR", "HF_CKPT", "PRM_MODEL_PATH", "RUN_DIR", "MEGATRON_DIR", "MODEL_ARGS_FILE",
                  "OPENCLAW_CONFIG", "PRM_API_KEY", "JUDGE_STARTUP_TIMEOUT", "RAY_START_TIMEOUT",
                  "NODE_RANK"}  # a worker node prints no job: launch-golden/topk_select_2nodes_worker.txt


def _documented_script_variables() -> set[str]:
    header = COMMON.read_text().split("\nOC_LIB_DIR=")[0].split("# Environment (")[1]
    names = set(re.findall(r"(?:^#\s+|\s)([A-Z][A-Z0-9_]{2,})(?= \[|\s|/|$)", header, re.M))
    return {n for n in names if n not in {"PRM", "THUDM", "ACTOR", "ROLLOUT", "OPD", "DEF_"}}


def test_every_documented_script_variable_is_tested():
    tested = {v for v, *_ in SCRIPT_VARIABLES} | NOT_IN_DRY_RUN
    assert _documented_script_variables() - tested == set()


# By default only the variables resolved through openclaw_rl.launch (the run config) and the judge/proxy
# ones; every variable with OPENCLAW_TEST_FULL=1 (scripts/run_full_tests.sh): two dry runs each.
_CONFIG_VARIABLES = {"PRM_URL", "SGLANG_API_KEY", "OPENCLAW_RECORD_ENABLED", "PRM_M", "PRM_TEMPERATURE",
                     "PRM_MAX_NEW_TOKENS", "PROXY_HOST", "PORT", "ALLOW_INSECURE_BIND", "SERVED_MODEL_NAME",
                     "TOOL_CALL_PARSER", "ROLLOUT_TEMPERATURE", "OPENCLAW_EVAL_MODE",
                     "OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY", "OPENCLAW_COMBINE_W_RL", "OPENCLAW_COMBINE_W_OPD",
                     "TEACHER_URL", "TEACHER_API_KEY", "OPENCLAW_TOPK_HINT_SELECTION", "OPENCLAW_TOPK_K",
                     "OPENCLAW_TOPK_ADV_DIFF_CLIP", "NUM_NODES"}
_FULL = os.environ.get("OPENCLAW_TEST_FULL") == "1"


@pytest.mark.parametrize(("var", "value", "variant", "extra"), [
    pytest.param(*v, id=v[0], marks=() if v[0] in _CONFIG_VARIABLES or _FULL else pytest.mark.skip(
        reason="shell-only variable: checked with OPENCLAW_TEST_FULL=1 (scripts/run_full_tests.sh)"))
    for v in SCRIPT_VARIABLES])
def test_each_documented_script_variable_changes_the_launch(launch, var, value, variant, extra):
    before = launch(variant, **extra)
    after = launch(variant, **extra, **{var: value})
    assert after.rc == 0, after.err  # before may be a refusal (ALLOW_LORA_FALLBACK)

    def seen(run: Run) -> str:  # status, plan, warnings and run config, without the per-run directory
        config = run.config_text() if run.rc == 0 else ""
        return f"{run.rc}{run.out}{run.err}{config}".replace(str(run.run_dir), "RUN")

    assert seen(before) != seen(after), f"{var}={value} changed nothing"


# --- mistakes an adversarial review made on purpose (each refused before anything starts) -----------------


def test_dry_run_anywhere_among_the_arguments_and_typos_refused(launch):
    run = launch("rl", "--num-rollout", "3", "--dry-run", DRY_RUN="0")
    assert run.rc == 0 and run.slime().flags["--num-rollout"] == "3" and "--dry-run" not in run.out, run.err
    for args, env, says in ((("--dryrun",), {"DRY_RUN": "0"}, "did you mean --dry-run"),
                            (("--dry-run=1",), {"DRY_RUN": "0"}, "did you mean --dry-run"),
                            ((), {"DRY_RUN": "ture"}, "DRY_RUN must be"),
                            ((), {"USE_WANDB": "ture"}, "USE_WANDB must be one of")):
        run = launch("rl", *args, **env)
        assert run.rc == 2 and says in run.err and "ray job submit" not in run.out, (args, env, run.err)


def test_a_double_dash_is_refused_and_a_dry_run_as_a_value_goes_to_slime(launch):
    """'--' would reach Slime, whose parser (argparse) reads every flag after it as a positional and ignores it,
    while the script would still take a --dry-run after it as its own: refused. A --dry-run inside another flag's
    ``=`` value is that flag's value and goes to Slime as it is (a bare --dry-run cannot be a value: argparse
    reads a token starting with -- as a flag, and no Slime or Megatron flag is named --dry-run)."""
    for args in (("--", "--num-rollout", "3"), ("--num-rollout", "3", "--", "--dry-run")):
        run = launch("rl", *args, DRY_RUN="1")
        assert run.rc == 2 and "'--' is not an option here" in run.err and "ray job submit" not in run.out, run.err
    run = launch("rl", "--wandb-group=--dry-run", DRY_RUN="1")
    assert run.rc == 0 and "--wandb-group=--dry-run" in run.out, run.err


@pytest.mark.parametrize(("variant", "env", "says"), [
    ("opd_topk_lora", {}, "refuses to run"),
    ("combine_lora", {}, "refuses to run by default"),
    ("combine_lora", {"ALLOW_LORA_FALLBACK": "1", "OPENCLAW_COMBINE_W_OPD": "e5"}, "cannot apply a teacher weight"),
])
def test_the_python_plan_refuses_what_the_scripts_refuse(variant, env, says, capsys):
    from openclaw_rl.launch.plan import main

    assert main(["plan", variant, "--dry-run"], env={"PATH": os.environ["PATH"], **env}) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(("env", "says"), [
    ({"ROLLOUT_BATCH_SIZE": "0"}, "ROLLOUT_BATCH_SIZE must be at least 1"),
    ({"SAVE_INTERVAL": "0"}, "SAVE_INTERVAL must be at least 1"),
    ({"TP": "0"}, "TP must be at least 1"),
    ({"MEM_FRACTION_STATIC": "1.5"}, "MEM_FRACTION_STATIC must be at most 1"),
    ({"PRM_MEM_FRACTION": "0"}, "PRM_MEM_FRACTION must be above 0"),
    ({"LR": "-1e-5"}, "LR must be above 0"),
    ({"KL_LOSS_COEF": "-0.1"}, "KL_LOSS_COEF must be at least 0"),
    ({"PRM_PORT": "70000"}, "PRM_PORT must be between 1 and 65535"),
    ({"RAY_DASHBOARD_PORT": "0"}, "RAY_DASHBOARD_PORT must be between 1 and 65535"),
    ({"ROLLOUT_TEMPERATURE": "0"}, "must be a number above 0 here"),
    ({"ROLLOUT_TEMPERATURE": "nan"}, "ROLLOUT_TEMPERATURE"),
    ({"PRM_MAX_NEW_TOKENS": "0"}, "PRM_MAX_NEW_TOKENS"),
    ({"PORT": "0"}, "PORT must be a fixed port"),
    ({"PORT": "30010"}, "PRM_PORT and PORT are both 30010"),
    ({"RAY_PORT": "8265"}, "RAY_DASHBOARD_PORT and RAY_PORT are both 8265"),
    ({"TOOL_CALL_PARSER": "qwen2.5"}, "unknown parser 'qwen2.5'"),
    ({"PRM_URL": "http://judge:30010/v1"}, "without /v1"),
    ({"PRM_URL": "http://judge:30010/health?x=1"}, "PRM_URL must look like"),
    ({"LR": "1e999"}, "LR must be a finite number"),
    ({"OPENCLAW_RECORD_ENABLED": "ture"}, "OPENCLAW_RECORD_ENABLED must be one of"),
    ({"PORT": "70000"}, "PORT=70000: openclaw_proxy_port"),
    ({"SGLANG_API_KEY": "a b"}, "SGLANG_API_KEY: openclaw_proxy_api_keys"),
    ({"CUDA_VISIBLE_DEVICES": "0, 1,1,2,3,4,5,6,7"}, "must list distinct devices"),
])
def test_values_slime_or_the_judge_could_not_use_are_refused(launch, env, says):
    run = launch("rl", **env)
    assert run.rc == 2 and says in run.err and "ray job submit" not in run.out, run.err


def test_flags_the_run_config_mirrors_cannot_be_passed_again(launch):
    run = launch("rl", "--rollout-temperature", "1.0")
    assert run.rc == 2 and "set ROLLOUT_TEMPERATURE instead" in run.err


def test_a_relative_model_args_file_is_taken_from_where_the_script_started(launch, tmp_path):
    (tmp_path / "qwen3-4B.sh").write_text("MODEL_ARGS=(--num-layers 36)\n")
    run = launch("rl", MODEL_ARGS_FILE="qwen3-4B.sh")
    assert run.rc == 0 and run.slime().flags["--num-layers"] == "36", run.err


def test_parsers_sglang_lacks_are_not_passed_to_it(launch):
    assert "--sglang-tool-call-parser" not in launch("rl", TOOL_CALL_PARSER="auto").slime().flags
    assert launch("rl", TOOL_CALL_PARSER="hermes").slime().flags["--sglang-tool-call-parser"] == "hermes"


def test_values_of_a_users_config_that_the_launch_replaces_are_named(launch, tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text((REPO_ROOT / "configs" / "openclaw_rl.yaml").read_text() + "openclaw_judge_votes: 5\n")
    run = launch("rl", OPENCLAW_CONFIG=str(mine))
    assert run.rc == 0 and "OPENCLAW_CONFIG sets openclaw_judge_votes: 5, but the run uses 3 (set PRM_M" in run.err


def test_upstream_variables_the_scripts_do_not_read_are_named(launch):
    run = launch("rl", HOST="0.0.0.0", OPENCLAW_RECORD_FILE="/tmp/r.jsonl")
    assert run.rc == 0 and "HOST=0.0.0.0 is ignored" in run.err and "OPENCLAW_RECORD_FILE is ignored" in run.err


@pytest.mark.parametrize("variant", ["opd", "combine", "opd_topk", "topk_select"])
def test_a_teacher_inside_the_trainer_runs_on_thudm_slime_with_the_actor_side_hook(launch, variant):
    """Upstream's OPENCLAW_COMBINE_OPD_TEACHER_SOURCE=megatron (here also 'trainer'): the proxy packs the
    hinted prompt's ids, and the actor's frozen teacher (slime_hooks/trainer_teacher.py) scores them, in the
    opd advantage hook or the postprocess hook; context parallelism too (the hook gathers over the CP group)."""
    for value in ("trainer", "megatron"):
        run = launch(variant, flavour="thudm", OPENCLAW_COMBINE_OPD_TEACHER_SOURCE=value, CONTEXT_LENGTH="24576")
        assert run.rc == 0, run.err
        flags = run.slime().flags
        if variant == "opd":
            assert flags["--custom-advantage-function-path"] == "openclaw_opd.loss.on_policy_distillation_advantages"
        else:
            assert flags["--rollout-data-postprocess-path"] == "openclaw_rl.slime_hooks.trainer_teacher.score_and_unpack"
        assert teacher_source_name(run.config()["openclaw_opd_teacher_source"]) == "trainer", run.config_text()
        if variant == "topk_select":  # the scored default rule needs a teacher server: the longest hint instead
            assert run.config()["openclaw_opd_hint_selection"] == "longest" and "scores the longest hint" in run.err
    server = launch(variant, flavour="thudm", OPENCLAW_COMBINE_OPD_TEACHER_SOURCE="inference")
    assert server.rc == 0 and "trainer_teacher" not in server.out
    bad = launch(variant, OPENCLAW_COMBINE_OPD_TEACHER_SOURCE="gpu")
    assert bad.rc != 0 and "OPENCLAW_COMBINE_OPD_TEACHER_SOURCE=gpu: one of" in bad.err
    cp2 = launch(variant, flavour="thudm", OPENCLAW_COMBINE_OPD_TEACHER_SOURCE="trainer", CONTEXT_PARALLEL="2")
    assert cp2.rc == 0 and cp2.slime().flags["--context-parallel-size"] == "2", cp2.err
    refused = launch(variant, flavour="bundled", OPENCLAW_COMBINE_OPD_TEACHER_SOURCE="trainer", CONTEXT_LENGTH="24576")
    # the bundled Slime of 0d034dd calls the postprocess hook with args only: the Slime feature check (a dry run
    # warns and continues; a real run stops there)
    assert "cannot run" in refused.err and "called with the rollout data" in refused.err, refused.err
    pr85 = launch(variant, flavour="bundled_pr85", OPENCLAW_COMBINE_OPD_TEACHER_SOURCE="trainer", CONTEXT_LENGTH="24576")
    assert pr85.rc == 0 and "cannot run" not in pr85.err, pr85.err  # f48ac35 passes the rollout data
    if variant == "opd":  # no advantage hook there: Slime's grpo, then A = teacher - old in the postprocess hook
        flags = pr85.slime().flags
        assert flags["--advantage-estimator"] == "grpo", flags
        assert flags["--rollout-data-postprocess-path"] == "openclaw_rl.slime_hooks.trainer_teacher.score_opd_advantages"


@pytest.mark.parametrize("variant", [OEL, "rl_lora"])
def test_a_teacher_inside_the_trainer_is_refused_where_it_cannot_run(launch, variant):
    run = launch(variant, flavour="thudm", OPENCLAW_COMBINE_OPD_TEACHER_SOURCE="trainer")
    assert run.rc != 0 and "teacher" in run.err and "Traceback" not in run.err, run.err
    print(run.err.strip().splitlines()[-1])


def test_a_scored_hint_rule_with_the_teacher_inside_the_trainer_is_refused(launch):
    run = launch("topk_select", flavour="thudm", OPENCLAW_COMBINE_OPD_TEACHER_SOURCE="trainer", CONTEXT_LENGTH="24576",
                 OPENCLAW_TOPK_HINT_SELECTION="sequence_optimal")
    assert run.rc != 0 and "sequence_optimal scores every candidate" in run.err, run.err


def test_upstream_oel_variables_are_named_with_what_replaces_them(launch):
    run = launch(OEL, OPENCLAW_OEL_SESSION_EXPERIENCE="0", TRAIN_STEPS="10")
    assert run.rc == 0, run.err
    assert "OPENCLAW_OEL_SESSION_EXPERIENCE (upstream's OEL script) is ignored" in run.err and "accumulate" in run.err
    assert "TRAIN_STEPS (upstream's OEL script) is ignored" in run.err
    assert "(upstream's OEL script)" not in launch("opd", TRAIN_STEPS="10").err  # only the OEL script names them


@pytest.mark.parametrize(("env", "says"), [
    ({"ACTOR_GPUS": "3", "TRAIN_TP": "3"}, "TRAIN_TP=3 does not divide the model's 32 attention heads and 8 query groups"),
    ({"TP": "3", "ROLLOUT_GPUS": "3", "PRM_TP": "2", "NUM_GPUS": "9"}, "TP=3 cannot split the model's 32 attention heads"),
])
def test_tensor_parallel_sizes_the_model_cannot_split_are_refused(launch, env, says):
    run = launch("rl", **env)
    assert run.rc == 2 and says in run.err, run.err


def test_a_lora_checkpoints_config_is_read_for_the_rollout_tp(launch, tmp_path):
    (tmp_path / "models" / "Qwen3-4B" / "config.json").write_text('{"num_attention_heads": 32, "num_key_value_heads": 8}')
    assert launch("rl_lora", TP="1").rc == 0
    run = launch("rl_lora", TP="3", ROLLOUT_GPUS="3", PRM_TP="1", NUM_GPUS="6")
    assert run.rc == 2 and "config.json" in run.err, run.err


@pytest.mark.parametrize(("variant", "env", "says"), [
    ("rl", {"OPENCLAW_COMBINE_W_OPD": "0.5"}, "OPENCLAW_COMBINE_W_OPD is ignored: mode rl has no combine settings"),
    ("rl", {"OPENCLAW_EVAL_MODE": "1"}, "OPENCLAW_EVAL_MODE is ignored: mode rl has no opd settings"),
    ("rl", {"LORA_RANK": "8"}, "LORA_RANK ignored by"),
    ("rl_lora", {"TRAIN_TP": "2"}, "TRAIN_TP ignored by"),
    ("rl", {"OPD_ADVANTAGE": "custom"}, "OPD_ADVANTAGE ignored by"),
    ("rl", {"PRM_URL": "http://judge:30000", "PRM_TP": "4"}, "PRM_TP ignored: PRM_URL names an external judge"),
])
def test_variables_the_variant_does_not_read_are_named(launch, variant, env, says):
    run = launch(variant, **env)
    assert run.rc == 0 and says in run.err, run.err


def test_an_ipv6_proxy_address_is_printed_in_brackets_and_a_missing_python_is_named(launch):
    run = launch("rl", PROXY_HOST="::1")
    assert run.rc == 0 and "http://[::1]:30000/v1" in run.out, run.err
    run = launch("rl", PYTHON="python3.99-missing")
    assert run.rc == 2 and "PYTHON=python3.99-missing not found" in run.err


def test_judge_urls_behind_a_gateway_and_mqa_model_args_are_accepted(launch, tmp_path):
    for url in ("https://gw.example.com/sglang", "HTTP://judge:30010//"):
        run = launch("rl", PRM_URL=url)
        assert run.rc == 0, (url, run.err)
    (tmp_path / "mqa.sh").write_text("MODEL_ARGS=(--num-layers 2 --num-attention-heads 32 --group-query-attention)\n")
    assert launch("rl", MODEL_ARGS_FILE="mqa.sh", TRAIN_TP="1").rc == 0  # one query group (Megatron's default)
    run = launch("rl", MODEL_ARGS_FILE="mqa.sh")  # TRAIN_TP 4 cannot split one group
    assert run.rc == 2 and "1 query groups" in run.err and "Traceback" not in run.err, run.err


def test_help_anywhere_prints_help_and_launches_nothing(launch):
    run = launch("rl", "--dry-run", "--help")
    assert run.rc == 0 and "Environment variables" in run.out and "ray job submit" not in run.out


def test_a_dry_run_without_run_dir_writes_nothing_into_the_repository(launch):
    """RUN_DIR's default is results/<run> inside this repository: a dry run (a look at the plan) printed
    the run config and also wrote it there. Without RUN_DIR it now only prints it, and says where a real
    launch writes it."""
    results = REPO_ROOT / "results"
    before = sorted(results.rglob("*")) if results.exists() else None
    run = launch("rl", RUN_DIR="")
    assert run.rc == 0, run.err
    assert f"not written to {results}/" in run.err and "set RUN_DIR" in run.err
    assert "# --- run config (" in run.out and "openclaw_spool_dir:" in run.out
    assert (sorted(results.rglob("*")) if results.exists() else None) == before
