"""Who is who, and deleting a user (``users/identity.py``, ``users/store.py``, ``openclaw-rl users``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openclaw_oel.store import ExperienceStore
from openclaw_rl.cli import main
from openclaw_rl.errors import BadRequest
from openclaw_rl.samples import TrainingSample
from openclaw_rl.spool import Spool
from openclaw_rl.users.adapters import AdapterDirectory, adapter_name
from openclaw_rl.users.identity import UserResolver, key_namespace
from openclaw_rl.users.store import RunDirs, delete_user, scan

TRUSTED = key_namespace("front-end")


def test_a_trusted_key_names_its_users_and_no_other_key_can() -> None:
    users = UserResolver(["front-end"], "X-User-Id")
    assert users.user(TRUSTED, {"x-user-id": "alice"}) == f"{TRUSTED}/alice"
    assert users.user(TRUSTED, {}) == TRUSTED  # no header: the key's own user
    other = key_namespace("someone")
    assert users.user(other, {"x-user-id": "alice"}) == other  # an untrusted key's header is ignored
    with pytest.raises(BadRequest):
        users.user(TRUSTED, {"x-user-id": "../bob"})


def test_the_proxy_picks_a_users_adapter_only_once_it_is_served() -> None:
    d = AdapterDirectory()
    assert d.lora_for("u1") is None
    d.loaded("u1", "step-3")
    assert d.lora_for("u1") == adapter_name("u1") and d.lora_for("u2") is None
    assert adapter_name("u1") != adapter_name("u2") and adapter_name("u1").isidentifier()
    d.unloaded("u1")
    assert d.lora_for("u1") is None


def sample(user: str, i: int) -> TrainingSample:
    return TrainingSample(session_id=f"s{i}", turn=1, kind="rl", prompt_ids=[1, 2], response_ids=[3],
                          rollout_log_probs=[-0.5], loss_mask=[1], reward=1.0, sample_id=f"{user}-{i}",
                          metadata={"user": user, "session_key": f"{user}\x1fs{i}"})


def a_run(tmp_path: Path) -> RunDirs:
    """Two users' data in every place a run keeps it."""
    dirs = RunDirs.of_local_run(tmp_path)
    spool = Spool(dirs.spool_dir)
    spool.put([sample(u, i) for u in ("alice", "bob") for i in range(3)])
    spool.save_turn(("alice\x1fs9", "e", 1), "{}")
    spool.save_turn(("bob\x1fs9", "e", 1), "{}")
    spool.close()
    lines = [{"ev": "turn", "t": 100.0 + i, "ns": u, "session": f"s{i}", "samples": [{"id": f"{u}-{i}"}]}
             for u in ("alice", "bob") for i in range(2)]
    lines += [{"ev": "batch", "batch": "b1", "samples": ["alice-0"]}, {"ev": "trained", "batch": "b1", "step": 1}]
    (dirs.spool_dir / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    dirs.record_dir.mkdir(parents=True)
    (dirs.record_dir / "conversations.jsonl").write_text(
        "".join(json.dumps({"session_id": "s", "user": u}) + "\n" for u in ("alice", "bob", "bob")))
    store = ExperienceStore.beside(dirs.spool_dir)
    store.put("alice", ["be formal"])
    store.put("bob", ["be casual"])
    store.close()
    for u in ("alice", "bob"):
        step = dirs.ckpt_dir / "users" / adapter_name(u) / "step-000004"
        step.mkdir(parents=True)
        (step / "user.json").write_text(json.dumps({"user": u}))
    return dirs


def test_users_lists_counts_versions_and_last_activity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dirs = a_run(tmp_path)
    alice = scan(dirs)["alice"]
    assert (alice.turns, alice.samples, alice.trained_samples, alice.samples_waiting, alice.turns_waiting) == (2, 2, 1, 3, 1)
    assert alice.adapter_version == "step-4" and alice.last_activity == 101.0 and alice.experience
    assert main(["users", "--run-dir", str(tmp_path), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["user"] for r in rows] == ["alice", "bob"] and rows[1]["record_lines"] == 2


def test_deleting_a_user_removes_everything_of_theirs_and_nothing_else(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    dirs = a_run(tmp_path)
    bob_before = scan(dirs)["bob"]
    assert main(["users", "--run-dir", str(tmp_path), "--delete", "alice"]) == 0
    assert "verified: nothing of alice remains" in capsys.readouterr().out
    after = scan(dirs)
    assert "alice" not in after
    assert after["bob"] == bob_before  # the other user keeps every sample, turn, record, experience, adapter
    spool = Spool(dirs.spool_dir)
    assert sorted(s.sample_id for s in spool.iter_samples()) == ["bob-0", "bob-1", "bob-2"]
    spool.close()
    assert b"alice" not in (dirs.spool_dir / "journal.jsonl").read_bytes().replace(b'"alice-0"', b"")


def test_deletion_refuses_while_a_proxy_holds_the_spool(tmp_path: Path) -> None:
    dirs = a_run(tmp_path)
    running = Spool(dirs.spool_dir, exclusive=True)
    try:
        from openclaw_rl.spool import SpoolLocked

        with pytest.raises(SpoolLocked):
            delete_user(dirs, "alice")
    finally:
        running.close()
    assert scan(dirs)["alice"].samples_waiting == 3


def test_local_flags_name_the_users_and_trust_the_runs_key() -> None:
    from openclaw_rl.cli import build_parser
    from openclaw_rl.embedded.local_command import local_config
    from openclaw_rl.embedded.local_users import LOCAL_USER_KEY, user_settings
    from openclaw_rl.embedded.simulate_groups import group_users, parse_groups

    cfg = local_config(build_parser().parse_args(
        ["local", "--simulate", "--per-user-adapters", "--user-groups", "formal:2,casual", "--adapter-rank", "4"]))
    assert (cfg.per_user_adapters, cfg.user_groups, cfg.adapter_rank) == (True, "formal:2,casual", 4)
    assert user_settings(cfg) == {"proxy_api_keys": [LOCAL_USER_KEY], "proxy_trusted_user_keys": [LOCAL_USER_KEY],
                                  "proxy_per_user_adapters": True}
    assert group_users(parse_groups(cfg.user_groups)) == [("formal-0", "formal"), ("formal-1", "formal"),
                                                          ("casual-0", "casual")]
    assert user_settings(local_config(build_parser().parse_args(["local", "--simulate"]))) == {}
    for bad in ("", "posh:2", "formal:0", "formal:x"):
        with pytest.raises(ValueError, match="--user-groups"):
            parse_groups(bad)


def test_per_user_adapters_train_at_the_adapters_learning_rate_unless_lr_is_given() -> None:
    """The full-weight 5e-4 barely moves a rank-8 LoRA; 5e-3 drifted and collapsed one user's adapter
    (docs/users.md): `local --per-user-adapters` without --lr trains at ADAPTER_LR."""
    from openclaw_rl.cli import build_parser
    from openclaw_rl.embedded.local import MODE_DEFAULTS
    from openclaw_rl.embedded.local_command import local_config
    from openclaw_rl.embedded.local_users import ADAPTER_LR

    def lr(*flags: str) -> float:
        return local_config(build_parser().parse_args(["local", "--simulate", *flags])).lr

    assert ADAPTER_LR == 2.5e-3
    assert lr("--per-user-adapters") == ADAPTER_LR
    assert lr("--per-user-adapters", "--mode", "combine") == ADAPTER_LR
    assert lr("--per-user-adapters", "--lr", "1e-3") == 1e-3
    assert lr() == lr("--user-groups", "formal:1,casual:1") == MODE_DEFAULTS["rl"]["lr"]


def test_the_group_benchmark_figure_has_a_panel_per_seed(tmp_path: Path) -> None:
    """bench_per_user.py's one figure: a panel per seed, each with both setups' groups (simulate_groups.py)."""
    from PIL import Image

    from openclaw_rl.embedded.simulate import Interaction, SimulationResult
    from openclaw_rl.embedded.simulate_groups import GroupSimulation, plot_group_curves, plot_group_panels

    def run(rate_formal: float) -> GroupSimulation:
        groups = {}
        for style, rate in (("formal", rate_formal), ("casual", 1 - rate_formal)):
            result = SimulationResult(style, window=4)
            result.interactions = [Interaction(f"s{i}", 0, style, i < rate * 10, False) for i in range(10)]
            groups[style] = result
        return GroupSimulation(groups, window=4)

    panels = {f"seed {s}": {"shared model": run(0.2), "per-user adapters": run(0.9)} for s in range(3)}
    plot_group_panels(panels, str(tmp_path / "grid.png"))
    plot_group_curves(panels["seed 0"], str(tmp_path / "one.png"))
    grid, one = Image.open(tmp_path / "grid.png"), Image.open(tmp_path / "one.png")
    assert grid.size == (1600, 900)  # 2 x 2 panels (the fourth hidden) of 800 x 450
    assert one.size == (800, 450)
