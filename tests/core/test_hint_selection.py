"""Several candidate hints and the rule that picks one (openclaw_opd/selection.py), unit and through the proxy.

The proxy test's judge gives three different accepted hints (one per vote); its teacher scores each
response token by which hint it sees, crafted so that every rule picks something different:

| hint (shortest first) | token id even | token id odd |
|---|---|---|
| A (short)  | -2.0 | -2.0 |
| B (medium) | -0.1 | -9.0 |
| C (long)   | -1.0 | -1.0 |

longest → C everywhere; shortest → A; sequence_optimal → C (B's odd tokens sink its sum);
token_optimal → B on even tokens, C on odd ones.
"""

from __future__ import annotations

import itertools
import math

import pytest
from support import metric, scripted_server, settle, wait_for_samples

from openclaw_opd.selection import hint_candidates, hints_to_score, select
from openclaw_opd.teacher import TeacherSignal
from openclaw_rl.config import load_settings
from openclaw_rl.judge import HintJudgement, HintVote


def sig(lps: list[float], mask: list[int] | None = None, topk: bool = False) -> TeacherSignal:
    s = TeacherSignal(list(lps), mask or [1] * len(lps))
    if topk:
        s.topk_log_probs = [[lp, -math.inf] for lp in lps]
        s.topk_indices = [[int(-lp * 10), 0] for lp in lps]
    return s


def test_candidates_are_accepted_hints_deduplicated_shortest_first_capped():
    votes = HintJudgement([HintVote(1, "  a long enough hint, the longest one  ", ""), HintVote(1, "short", ""),
                           HintVote(-1, "a rejected vote's hint text", ""), HintVote(1, "a medium hint text", ""),
                           HintVote(1, "a medium hint text", ""), HintVote(1, "another hint here!", "")])
    assert hint_candidates(votes, 10, 5) == ["a medium hint text", "another hint here!",
                                             "a long enough hint, the longest one"]
    assert hint_candidates(votes, 10, 2) == ["a medium hint text", "another hint here!"]
    assert hints_to_score(votes, "shortest", 10, 3) == ["a medium hint text"]
    assert hints_to_score(votes, "longest", 10, 3) == ["  a long enough hint, the longest one  "]  # as before
    assert hints_to_score(votes, "token_optimal", 10, 3) == hint_candidates(votes, 10, 3)
    assert hints_to_score(HintJudgement([HintVote(1, "short", "")]), "sequence_optimal", 10, 3) == []


def test_each_rule_picks_what_it_should():
    a, b, c = sig([-2.0] * 4, topk=True), sig([-0.1, -9.0, -0.1, -9.0], topk=True), sig([-1.0] * 4, topk=True)
    assert select([a, b, c], "shortest").signal is a
    assert select([a, b, c], "longest").signal is a  # the caller scored only the longest hint
    seq = select([a, b, c], "sequence_optimal")
    assert seq.signal is c and seq.picks == [2] * 4
    tok = select([a, b, c], "token_optimal")
    assert tok.picks == [1, 2, 1, 2] and tok.counts(3) == [0, 2, 2]
    assert tok.signal.log_probs == [-0.1, -1.0, -0.1, -1.0]
    assert tok.signal.topk_log_probs == [b.topk_log_probs[0], c.topk_log_probs[1], b.topk_log_probs[2],
                                         c.topk_log_probs[3]]
    assert tok.signal.topk_indices == [[1, 0], [10, 0], [1, 0], [10, 0]]
    # ties go to the shorter hint (upstream's argmax: the first maximum)
    assert select([c, sig([-1.0] * 4)], "sequence_optimal").picks == [0] * 4
    assert select([c, sig([-1.0] * 4)], "token_optimal").picks == [0] * 4


