"""`openclaw-rl local`'s small pieces: flags, progress output for logs, drop logging, the provider JSON."""

from __future__ import annotations

import io
import logging

from openclaw_rl.cli import build_parser
from openclaw_rl.embedded.local import (
    LocalConfig,
    configure_local_logging,
    provider_json,
    set_aside_earlier_run,
)
from openclaw_rl.embedded.local_console import PlainProgress, make_progress


def test_session_ttl_flag_defaults_to_serves():
    ns = build_parser().parse_args(["local"])
    assert ns.session_ttl == LocalConfig.session_ttl_s == 900.0
    assert build_parser().parse_args(["local", "--session-ttl", "30"]).session_ttl == 30.0


def test_non_tty_progress_prints_plain_lines_rarely():
    out, now = io.StringIO(), [0.0]
    bar = PlainProgress(every_s=30.0, out=out, clock=lambda: now[0])
    for ready in range(8):  # a burst of updates within 30 s: one line
        bar.update(ready, 8)
    now[0] = 10.0
    bar.update(5, 8)
    now[0] = 45.0
    bar.update(5, 8)
    bar.update(6, 8)  # a change, but within 30 s of the last line
    now[0] = 80.0
    bar.update(7, 8)
    bar.write("step    1 | reward +1.00")
    lines = out.getvalue().splitlines()
    assert lines == ["next batch: 0/8 samples ready", "next batch: 5/8 samples ready", "next batch: 7/8 samples ready",
                     "step    1 | reward +1.00"]
    assert "\r" not in out.getvalue()


def test_progress_is_plain_when_the_stream_is_not_a_terminal():
    assert isinstance(make_progress(True, io.StringIO()), PlainProgress)
    assert make_progress(False, io.StringIO()) is None


def test_drops_are_logged_at_info(caplog):
    logging.getLogger("openclaw_rl.drops").setLevel(logging.WARNING)
    configure_local_logging()
    assert logging.getLogger("openclaw_rl.drops").isEnabledFor(logging.INFO)


def test_provider_json_states_the_engines_context():
    model = provider_json("http://127.0.0.1:30000", "tiny", context_window=32768, max_tokens=64)
    entry = model["models"]["providers"]["openclaw-rl"]["models"][0]
    assert entry["contextWindow"] == 32768 and entry["maxTokens"] == 64
    assert entry["compat"]["sendSessionAffinityHeaders"] is True


def test_local_serves_the_openclaw_variant_unless_simulating():
    from openclaw_rl.embedded.local_command import wants_openclaw_model

    assert wants_openclaw_model(build_parser().parse_args(["local"]))
    assert not wants_openclaw_model(build_parser().parse_args(["local", "--simulate"]))
    assert not wants_openclaw_model(build_parser().parse_args(["local", "--model", "plain"]))
    assert wants_openclaw_model(build_parser().parse_args(["local", "--simulate", "--model", "openclaw"]))
    assert not LocalConfig().openclaw_model  # library callers (and the test fixtures) get the cheap build


def test_centred_rewards_subtract_the_batch_mean_from_the_advantages_and_leave_the_rewards_alone():
    from openclaw_rl.embedded.trainer import build_batch
    from openclaw_rl.samples import TrainingSample

    batch = [TrainingSample(session_id=f"s{i}", turn=1, kind="rl", prompt_ids=[1, 2], response_ids=[3, 4],
                            rollout_log_probs=[-0.5, -0.5], loss_mask=[1, 1], reward=r)
             for i, r in enumerate((1.0, -1.0, -1.0, -1.0))]
    centred = build_batch(batch, center_rewards=True)
    assert [a.tolist() for a in centred["advantages"]] == [[1.5, 1.5], [-0.5, -0.5], [-0.5, -0.5], [-0.5, -0.5]]
    assert centred["rewards"] == [1.0, -1.0, -1.0, -1.0]  # the raw rewards stay as recorded
    assert [a.tolist() for a in build_batch(batch)["advantages"]] == [[1.0, 1.0]] + [[-1.0, -1.0]] * 3  # A = r
    assert LocalConfig().center_rewards is False  # rl mode's default stays upstream's A = r


def test_flags_reach_the_local_config_and_unset_ones_take_the_mode_defaults():
    from openclaw_rl.embedded.local import MODE_DEFAULTS
    from openclaw_rl.embedded.local_command import local_config

    cfg = local_config(build_parser().parse_args(["local", "--mode", "combine"]))
    assert (cfg.lr, cfg.kl_coef, cfg.rollout_batch_size, cfg.center_rewards) == (
        MODE_DEFAULTS["combine"]["lr"], MODE_DEFAULTS["combine"]["kl_coef"],
        int(MODE_DEFAULTS["combine"]["batch_size"]), False)
    cfg = local_config(build_parser().parse_args(
        ["local", "--center-rewards", "--lr", "1e-4", "--kl-coef", "0.05", "--batch-size", "3", "--session-ttl", "60"]))
    assert (cfg.center_rewards, cfg.lr, cfg.kl_coef, cfg.rollout_batch_size, cfg.session_ttl_s) == (
        True, 1e-4, 0.05, 3, 60.0)


