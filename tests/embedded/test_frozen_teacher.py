"""The teacher inside the trainer (openclaw_opd_teacher_source: trainer, upstream PR #85).

The sample carries the hinted prompt's exact ids; the trainer's frozen teacher scores prompt + hint +
response at train time with the student's own forward; the loss sees the same batch keys as with a server.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools

import pytest
import torch
from support import scripted_server, settle, talk, wait_for_samples

from openclaw_rl.config import load_settings
from openclaw_rl.embedded.frozen_teacher import FrozenTeacher, TeacherTokenizerMismatch
from openclaw_rl.embedded.trainer import EmbeddedTrainer, TrainerConfig
from openclaw_rl.samples import TrainingSample

HINT_IDS = [7, 8, 9, 10, 11]  # stands for the rendered hint: only its ids matter to the trainer


@pytest.fixture
def models(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return tok, model


def trainer_samples(tok, n: int = 3, r: int = 6, kind: str = "opd") -> list[TrainingSample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        prompt = tok.encode(f"<|im_start|>user\nquestion {i} please<|im_end|>\n<|im_start|>assistant\n")
        response = torch.randint(20, 200, (r + i,), generator=g).tolist()
        out.append(TrainingSample(session_id=f"s{i}", turn=1, kind=kind, prompt_ids=prompt, response_ids=response,
                                  rollout_log_probs=[-1.0] * len(response), loss_mask=[1] * len(response),
                                  reward=1.0, teacher_prompt_ids=prompt[:-3] + HINT_IDS + prompt[-3:]))
    return out


def capture(trainer: EmbeddedTrainer) -> list[dict]:
    """The views the loss receives (its teacher fields), one per sample."""
    seen: list[dict] = []
    inner = trainer.loss_fn

    def loss(args, view, logits, reducer):
        seen.append({k: view[k] for k in ("teacher_log_probs", "teacher_topk_log_probs", "teacher_topk_indices")
                     if k in view})
        return inner(args, view, logits, reducer)
    trainer.loss_fn = loss
    return seen


@torch.no_grad()
def direct(model: torch.nn.Module, sample: TrainingSample, temperature: float, k: int = 0):
    """A plain full forward of `model` on teacher prompt + response ids: the reference the trainer must match."""
    ids = torch.tensor([sample.teacher_prompt_ids + sample.response_ids])
    p, r = len(sample.teacher_prompt_ids), sample.response_length
    logp = torch.log_softmax(model(input_ids=ids).logits[0, p - 1:p + r - 1].float() / temperature, dim=-1)
    lp = logp.gather(-1, torch.tensor(sample.response_ids).unsqueeze(-1)).squeeze(-1)
    return (lp, *logp.topk(k, dim=-1)) if k else (lp, None, None)


@pytest.mark.parametrize("mode,topk,loss", [("opd", 0, "ppo"), ("opd", 3, "ppo"), ("combine", 0, "ppo"),
                                            ("combine", 4, "topk_select"), ("oel", 3, "ppo")])
def test_the_teacher_log_probs_the_loss_sees_are_a_direct_forward_of_the_frozen_model(models, mode, topk, loss):
    tok, model = models
    initial = copy.deepcopy(model).eval()
    trainer = EmbeddedTrainer(TrainerConfig(mode=mode, rollout_temperature=0.7, distill_topk=topk, combine_loss=loss,
                                            teacher_source="trainer", fidelity_copies=0), model,
                              sync=lambda sd, v: None, tokenizer=tok)
    seen = capture(trainer)
    samples = trainer_samples(tok, kind=mode)
    result = trainer.train(samples)
    assert result.metrics["train/trainer_teacher_samples"] == 3.0
    if loss == "topk_select":  # its surrogate ran on the teacher's K ids of every token (none invalid)
        assert result.metrics["train/distill_subset_size"] == topk and result.metrics["train/teacher_invalid_frac"] == 0
    for s, view in zip(samples, seen):
        lp, top_lp, top_ids = direct(initial, s, 0.7, topk)
        torch.testing.assert_close(view["teacher_log_probs"][0], lp, atol=2e-5, rtol=0)
        if topk:
            torch.testing.assert_close(view["teacher_topk_log_probs"][0], top_lp, atol=2e-5, rtol=0)
            assert torch.equal(view["teacher_topk_indices"][0], top_ids)


@pytest.mark.parametrize("mode,loss", [("opd", "ppo"), ("combine", "topk_select")])
def test_the_student_subset_reads_the_teacher_at_the_students_own_top_k(models, mode, loss):
    """``distill_subset: student`` (upstream's S_t = S^q_t): after a step has moved the policy, the rows the loss
    sees hold the ids of the student's top-K on its own prompt + response, and the frozen teacher's log-probs
    (hinted prompt) at exactly those ids; for some sample they differ from the teacher's own top-K."""
    tok, model = models
    initial = copy.deepcopy(model).eval()
    trainer = EmbeddedTrainer(TrainerConfig(mode=mode, lr=1e-2, rollout_temperature=0.7, distill_topk=3,
                                            distill_subset="student", combine_loss=loss, teacher_source="trainer",
                                            fidelity_copies=0), model, sync=lambda sd, v: None, tokenizer=tok)
    samples = trainer_samples(tok, kind=mode)
    trainer.train(samples)  # the policy moves away from the frozen teacher
    student = copy.deepcopy(model).eval()
    seen = capture(trainer)
    trainer.train(samples)
    differs = False
    for s, view in zip(samples, seen):
        with torch.no_grad():
            ids = torch.tensor([s.prompt_ids + s.response_ids])
            p, r = len(s.prompt_ids), s.response_length
            own = torch.log_softmax(student(input_ids=ids).logits[0, p - 1:p + r - 1].float() / 0.7, dim=-1)
        student_ids = own.topk(3, dim=-1).indices
        _, teacher_top, teacher_ids = direct(initial, s, 0.7, 3)
        assert torch.equal(view["teacher_topk_indices"][0], student_ids)
        teacher_all = torch.log_softmax(initial(input_ids=torch.tensor([s.teacher_prompt_ids + s.response_ids]))
                                        .logits[0, len(s.teacher_prompt_ids) - 1:-1].float() / 0.7, dim=-1)
        torch.testing.assert_close(view["teacher_topk_log_probs"][0], teacher_all.gather(-1, student_ids).detach(),
                                   atol=2e-5, rtol=0)
        differs |= not torch.equal(student_ids, teacher_ids)
    assert differs, "the student's top-K equals the teacher's everywhere: the test would not see a wrong subset"


def test_the_student_subset_needs_the_teacher_inside_the_trainer():
    with pytest.raises(ValueError, match="teacher inside the trainer"):
        load_settings({"mode": "opd", "opd_distill_subset": "student"}, env={})
    assert load_settings({"mode": "opd", "opd_distill_subset": "student", "opd_teacher_source": "megatron"},
                         env={}).opd.distill_subset == "student"


def test_a_changed_policy_leaves_the_frozen_teacher_as_it_was(models):
    tok, model = models
    initial = copy.deepcopy(model).eval()
    trainer = EmbeddedTrainer(TrainerConfig(mode="opd", lr=1e-2, teacher_source="trainer", fidelity_copies=0), model,
                              sync=lambda sd, v: None, tokenizer=tok)
    samples = trainer_samples(tok)
    trainer.train(samples)  # the policy moves (lr 1e-2)
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), initial.parameters()))
    assert all(p is not q for p in trainer.teacher.model.parameters() for q in model.parameters())
    seen = capture(trainer)
    trainer.train(samples)
    for s, view in zip(samples, seen):
        torch.testing.assert_close(view["teacher_log_probs"][0], direct(initial, s, 1.0)[0], atol=2e-5, rtol=0)