def test_token_optimal_prefers_a_candidate_that_scored_the_position():
    unscored = sig([-0.01, -3.0], mask=[0, 1])  # position 0 unscored: holds the rollout log-prob
    scored = sig([-2.0, -2.0])
    tok = select([unscored, scored], "token_optimal")
    assert tok.picks == [1, 1] and tok.signal.mask == [1, 1]
    none = select([sig([-0.5], mask=[0]), sig([-0.7], mask=[0])], "token_optimal")
    assert none.signal.mask == [0] and none.picks == [0]


@pytest.mark.parametrize("value", ["best", "", "Token_Optimal"])
def test_an_unknown_rule_is_refused(value):
    with pytest.raises(ValueError, match="openclaw_opd_hint_selection"):
        load_settings({"opd_hint_selection": value}, env={})
    with pytest.raises(ValueError, match="openclaw_opd_max_hint_candidates"):
        load_settings({"opd_max_hint_candidates": 0}, env={})
    env = {"OPENCLAW_TOPK_HINT_SELECTION": "token_optimal", "OPENCLAW_TOPK_MAX_CAND": "2"}
    assert (load_settings(env=env).opd.hint_selection, load_settings(env=env).opd.max_hint_candidates) == \
        ("token_optimal", 2)


HINTS = ("Reply in French.", "Answer in French, please do.", "Answer in French: the user asked for it twice.")
CRAFTED = {0: (-2.0, -2.0), 1: (-0.1, -9.0), 2: (-1.0, -1.0)}  # candidate → (even token, odd token)


@pytest.fixture
def three_hint_teacher(tokenizer):
    """A judge whose hint votes give HINTS in turn (PRM votes: -1 on 'wrong'), scoring as the table above."""
    turn = itertools.count()

    def reply(prompt: str) -> str:
        state = prompt.split("## Next state", 1)[-1].lower()
        if "[HINT_START] and [HINT_END]" in prompt:
            if "wrong" not in state:
                return "\\boxed{-1}"
            return f"\\boxed{{1}} [HINT_START]{HINTS[next(turn) % 3]}[HINT_END]"
        return "\\boxed{-1}" if "wrong" in state else "\\boxed{0}"

    def score(prefix, token: int) -> float:
        seen = tokenizer.decode(list(prefix)[-200:], skip_special_tokens=False)
        k = max((i for i, h in enumerate(HINTS) if h in seen), default=None)
        return -5.0 if k is None else CRAFTED[k][token % 2]

    with scripted_server(tokenizer, reply, scorer=score) as server:
        yield server


def expected(ids: list[int], rule: str) -> list[float]:
    pick = {"shortest": lambda t: 0, "longest": lambda t: 2, "sequence_optimal": lambda t: 2,
            "token_optimal": lambda t: 1 if t % 2 == 0 else 2}[rule]
    return [CRAFTED[pick(t)][t % 2] for t in ids]


@pytest.mark.parametrize("mode", ["opd", "combine"])
@pytest.mark.parametrize("rule", ["longest", "shortest", "sequence_optimal", "token_optimal"])
def test_the_proxy_keeps_the_rules_choice(policy_server, three_hint_teacher, make_proxy, mode, rule):
    from test_opd_combine_modes import talk

    proxy, url = make_proxy(policy_server.url, three_hint_teacher.url, mode=mode, judge_votes=3,
                            opd_hint_selection=rule)
    talk(url, f"{mode}-{rule}", ["hello", "that is wrong", "ok"])
    s = wait_for_samples(proxy, 1)[0]
    ids = s.response_ids
    assert {t % 2 for t in ids} == {0, 1}  # the crafted scores separate the rules only on mixed parities
    assert s.teacher_log_probs == expected(ids, rule)
    scored = rule in ("sequence_optimal", "token_optimal")
    assert s.metadata.get("hint_candidates") == (list(HINTS) if scored else None)
    if rule == "token_optimal":
        assert s.metadata["hint_picks"] == [0, sum(t % 2 == 0 for t in ids), sum(t % 2 for t in ids)]
    settle(proxy)
    assert metric(proxy, "openclaw_turns_dropped_total", reason="teacher_failed") == 0.0
