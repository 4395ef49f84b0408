"""OPD and Combine through the real proxy: hint votes, the hinted teacher, and every combine branch.

The scripted teacher scores token t as -(t % 7 + 1)/10 only when the hint is in its prompt, so equal
values prove the teacher saw the enhanced prompt AND scored the turn's original response ids in order.
"""

from __future__ import annotations

import math

from support import HINT, metric, settle, talk, wait_for_samples


def expected_teacher(response_ids: list[int]) -> list[float]:
    return [-((t % 7) + 1) / 10 for t in response_ids]


def test_opd_samples_carry_teacher_log_probs_of_the_exact_response(policy_server, teacher_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, teacher_server.url, mode="opd", judge_votes=3, opd_eval_mode=True)
    talk(url, "o", ["hello", "that is wrong", "thanks", "bye"])
    samples = wait_for_samples(proxy, 1)
    assert len(samples) == 1
    s = samples[0]
    assert (s.kind, s.turn, s.reward) == ("opd", 1, 1.0)
    assert s.metadata["hint"] == HINT
    assert s.teacher_log_probs == expected_teacher(s.response_ids)
    assert s.loss_mask == [1] * s.response_length and s.teacher_topk_log_probs is None
    settle(proxy)
    dropped = {r: metric(proxy, "openclaw_turns_dropped_total", reason=r) for r in ("no_hint", "no_next_state")}
    assert dropped == {"no_hint": 2.0, "no_next_state": 1.0}  # "thanks" and "bye" carry no hint; turn 4 ends
    assert len(proxy.writer.take_eval_scores()) == 4  # eval mode: PRM scores for rollout/prm_eval_score


def test_opd_top_k(policy_server, teacher_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, teacher_server.url, mode="opd", judge_votes=1, opd_distill_topk=3)
    talk(url, "k", ["hello", "that is wrong"])
    s = wait_for_samples(proxy, 1)[0]
    assert len(s.teacher_topk_log_probs) == len(s.teacher_topk_indices) == s.response_length
    assert all(len(row) == 3 and row == sorted(row, reverse=True) for row in s.teacher_topk_log_probs)
    assert all(math.isfinite(x) for row in s.teacher_topk_log_probs for x in row)


def test_no_hint_no_sample(policy_server, teacher_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, teacher_server.url, mode="opd", judge_votes=1)
    talk(url, "n", ["hello", "thanks", "ok"])
    settle(proxy)
    assert proxy.spool.depth() == 0
    assert metric(proxy, "openclaw_turns_dropped_total", reason="no_hint") == 2.0  # "thanks" and "ok" give no hint


def test_every_combine_branch(policy_server, teacher_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, teacher_server.url, mode="combine", judge_votes=1)
    talk(url, "c", ["hello", "that is wrong", "answer in french please", "thanks", "ok"])
    samples = wait_for_samples(proxy, 3)
    branches = [(s.turn, s.metadata["branch"], s.reward) for s in samples]
    assert branches == [(1, "opd+rl", -1.0), (2, "opd", 0.0), (3, "rl", 1.0)]
    opd_rl, opd_only, rl_only = samples
    assert opd_rl.teacher_log_probs == expected_teacher(opd_rl.response_ids)
    assert opd_only.teacher_log_probs == expected_teacher(opd_only.response_ids)
    assert rl_only.teacher_log_probs == rl_only.rollout_log_probs  # no OPD signal: teacher = rollout
    settle(proxy)
    assert metric(proxy, "openclaw_turns_dropped_total", reason="no_hint") == 1.0  # turn 4 ("ok"): no hint, PRM 0


def test_teacher_rescaling_to_the_student_temperature_is_exact_with_the_full_distribution():
    import torch

    from openclaw_opd.teacher import rescale

    torch.manual_seed(0)
    logits = torch.randn(50, dtype=torch.float64) * 3
    lp = torch.log_softmax(logits, -1).tolist()
    for t in (0.6, 1.3):
        target = torch.log_softmax(logits / t, -1)
        for tok in (0, 7, 49):
            assert abs(rescale(lp[tok], lp, t) - target[tok].item()) < 1e-9
    top = sorted(lp, reverse=True)[:20]  # top-20 of 50: the tail bound keeps it close at T < 1
    target = torch.log_softmax(logits / 0.6, -1)
    assert abs(rescale(lp[int(logits.argmax())], top, 0.6) - target.max().item()) < 0.05