def test_server_and_trainer_samples_mix_in_one_batch(models):
    """Combine's RL-only samples keep their own "teacher" (the rollout log-probs) next to trainer-scored ones."""
    tok, model = models
    trainer = EmbeddedTrainer(TrainerConfig(mode="combine", teacher_source="trainer", fidelity_copies=0), model,
                              sync=lambda sd, v: None, tokenizer=tok)
    seen = capture(trainer)
    samples = trainer_samples(tok, kind="combine")
    rl_only = samples[1]
    samples[1] = dataclasses.replace(rl_only, teacher_prompt_ids=None, teacher_log_probs=rl_only.rollout_log_probs)
    trainer.train(samples)
    assert seen[1]["teacher_log_probs"][0].tolist() == rl_only.rollout_log_probs
    assert seen[0]["teacher_log_probs"][0].tolist() != samples[0].rollout_log_probs


def test_a_trainer_without_a_teacher_refuses_samples_that_need_one(models):
    tok, model = models
    trainer = EmbeddedTrainer(TrainerConfig(mode="opd", fidelity_copies=0), model, sync=lambda sd, v: None,
                              tokenizer=tok)
    with pytest.raises(ValueError, match="holds no teacher"):
        trainer.train(trainer_samples(tok))


def test_a_teacher_checkpoint_with_another_tokenizer_is_refused(models, tmp_path):
    tok, model = models
    same, other = tmp_path / "same", tmp_path / "other"
    for path in (same, other):
        model.save_pretrained(path)
    tok.save_pretrained(same)
    changed = copy.deepcopy(tok)
    changed.add_tokens(["<not-in-the-policy>"])
    changed.save_pretrained(other)
    with pytest.raises(TeacherTokenizerMismatch, match="does not share the policy's tokenizer"):
        FrozenTeacher.build(model, str(other), tok)
    teacher = FrozenTeacher.build(model, str(same), tok)  # the same tokenizer: loaded, frozen
    assert not any(p.requires_grad for p in teacher.model.parameters())


