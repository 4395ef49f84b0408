"""The in-trainer teacher on Slime (openclaw_opd_teacher_source: trainer): the rollout side packs the hinted
prompt's ids into the Sample's teacher_log_probs; the actor-side hook scores prompt + hint + response with a
frozen HF teacher and leaves the batch keys the losses read. Driven here on a fake actor batch (the CPU
Slime check runs the same hook through Slime's own actor)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from openclaw_opd.loss import on_policy_distillation_advantages
from openclaw_rl.samples import TrainingSample
from openclaw_rl.slime_hooks.samples import to_slime_sample
from openclaw_rl.slime_hooks.topk import teacher_topk_from_batch
from openclaw_rl.slime_hooks.trainer_teacher import (
    fill_trainer_teacher,
    is_packed_prompt,
    pack_teacher_prompt,
    score_and_unpack,
    unpack_teacher_prompt,
    unpack_teacher_prompt_and_student_ids,
)

HINT_IDS = [7, 8, 9, 10, 11]


@pytest.mark.parametrize("p,r", [(1, 1), (3, 1), (40, 2), (5, 40), (151935, 1)])
def test_a_packed_teacher_prompt_round_trips_and_is_even_width(p, r):
    ids = [(151935 - 7 * i) % 151936 for i in range(p)] if p > 100 else list(range(100, 100 + p))
    packed = pack_teacher_prompt(ids, r, topk=3)
    assert packed.dtype == torch.float32 and packed.size(0) == r and packed.size(1) % 2 == 0
    assert is_packed_prompt(packed)
    assert unpack_teacher_prompt(packed) == (ids, 3)


def test_a_top_k_row_or_plain_log_probs_are_not_taken_for_a_prompt():
    assert not is_packed_prompt(torch.zeros(4, 7))  # [R, 1 + 2K]
    assert not is_packed_prompt(torch.zeros(4))


def samples(tok, n=3, r=5):
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        prompt = tok.encode(f"<|im_start|>user\nquestion {i}<|im_end|>\n<|im_start|>assistant\n")
        response = torch.randint(20, 200, (r + i,), generator=g).tolist()
        out.append(TrainingSample(session_id=f"s{i}", turn=1, kind="opd", prompt_ids=prompt, response_ids=response,
                                  rollout_log_probs=[-1.0] * len(response), loss_mask=[1] * len(response),
                                  reward=1.0, teacher_prompt_ids=prompt[:-3] + HINT_IDS + prompt[-3:]))
    return out


def actor_batch(slime_samples):
    """What Slime's actor holds for these Samples (tokens, response lengths, per-sample float32 teacher field)."""
    return {"tokens": [torch.tensor(s.tokens) for s in slime_samples],
            "response_lengths": [s.response_length for s in slime_samples],
            "teacher_log_probs": [torch.as_tensor(s.teacher_log_probs, dtype=torch.float32) for s in slime_samples]}


@torch.no_grad()
def direct(model, ts: TrainingSample, temperature: float, k: int):
    ids = torch.tensor([ts.teacher_prompt_ids + ts.response_ids])
    p, r = len(ts.teacher_prompt_ids), ts.response_length
    logp = torch.log_softmax(model(input_ids=ids).logits[0, p - 1:p + r - 1].float() / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(ts.response_ids).unsqueeze(-1)).squeeze(-1), logp.topk(k, dim=-1) if k else None


@pytest.mark.parametrize("topk", [0, 3])
def test_the_hook_fills_a_direct_forward_of_the_frozen_teacher_on_the_hinted_prompt(tiny_model_dir, topk):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ts = samples(tok)
    plain = copy.deepcopy(ts[1])
    plain.teacher_prompt_ids, plain.teacher_log_probs = None, [-0.5] * plain.response_length  # its own teacher
    ts[1] = plain
    batch = actor_batch([to_slime_sample(s, teacher_topk=topk) for s in ts])
    assert [is_packed_prompt(t) for t in batch["teacher_log_probs"]] == [True, False, True]
    args = SimpleNamespace(rollout_temperature=0.7)
    assert fill_trainer_teacher(args, batch, model=model) == 2
    for i in (0, 2):
        want, top = direct(model, ts[i], 0.7, topk)
        got = batch["teacher_log_probs"][i]
        assert got.shape == (ts[i].response_length,)
        assert (got - want).abs().max().item() < 1e-5
        if topk:
            assert torch.allclose(got.openclaw_teacher_topk_log_probs, top.values, atol=1e-5)
            assert torch.equal(got.openclaw_teacher_topk_indices, top.indices)
    assert batch["teacher_log_probs"][1].tolist() == [-0.5] * plain.response_length
    assert fill_trainer_teacher(args, batch, model=model) == 0  # idempotent: nothing packed is left
    if topk:
        assert teacher_topk_from_batch(batch) is None  # the plain sample has no top-K: the loss refuses, not guesses


