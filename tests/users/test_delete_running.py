"""Deleting a user from a running deployment (``users/deletion.py``): the proxy, its writer, the journal, the
per-user trainer and the embedded engine, while another user keeps chatting."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from support import on_loop, record_generate

from openclaw_oel.store import ExperienceStore
from openclaw_rl.cli import main
from openclaw_rl.embedded.local_users import admit_user_deletion
from openclaw_rl.embedded.trainer import TrainerConfig
from openclaw_rl.embedded.user_trainer import PerUserTrainer
from openclaw_rl.engine.adapters import lora_config
from openclaw_rl.turns import Turn
from openclaw_rl.users.adapters import adapter_name
from openclaw_rl.users.identity import key_namespace
from openclaw_rl.users.store import RunDirs, scan

FRONT = key_namespace("front")
ALICE, BOB = f"{FRONT}/alice", f"{FRONT}/bob"


class Chat:
    """One user's session through the proxy: each call sends the whole conversation so far plus `text`."""

    def __init__(self, base: str, user: str, key: str = "front"):
        self.base, self.messages = base, []
        self.headers = {"Authorization": f"Bearer {key}", "X-User-Id": user, "X-Session-Id": f"s-{user}"}

    def say(self, text: str) -> dict[str, Any]:
        self.messages.append({"role": "user", "content": text})
        r = httpx.post(f"{self.base}/v1/chat/completions", headers=self.headers, timeout=60,
                       json={"model": "tiny", "messages": self.messages, "max_tokens": 4})
        assert r.status_code == 200, r.text
        self.messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
        return r.json()


def settle(proxy: Any) -> None:
    """Every judgement finished and everything written (waits on the proxy's own futures)."""
    asyncio.run_coroutine_threadsafe(proxy.tracker.wait_judged(), proxy.server.loop).result(60)
    proxy.writer.flush()
    proxy.journal.flush()


def user_of(sample: Any) -> str:
    return sample.metadata["user"]


@pytest.fixture
def deployment(lora_engine: Any, judge_server: Any, make_proxy: Any, tiny_model_dir: Path, tmp_path: Path) -> Any:
    """A running proxy (per-user adapters, records) before the embedded engine, a per-user trainer wired
    as ``local`` wires it, and two users who chatted: each has a trained, served, checkpointed adapter,
    a sample in a batch leased to the trainer and not trained yet, and a turn waiting for its next state."""
    from transformers import AutoModelForCausalLM

    core, url = lora_engine
    proxy, base = make_proxy(url, judge_server.url, proxy_api_keys=["front", "plain"],
                             proxy_trusted_user_keys=["front"], proxy_admin_keys=["root"],
                             proxy_per_user_adapters=True, proxy_record_dir=str(tmp_path / "records"))
    store = ExperienceStore.beside(proxy.spool.dir)  # as an earlier OEL run on this spool left it
    store.put(ALICE, ["be formal"])
    store.put(BOB, ["be casual"])
    store.close()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    trainer = PerUserTrainer(TrainerConfig(mode="rl", lr=1e-2, ckpt_dir=str(tmp_path / "ckpt")), model, lora_config(),
                             load_adapter=core.load_adapter, unload_adapter=core.unload_adapter,
                             directory=proxy.service.adapters)
    admit_user_deletion(proxy, trainer)
    chats = {user: Chat(base, user.rpartition("/")[2]) for user in (ALICE, BOB)}
    for chat in chats.values():
        chat.say("hi")
        chat.say("thanks")  # turn 1's next state: judged +1, a sample
    settle(proxy)
    batch, first = proxy.spool.lease(10)
    assert sorted(map(user_of, first)) == [ALICE, BOB]
    trainer.train(first)
    trainer.sync()
    trainer.save()
    proxy.spool.ack(batch)  # as the run's loop does after the step
    for chat in chats.values():
        chat.say("thanks again")  # turn 2's sample; turn 3 waits for its next state
    settle(proxy)
    _, leased = proxy.spool.lease(10)  # handed to the trainer, not trained yet
    assert sorted(map(user_of, leased)) == [ALICE, BOB]
    dirs = RunDirs(proxy.spool.dir, tmp_path / "records", tmp_path / "ckpt")
    return proxy, base, core, trainer, chats, leased, dirs