def test_samples_round_trip_the_spool_and_refuse_two_sources():
    s = TrainingSample(session_id="a", turn=1, kind="opd", prompt_ids=[1, 2], response_ids=[3],
                       rollout_log_probs=[-0.1], loss_mask=[1], reward=1.0, teacher_prompt_ids=[1, 9, 2])
    back = TrainingSample.from_row(*s.to_row())  # what the spool stores and reads
    assert back.teacher_prompt_ids == [1, 9, 2] and back.teacher_source == "trainer"
    with pytest.raises(ValueError, match="not both"):
        TrainingSample(session_id="a", turn=1, kind="opd", prompt_ids=[1, 2], response_ids=[3],
                       rollout_log_probs=[-0.1], loss_mask=[1], reward=1.0, teacher_prompt_ids=[1],
                       teacher_log_probs=[-0.2])


@pytest.mark.parametrize("value,expected", [("trainer", "trainer"), ("megatron", "trainer"), (" MCore ", "trainer"),
                                            ("inference", "server"), ("server", "server")])
def test_the_setting_takes_upstreams_environment_variable(value, expected):
    s = load_settings({"mode": "combine"}, env={"OPENCLAW_COMBINE_OPD_TEACHER_SOURCE": value})
    assert s.opd.teacher_source == expected


@pytest.mark.parametrize("values,match", [
    ({"opd_teacher_source": "nowhere"}, "not one of server, trainer"),
    ({"opd_teacher_source": "trainer", "opd_teacher_url": "http://127.0.0.1:1"}, "one or the other"),
    ({"opd_teacher_source": "trainer", "opd_hint_selection": "token_optimal"}, "use longest or shortest"),
    ({"opd_teacher_checkpoint": "/x"}, "teacher_source: trainer too"),
])
def test_contradictory_settings_are_refused(values, match):
    with pytest.raises(ValueError, match=match):
        load_settings({"mode": "opd", **values}, env={})


HINT = "Answer in French, please."