def test_the_opd_advantage_hook_scores_before_it_subtracts(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ts = samples(tok, n=2)
    batch = actor_batch([to_slime_sample(s) for s in ts])
    batch["log_probs"] = [torch.full((s.response_length,), -1.0) for s in ts]
    args = SimpleNamespace(rollout_temperature=1.0)
    from openclaw_rl.slime_hooks import trainer_teacher

    mp = pytest.MonkeyPatch()
    mp.setattr(trainer_teacher, "actor_teacher", lambda a: model)
    try:
        on_policy_distillation_advantages(args, batch)
    finally:
        mp.undo()
    for i, s in enumerate(ts):
        want, _ = direct(model, s, 1.0, 0)
        assert (batch["advantages"][i] - (want + 1.0)).abs().max().item() < 1e-5


def test_the_postprocess_hook_refuses_a_slime_that_passes_no_rollout_data():
    with pytest.raises(ValueError, match="rollout_data"):
        score_and_unpack(SimpleNamespace())


def test_a_packed_prompt_cut_by_context_parallelism_is_refused_not_misread():
    packed = pack_teacher_prompt(list(range(100, 140)), 4)
    batch = {"tokens": [torch.arange(50)], "response_lengths": [4], "teacher_log_probs": [packed[:2]]}  # CP 2 half
    with pytest.raises(ValueError, match="context parallelism"):
        fill_trainer_teacher(SimpleNamespace(rollout_temperature=1.0), batch, model=torch.nn.Linear(1, 1))


def test_the_postprocess_hooks_take_the_bundled_slimes_two_argument_call(tiny_model_dir):
    """The Slime bundled in OpenClaw-RL f48ac35 calls a >= 2-parameter hook as fn(args, rollout_data): the data
    arrives in the second parameter. score_and_unpack scores it; score_opd_advantages sets A = teacher - old."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from openclaw_rl.slime_hooks import trainer_teacher

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ts = samples(tok, n=2)
    args = SimpleNamespace(rollout_temperature=1.0)
    mp = pytest.MonkeyPatch()
    mp.setattr(trainer_teacher, "actor_teacher", lambda a: model)
    try:
        batch = actor_batch([to_slime_sample(s) for s in ts])
        trainer_teacher.score_and_unpack(args, batch)  # the bundled call: (args, rollout_data)
        assert not any(is_packed_prompt(t) for t in batch["teacher_log_probs"])
        batch = actor_batch([to_slime_sample(s) for s in ts])
        batch["log_probs"] = [torch.full((s.response_length,), -1.0) for s in ts]
        batch["advantages"] = [torch.full((s.response_length,), 5.0) for s in ts]  # what grpo left there
        trainer_teacher.score_opd_advantages(args, batch)
    finally:
        mp.undo()
    for i, s in enumerate(ts):
        want, _ = direct(model, s, 1.0, 0)
        assert (batch["advantages"][i] - (want + 1.0)).abs().max().item() < 1e-5
        assert batch["returns"][i] is batch["advantages"][i]


@pytest.mark.parametrize("slime_forwards_topk", [False, True])
def test_beside_the_trainer_teachers_top_k_an_rl_only_samples_rows_ride_packed(monkeypatch, slime_forwards_topk):
    """topk_select with the in-trainer teacher: RL-only samples carry their own top-K rows. They ride packed in
    teacher_log_probs on any Slime (the bundled one forwards teacher_topk_* only when the batch's first sample
    has them), so score_and_unpack leaves every sample with [R] log-probs and top-K attributes."""
    from openclaw_rl.slime_hooks import samples as slime_samples

    monkeypatch.setattr(slime_samples, "_slime_forwards_topk", lambda: slime_forwards_topk)
    r, k = 3, 4
    rl = TrainingSample(session_id="s", turn=1, kind="combine", prompt_ids=[1, 2], response_ids=[5, 6, 7],
                        rollout_log_probs=[-0.5] * r, loss_mask=[1] * r, reward=1.0, teacher_log_probs=[-0.5] * r,
                        teacher_topk_log_probs=[[-0.5] + [float("-inf")] * (k - 1)] * r,
                        teacher_topk_indices=[[t] + [0] * (k - 1) for t in (5, 6, 7)])
    packed = to_slime_sample(rl, teacher_topk=k)
    assert packed.teacher_log_probs.shape == (r, 1 + 2 * k) and not hasattr(packed, "teacher_topk_indices")
    server = to_slime_sample(rl)  # the teacher server's run: unchanged
    assert hasattr(server, "teacher_topk_indices") and (server.teacher_log_probs.dim() == 1) == slime_forwards_topk
    batch = actor_batch([packed])
    score_and_unpack(SimpleNamespace(), 0, batch)
    lp, ids = teacher_topk_from_batch(batch)
    assert batch["teacher_log_probs"][0].tolist() == [-0.5] * r and ids[0][:, 0].tolist() == [5, 6, 7]


def student_ids(ts: TrainingSample, k: int, seed: int) -> list[list[int]]:
    """Stand-in for the rollout engine's top-K ids at each sampled position: distinct ids, none of them
    the teacher's own ranking (so a hook that read the teacher's top-K would not match)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randperm(300, generator=g)[:k].add(50).tolist() for _ in range(ts.response_length)]