def test_deleting_a_user_while_running_removes_their_data_adapter_and_nothing_of_the_others(
        deployment: Any, capsys: pytest.CaptureFixture[str]) -> None:
    proxy, base, core, trainer, chats, leased, dirs = deployment
    before = scan(dirs)
    assert before[ALICE].samples_waiting == 1 and before[ALICE].turns_waiting == 1 and before[ALICE].record_lines
    assert before[ALICE].experience and before[ALICE].paths and before[ALICE].turns == 2
    assert sorted(core.adapter_names()) == sorted([adapter_name(ALICE), adapter_name(BOB)])
    bob_adapter = trainer.adapter_state(trainer.users[BOB])

    assert main(["users", "--url", base, "--api-key", "root", "--delete", ALICE, "--spool-dir", str(dirs.spool_dir),
                 "--record-dir", str(dirs.record_dir), "--ckpt-dir", str(dirs.ckpt_dir)]) == 0
    out = capsys.readouterr().out
    assert f"verified: nothing of {ALICE} remains" in out
    removed = dict(part.rsplit(" ", 1) for part in out.split(": ", 1)[1].splitlines()[0].split(", "))
    assert {k: int(v) for k, v in removed.items()} == {
        # turn 3 waited: dropped (its spool row went with its drop, before the spool's deletion ran);
        # records: 2 conversation + 2 judge lines of turns 1-2, and turn 3's drop line; journal: 3 turns
        "dropped_turns": 1, "experience": 1, "spool_samples": 1, "leased_samples": 1, "waiting_turns": 0,
        "record_lines": 5, "journal_lines": 3, "trainer_adapter": 1, "engine_adapter": 1, "adapter_checkpoints": 1}

    # gone: samples (the leased one too), waiting turn, records, journal, experience, adapter everywhere
    after = scan(dirs)
    assert ALICE not in after
    assert [s.sample_id for s in proxy.spool.iter_samples() if user_of(s) == ALICE] == []
    assert ALICE.encode() not in (dirs.spool_dir / "journal.jsonl").read_bytes()
    for name in ("conversations.jsonl", "judge.jsonl"):
        assert ALICE not in (dirs.record_dir / name).read_text()
    assert ALICE not in trainer.users and proxy.service.adapters.served(ALICE) is None
    assert core.adapter_names() == [adapter_name(BOB)]
    assert not (dirs.ckpt_dir / "users" / adapter_name(ALICE)).exists()
    # the waiting turn was counted as a drop with its reason, in the metrics and the journal's counts
    assert proxy.metrics.dropped.labels("user_deleted")._value.get() == 1
    assert proxy.journal.drops["user_deleted"] == 1
    # the other user: every sample, turn, record, experience entry and adapter as before
    assert after[BOB] == before[BOB]
    assert core.adapter_names() == [adapter_name(BOB)] and proxy.service.adapters.served(BOB) is not None
    assert all(torch.equal(v, trainer.adapter_state(trainer.users[BOB])[k]) for k, v in bob_adapter.items())

    # the batch leased before the deletion trains bob only: alice's adapter does not come back
    result = trainer.train(leased)
    assert ALICE not in trainer.users and trainer.users[BOB].trainer.step == 2
    assert result.metrics["rollout/samples"] == 1
    trainer.sync()
    assert core.adapter_names() == [adapter_name(BOB)]

    # bob keeps chatting; alice comes back and starts from the base model, in a fresh session
    chats[BOB].say("and more thanks")
    seen = record_generate(proxy)
    chats[ALICE].messages.clear()
    chats[ALICE].say("hello again")
    assert "lora_path" not in seen[0]
    session = proxy.tracker.sessions[f"{ALICE}\x1fs-alice"]
    assert [t.index for t in session.turns.values()] == [1]
    assert next(iter(session.turns.values())).generation.weight_version == "default"