def test_a_run_that_cannot_continue_the_last_sets_its_files_aside(tmp_path):
    """Without a checkpoint the run starts from the untrained model: the earlier run's spool (sampled by its
    weights) and metrics (its step numbers) move to previous/<time>/, whole; with one of the same model they
    stay; a run of the other tiny model moves even the checkpoints (they must not be loaded into it)."""
    out = tmp_path / "run"
    (out / "spool").mkdir(parents=True)
    (out / "spool" / "spool.sqlite").write_bytes(b"samples")
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "checkpoints" / "step-000002.tmp").mkdir(parents=True)  # a save cut short resumes nothing
    moved, why = set_aside_earlier_run(out, "tiny-h128-s0-v6")
    assert moved.parent == out / "previous" and "no checkpoint" in why
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "model.json", "previous"]
    assert (moved / "spool" / "spool.sqlite").read_bytes() == b"samples"
    assert (moved / "metrics.jsonl").read_text() == '{"step": 1}\n'
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    again, _ = set_aside_earlier_run(out, "tiny-h128-s0-v6")
    assert again != moved  # a second fresh run in the same second gets its own folder
    (out / "metrics.jsonl").write_text('{"step": 3}\n')
    (out / "checkpoints" / "step-000003").mkdir()
    assert set_aside_earlier_run(out, "tiny-h128-s0-v6") is None and (out / "metrics.jsonl").exists()  # resumed
    other, why = set_aside_earlier_run(out, "tiny-h128-openclaw3-s0-v6")
    assert "another model (tiny-h128-s0-v6)" in why and (other / "checkpoints" / "step-000003").is_dir()
    assert sorted(p.name for p in out.iterdir()) == ["model.json", "previous"]


def test_a_run_with_per_user_adapter_checkpoints_is_continued_not_set_aside(tmp_path):
    """--per-user-adapters saves under checkpoints/users/<adapter>/step-N and resumes each adapter: the
    earlier run's spool stays (it used to be moved to previous/ as if nothing could resume)."""
    out = tmp_path / "run"
    (out / "spool").mkdir(parents=True)
    (out / "checkpoints" / "users" / "lora-alice" / "step-000002.tmp").mkdir(parents=True)
    assert set_aside_earlier_run(out, "tiny-h128-s0-v6") is not None  # a save cut short resumes nothing
    (out / "spool").mkdir()
    (out / "checkpoints" / "users" / "lora-alice" / "step-000002").mkdir()
    assert set_aside_earlier_run(out, "tiny-h128-s0-v6") is None and (out / "spool").is_dir()


def test_combine_loss_topk_select_reaches_proxy_and_trainer_with_k_4_unless_given():
    """`local --mode combine --combine-loss topk_select`: the variant of issue #28, K = 4 by default."""
    import pytest

    from openclaw_rl.config import load_settings
    from openclaw_rl.embedded.local import TOPK_SELECT_K
    from openclaw_rl.embedded.local_command import local_config

    cfg = local_config(build_parser().parse_args(["local", "--mode", "combine", "--combine-loss", "topk_select"]))
    assert (cfg.combine_loss, cfg.distill_topk, cfg.out_dir) == ("topk_select", TOPK_SELECT_K,
                                                                 "runs/local-combine-topk_select")
    cfg = local_config(build_parser().parse_args(["local", "--mode", "combine", "--combine-loss", "topk_select",
                                                  "--distill-topk", "2"]))
    assert cfg.distill_topk == 2
    assert local_config(build_parser().parse_args(["local", "--mode", "combine"])).distill_topk == 0
    with pytest.raises(SystemExit):
        local_config(build_parser().parse_args(["local", "--mode", "rl", "--combine-loss", "topk_select"]))
    with pytest.raises(ValueError, match="openclaw_opd_distill_topk"):  # the proxy refuses it without K
        load_settings({"mode": "combine", "combine_loss": "topk_select"}, env={})
    with pytest.raises(ValueError, match="openclaw_combine_loss"):
        load_settings({"mode": "combine", "combine_loss": "mean"}, env={})
    settings = load_settings({"mode": "combine", "combine_loss": "topk_select", "opd_distill_topk": 4}, env={})
    assert (settings.combine.loss, settings.combine.topk_adv_diff_clip) == ("topk_select", 1.0)
    serve = build_parser().parse_args(["serve", "--mode", "combine", "--combine-loss", "topk_select"])
    assert serve.combine_loss == "topk_select"