def test_student_top_k_ids_ride_beside_the_packed_prompt():
    ids, r = list(range(100, 140)), 4
    student = [[5, 6, 7], [151935, 0, 9], [1, 2, 3], [16777215, 4, 8]]
    packed = pack_teacher_prompt(ids, r, topk=3, student_ids=student)
    assert packed.dtype == torch.float32 and is_packed_prompt(packed)
    prompt, k, got = unpack_teacher_prompt_and_student_ids(packed)
    assert (prompt, k) == (ids, 3) and got.tolist() == student
    assert unpack_teacher_prompt_and_student_ids(pack_teacher_prompt(ids, r, topk=3))[2] is None
    with pytest.raises(ValueError, match="student top-K ids"):
        pack_teacher_prompt(ids, r, topk=3, student_ids=student[:3])  # R rows, K wide: nothing else
    with pytest.raises(ValueError, match="2\\*\\*24"):
        pack_teacher_prompt(ids, r, topk=3, student_ids=[[1 << 24, 0, 0]] * r)


def test_the_hook_reads_the_frozen_teacher_at_the_students_top_k_ids(tiny_model_dir):
    """distill_subset student on Slime: each Sample carries the rollout's top-K ids beside its hinted prompt; the
    actor's teacher top-K rows are the teacher's log-probs at exactly those ids (a direct forward gathered there),
    not its own top-K, and the sampled tokens' log-probs are unchanged."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    k = 4
    ts = samples(tok)
    for n, s in enumerate(ts):
        s.student_topk_indices = student_ids(s, k, n)
    ts = [TrainingSample.from_row(*s.to_row()) for s in ts]  # the spool keeps them (its row: JSON + array blobs)
    batch = actor_batch([to_slime_sample(s, teacher_topk=k) for s in ts])
    args = SimpleNamespace(rollout_temperature=0.7, openclaw_opd_distill_subset="student")
    assert fill_trainer_teacher(args, batch, model=model) == 3
    for i, s in enumerate(ts):
        want, _ = direct(model, s, 0.7, 0)
        ids = torch.tensor([s.teacher_prompt_ids + s.response_ids])
        p, r = len(s.teacher_prompt_ids), s.response_length
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, p - 1:p + r - 1].float() / 0.7, dim=-1)
        at_student = logp.gather(-1, torch.tensor(s.student_topk_indices))
        got = batch["teacher_log_probs"][i]
        assert (got - want).abs().max().item() < 1e-5
        assert torch.equal(got.openclaw_teacher_topk_indices, torch.tensor(s.student_topk_indices))
        assert (got.openclaw_teacher_topk_log_probs - at_student).abs().max().item() < 1e-5
        assert (got.openclaw_teacher_topk_log_probs - logp.topk(k, dim=-1).values).abs().max().item() > 0.1
    lp, top_ids = teacher_topk_from_batch(batch)
    assert [t.tolist() for t in top_ids] == [s.student_topk_indices for s in ts]  # what the loss reads


def test_the_student_subset_without_student_ids_or_with_some_missing_is_refused(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ts = samples(tok, n=2)
    model = torch.nn.Linear(1, 1)
    args = SimpleNamespace(rollout_temperature=1.0, openclaw_opd_distill_subset="student")
    with pytest.raises(ValueError, match="carry no student top-K ids"):
        fill_trainer_teacher(args, actor_batch([to_slime_sample(s, teacher_topk=3) for s in ts]), model=model)
    ts[0].student_topk_indices = student_ids(ts[0], 3, 0)
    with pytest.raises(ValueError, match="1 of 2 packed teacher prompts"):
        fill_trainer_teacher(args, actor_batch([to_slime_sample(s, teacher_topk=3) for s in ts]), model=model)
    with pytest.raises(ValueError, match="need teacher_prompt_ids"):
        TrainingSample(session_id="s", turn=1, kind="opd", prompt_ids=[1], response_ids=[2], rollout_log_probs=[-1.0],
                       loss_mask=[1], reward=0.0, student_topk_indices=[[1, 2]])