def test_only_an_admin_or_the_owning_trusted_key_may_delete_and_unknown_users_are_404(deployment: Any) -> None:
    proxy, base, *_ = deployment

    def delete(user: str, key: str | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.delete(f"{base}/v1/users/{user}", headers=headers, timeout=60)

    assert delete(ALICE, None).status_code == 401
    assert delete(ALICE, "wrong").status_code == 401
    assert delete(ALICE, "plain").status_code == 403  # a valid key that is neither admin nor trusted
    plain = key_namespace("plain")
    assert delete(plain, "front").status_code == 403  # a trusted key may delete only its own users
    assert httpx.get(f"{base}/v1/users", headers={"Authorization": "Bearer plain"}, timeout=60).status_code == 403
    assert delete("nobody", "root").status_code == 404
    assert delete(f"{FRONT}/nobody", "front").status_code == 404
    assert ALICE in scan(RunDirs(proxy.spool.dir))  # nothing was deleted by the refused calls
    listed = httpx.get(f"{base}/v1/users", headers={"Authorization": "Bearer front"}, timeout=60).json()["data"]
    assert sorted(r["user"] for r in listed) == [ALICE, BOB]
    r = delete(BOB, "front")  # the owning trusted key may
    assert r.status_code == 200 and r.json()["remaining"] == 0, r.text


def test_a_turn_in_flight_during_the_deletion_keeps_nothing(deployment: Any) -> None:
    """The race: alice's turn is generating when she is deleted; its generation then completes. It was
    counted as a user_deleted drop at the deletion and is not saved or judged afterwards."""
    from array import array

    from openclaw_rl.turns import Generation
    proxy, base, *_ = deployment
    turn = Turn(f"{ALICE}\x1fs-race", "s-race", 0, array("i", [5, 6, 7]), None, None, 1.0)

    on_loop(proxy, lambda: proxy.tracker.begin(turn, None))  # as serving does when the request arrives
    waiting = proxy.tracker.sessions[f"{ALICE}\x1fs-alice"]  # turn 3 waits; say its judgement is running
    r = httpx.delete(f"{base}/v1/users/{ALICE}", headers={"Authorization": "Bearer root"}, timeout=60)
    assert r.status_code == 200 and r.json()["removed"]["dropped_turns"] == 2, r.text  # the race's and turn 3
    durable = on_loop(proxy, lambda: proxy.tracker.complete(turn, Generation.from_lists([9], [-0.1], "x", "stop")))
    assert durable is None  # nothing to save: the writer is never asked
    on_loop(proxy, lambda: proxy.tracker._finish(waiting, 3, (object(), None)))  # the judgement ends now
    assert waiting.judged == {} and waiting.turns == {}  # ignored: nothing of it is built or kept
    settle(proxy)
    assert proxy.spool.pending_turns() == [p for p in proxy.spool.pending_turns() if ALICE not in p]
    assert ALICE not in scan(RunDirs(proxy.spool.dir))
    assert proxy.tracker.unsettled_turns == 1  # bob's waiting turn only


def test_an_experience_extraction_running_during_the_deletion_does_not_write_it_back(tmp_path: Path) -> None:
    from openclaw_oel.scorer import OELScorer

    scorer = OELScorer.__new__(OELScorer)  # only the store and the deletion guard are exercised
    scorer.store = ExperienceStore(tmp_path / "experience.sqlite")
    scorer._pending, scorer._deletions, scorer._deleting = {}, {}, threading.Lock()
    scorer.store.put(ALICE, ["old rule"])
    started = scorer._deletions.get(ALICE, 0)  # an extraction starts (it read the incarnation) ...
    assert scorer.forget_user(ALICE) == 1  # ... alice is deleted ...
    scorer._put_unless_deleted(ALICE, ["new rule"], started)  # ... and it finishes
    assert scorer.store.get(ALICE) is None
    scorer._put_unless_deleted(ALICE, ["after"], scorer._deletions.get(ALICE, 0))  # a new extraction writes
    assert scorer.store.get(ALICE) is not None
    scorer.store.close()


def test_offline_deletion_while_a_proxy_runs_points_at_the_running_route(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from openclaw_rl.samples import TrainingSample
    from openclaw_rl.spool import Spool

    running = Spool(tmp_path / "spool", exclusive=True)
    running.put([TrainingSample(session_id="s", turn=1, kind="rl", prompt_ids=[1], response_ids=[2],
                                rollout_log_probs=[-1.0], loss_mask=[1], reward=1.0, metadata={"user": "alice"})])
    try:
        assert main(["users", "--spool-dir", str(tmp_path / "spool"), "--delete", "alice"]) != 0
        assert "openclaw-rl users --url http://PROXY --api-key ADMIN_KEY --delete alice" in capsys.readouterr().err
    finally:
        running.close()
    assert json.loads(next(Spool(tmp_path / "spool").iter_samples()).to_json())["metadata"]["user"] == "alice"


def test_the_writer_deletes_samples_it_holds_in_memory_and_those_leased(tmp_path: Path) -> None:
    """A full spool: the writer holds the next turn's samples in memory (its overflow); the deletion takes
    the user's out of it, and out of a batch already leased, and says which were leased."""
    from openclaw_rl.metrics import ProxyMetrics
    from openclaw_rl.samples import TrainingSample
    from openclaw_rl.scoring import Outcome
    from openclaw_rl.spool import Spool
    from openclaw_rl.writer import SampleWriter

    def turn_of(user: str, i: int) -> tuple[Turn, Outcome]:
        from array import array

        sample = TrainingSample(session_id=f"s{i}", turn=1, kind="rl", prompt_ids=[1], response_ids=[2],
                                rollout_log_probs=[-1.0], loss_mask=[1], reward=1.0, sample_id=f"{user}-{i}",
                                metadata={"user": user, "session_key": f"{user}\x1fs{i}"})
        turn = Turn(f"{user}\x1fs{i}", f"s{i}", 1, array("i", [1]), None, None, 1.0)
        return turn, Outcome(samples=[sample])

    spool = Spool(tmp_path / "spool", max_bytes=1)  # the first put fills it; later samples wait in memory
    writer = SampleWriter(spool, ProxyMetrics())
    try:
        writer(*turn_of(ALICE, 0))
        writer.flush()
        _, leased = spool.lease(10)
        for i, user in enumerate((ALICE, BOB, ALICE), start=1):
            writer(*turn_of(user, i))
        writer.flush()
        assert len(writer.overflow) == 3
        counts, leased_ids = writer.delete_user(ALICE).result(30)
        assert leased_ids == [f"{ALICE}-0"] and counts["spool_samples"] == 3
        assert [s.sample_id for s in writer.overflow] == [f"{BOB}-2"]
        assert list(spool.iter_samples()) == []
    finally:
        writer.close()
        spool.close()


def test_a_user_listed_again_after_the_deletion_passes_only_with_newer_activity() -> None:
    from openclaw_rl.users.remote import newer_than

    row = {"first_activity": 100.0, "turns": 3, "samples_waiting": 1, "record_lines": 4, "experience": False,
           "adapter_checkpoints": 0}
    assert newer_than(row, 99.0) and not newer_than(row, 101.0)  # came back at 100 / data from before 101
    waiting = {**row, "first_activity": None, "turns": 0, "samples_waiting": 0, "record_lines": 0}
    assert newer_than(waiting, 101.0)  # a new turn waiting for its next state
    assert not newer_than({**waiting, "adapter_checkpoints": 1}, 101.0)  # a checkpoint without any turn: old


def test_deleting_a_user_unloads_their_adapter_from_an_sglang_server(lora_engine: Any, tiny_model_dir: Path,
                                                                     tmp_path: Path) -> None:
    """``train --per-user-adapters``: the trainer's deletion unloads the versioned name through
    ``/unload_lora_adapter`` (the embedded engine's implementation of SGLang's endpoint) and removes its files."""
    from transformers import AutoModelForCausalLM

    from openclaw_rl.samples import TrainingSample
    from openclaw_rl.users.sglang_adapters import SGLangAdapterSync

    core, url = lora_engine
    sync = SGLangAdapterSync(url, tmp_path / "adapters", lora_config())
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    trainer = PerUserTrainer(TrainerConfig(mode="rl", lr=1e-2), model, lora_config(), load_adapter=sync.load,
                             unload_adapter=sync.unload)
    try:
        for user in (ALICE, BOB):
            trainer.train([TrainingSample(session_id="s", turn=1, kind="rl", prompt_ids=[5, 6, 7], response_ids=[8, 9],
                                          rollout_log_probs=[-1.0, -1.0], loss_mask=[1, 1], reward=1.0,
                                          sample_id=f"{user}-1", metadata={"user": user})])
        trainer.sync()
        assert sorted(core.adapter_names()) == sorted([f"{adapter_name(ALICE)}_step_1", f"{adapter_name(BOB)}_step_1"])
        assert trainer.delete_user(ALICE)["engine_adapter"] == 1
        assert core.adapter_names() == [f"{adapter_name(BOB)}_step_1"]
        assert not (tmp_path / "adapters" / adapter_name(ALICE)).exists()
        assert (tmp_path / "adapters" / adapter_name(BOB)).exists()
    finally:
        sync.close()