@pytest.fixture
def hint_judge(tokenizer):
    """Hint votes give HINT on a 'wrong' next state."""
    def reply(prompt: str) -> str:
        state = prompt.split("## Next state", 1)[-1].lower()
        if "[HINT_START] and [HINT_END]" in prompt and "wrong" in state:
            return f"\\boxed{{1}} [HINT_START]{HINT}[HINT_END]"
        return "\\boxed{-1}" if "wrong" in state else "\\boxed{0}"

    with scripted_server(tokenizer, reply) as server:
        yield server


def test_the_scorer_stores_the_hinted_prompt_ids_and_calls_no_teacher(policy_server, hint_judge, make_proxy,
                                                                    tokenizer, monkeypatch):
    from openclaw_opd.teacher import enhanced_messages
    from openclaw_rl.chat import ChatRenderer
    from openclaw_rl.judge import JudgeClient

    calls = itertools.count()

    async def counted(self, *args, **kwargs):
        next(calls)
        raise AssertionError("teacher_source trainer must not ask a server for teacher log-probs")
    monkeypatch.setattr(JudgeClient, "teacher_log_probs", counted)
    proxy, url = make_proxy(policy_server.url, hint_judge.url, mode="opd", opd_teacher_source="trainer")
    talk(url, "t", ["hello", "that is wrong", "ok"])
    s = wait_for_samples(proxy, 1)[0]
    settle(proxy)
    assert s.teacher_log_probs is None and s.teacher_source == "trainer" and s.metadata["hint"] == HINT
    first_turn = [{"role": "user", "content": "hello"}]
    _, want = ChatRenderer(tokenizer).render(enhanced_messages(first_turn, HINT))
    assert s.teacher_prompt_ids == list(want)  # rendered once from the messages + hint, as ids
    assert HINT in tokenizer.decode(s.teacher_prompt_ids) and HINT not in tokenizer.decode(s.prompt_ids)
    assert next(calls) == 0  # the scorer asked no server for teacher log-probs


def test_oel_takes_the_trainer_teacher_with_its_own_k():
    """OEL's teacher is the policy on the experience-augmented prompt: the trainer's teacher fills oel.topk rows."""
    from openclaw_rl.embedded.frozen_teacher import trainer_teacher_source, trainer_topk

    oel = load_settings({"mode": "oel", "opd_teacher_source": "trainer", "oel_topk": 7}, env={})
    assert (trainer_teacher_source(oel), trainer_topk(oel, 0)) == ("trainer", 7)
    opd = load_settings({"mode": "opd", "opd_teacher_source": "trainer", "opd_distill_topk": 2}, env={})
    assert (trainer_teacher_source(opd), trainer_topk(opd, 2)) == ("trainer", 2)
    rl = load_settings({"mode": "rl", "opd_teacher_source": "trainer"}, env={})
    assert trainer_teacher_source(rl) == "server"  # no teacher to hold


def test_the_flags_reach_local_and_train(monkeypatch):
    from openclaw_rl.cli import build_parser, settings_from_cli
    from openclaw_rl.embedded.local_command import local_config

    for var in ("OPENCLAW_COMBINE_OPD_TEACHER_SOURCE", "TEACHER_URL"):
        monkeypatch.delenv(var, raising=False)
    cfg = local_config(build_parser().parse_args(["local", "--mode", "opd", "--teacher-source", "megatron",
                                                  "--teacher-checkpoint", "/ckpt"]))
    assert (cfg.teacher_source, cfg.teacher_checkpoint) == ("trainer", "/ckpt")
    assert local_config(build_parser().parse_args(["local", "--mode", "opd"])).teacher_source == "server"
    ns = build_parser().parse_args(["train", "--mode", "combine", "--model", "/m", "--teacher-source", "trainer",
                                    "--teacher-checkpoint", "/ckpt"])
    settings = settings_from_cli(ns)
    assert (settings.opd.teacher_source, settings.opd.teacher_checkpoint) == ("trainer", "/ckpt")
    oel = settings_from_cli(build_parser().parse_args(["train", "--mode", "oel", "--model", "/m", "--teacher-source",
                                                       "megatron"]))
    assert oel.opd.teacher_source == "trainer"  # OEL's teacher runs in the trainer too (not refused)
