"""``local --judge-hints several`` (openclaw_rl/embedded/hint_judge.py): distinct candidate hints per turn.

The served judge core answers a turn's 3 hint votes with a precise, a vague and a verbose hint; through a
real proxy, its teacher (a scripted core wrapped by the judge, as ``local`` wraps the frozen policy) scores
the sampled reply by which hint it sees, crafted so that the selection rules disagree:

| hint kind (by length) | token id even | token id odd |
|---|---|---|
| precise (shortest) | -3.0 | -3.0 |
| vague (middle) | -1.0 | -1.0 |
| verbose (longest) | -0.5 | -20.0 |

shortest → precise; sequence_optimal → vague (the verbose hint's odd tokens sink its sum); token_optimal →
verbose on even tokens, vague on odd ones. With one hint per turn (the default rule judge) every rule keeps
that hint: ``test_one_hint_per_turn_gives_every_rule_the_same_choice``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support import talk, wait_for_samples

from openclaw_opd.teacher import HINT_HEADER
from openclaw_rl.config import JudgeSettings
from openclaw_rl.embedded import task
from openclaw_rl.embedded.hint_judge import (
    KINDS,
    VAGUE,
    SeveralHintsJudgeModel,
    hint_kind,
    judge_core,
    several_hints_reply,
)
from openclaw_rl.embedded.rule_judge import RuleJudgeModel, judge_reply
from openclaw_rl.judge import (
    HINT_SYSTEM,
    HINT_USER,
    PRM_SYSTEM,
    PRM_USER,
    JudgeClient,
    parse_boxed,
    parse_hint,
)

REQUEST = "How do I clean the kitchen?"
CORRECTION = task.correction("formal", REQUEST)  # "No, please answer formally and politely. How do I …"
CRAFTED = {"precise": (-3.0, -3.0), "vague": (-1.0, -1.0), "verbose": (-0.5, -20.0)}  # kind → (even, odd)


def _render(system: str, user_template: str, state: str) -> str:
    client = JudgeClient(httpx.AsyncClient(), JudgeSettings(url=""))
    return client.render(system, user_template.format(response="Hey! Just clean the kitchen.", role="user",
                                                      next_state=state))


def test_the_votes_on_one_hint_prompt_give_three_kinds_of_hint():
    prompt = _render(HINT_SYSTEM, HINT_USER, CORRECTION)
    hints = []
    for vote in range(6):
        full, short = several_hints_reply(prompt, vote, seed=0)
        assert parse_boxed(full, (1, -1)) == parse_boxed(short, (1, -1)) == 1
        assert parse_hint(full) == parse_hint(short)
        hints.append(parse_hint(full))
    assert hints[:3] == hints[3:]  # vote k and k + 3 agree: deterministic
    assert [hint_kind(h) for h in hints[:3]] == list(KINDS)
    precise, vague, verbose = hints[:3]
    assert precise == "Answer formally and politely." and vague in VAGUE and precise in verbose
    assert len(precise) < len(vague) < len(verbose)  # so shortest keeps the precise one, longest the verbose one
    assert {several_hints_reply(prompt, 1, seed=s)[1] for s in range(12)} > {several_hints_reply(prompt, 1)[1]}


@pytest.mark.parametrize(("system", "template", "state"), [
    (PRM_SYSTEM, PRM_USER, CORRECTION), (PRM_SYSTEM, PRM_USER, "Thanks, perfect!"),
    (HINT_SYSTEM, HINT_USER, "Thanks, perfect! Next: How do I water the garden?"),
    (HINT_SYSTEM, HINT_USER, "ok"),
])
def test_every_other_prompt_is_answered_as_the_rule_judge(system, template, state):
    prompt = _render(system, template, state)
    assert [several_hints_reply(prompt, vote) for vote in range(3)] == [judge_reply(prompt)] * 3


def _kind_seen(tokenizer: Any, prefix: list[int]) -> str | None:
    """The kind of hint the teacher's prompt carries (the text after the hint header), None if none."""
    seen = tokenizer.decode(prefix, skip_special_tokens=False)
    if HINT_HEADER not in seen:
        return None
    return hint_kind(seen.rsplit(HINT_HEADER, 1)[1].split("<|im_end|>", 1)[0])


def _judge_server(tokenizer: Any, core_class: type) -> Iterator[Any]:
    from openclaw_rl.engine.app import make_engine_app
    from openclaw_rl.engine.scripted import ScriptedModel
    from openclaw_rl.servers import BackgroundServer

    def score(prefix: Any, token: int) -> float:
        kind = _kind_seen(tokenizer, list(prefix))
        return -7.0 if kind is None else CRAFTED[kind][token % 2]

    teacher = ScriptedModel(tokenizer, scorer=score, context_length=65536)
    app = make_engine_app(core_class(tokenizer, teacher=teacher), tokenizer, served_model_name="rule-judge",
                          model_path="rules")
    with BackgroundServer(app) as server:
        yield server


@pytest.fixture
def several_hints_judge(tokenizer):
    yield from _judge_server(tokenizer, SeveralHintsJudgeModel)


@pytest.fixture
def one_hint_judge(tokenizer):
    yield from _judge_server(tokenizer, RuleJudgeModel)


RULES = ("shortest", "sequence_optimal", "token_optimal")




def _kept(policy_server: Any, judge: Any, make_proxy: Any, mode: str) -> dict[str, tuple[list[float], str, Any]]:
    """Per rule: (the sample's teacher log-probs, its hint's kind, its hint_picks), one corrected turn each."""
    kept = {}
    for rule in RULES:
        proxy, url = make_proxy(policy_server.url, judge.url, mode=mode, judge_votes=3, judge_max_new_tokens=128,
                                opd_hint_selection=rule)
        talk(url, f"{mode}-{rule}", [REQUEST, CORRECTION, "Thanks, perfect!"])
        # combine also trains the thanked turn (an RL-only sample, no hint)
        s = next(s for s in wait_for_samples(proxy, 1 if mode == "opd" else 2) if "hint" in s.metadata)
        assert {t % 2 for t in s.response_ids} == {0, 1}  # the crafted scores separate the rules on mixed parities
        kept[rule] = (s.teacher_log_probs, hint_kind(s.metadata["hint"]), s.metadata.get("hint_picks"),
                      s.response_ids)
    return kept


@pytest.mark.parametrize("mode", ["opd", "combine"])
def test_with_several_hints_the_three_rules_keep_different_hints(policy_server, several_hints_judge, make_proxy,
                                                                  mode):
    kept = _kept(policy_server, several_hints_judge, make_proxy, mode)
    assert len({tuple(lps) for lps, *_ in kept.values()}) == 3  # three different teacher signals
    ids = kept["shortest"][3]
    assert kept["shortest"][:2] == ([CRAFTED["precise"][t % 2] for t in ids], "precise")
    assert kept["sequence_optimal"][:2] == ([CRAFTED["vague"][t % 2] for t in ids], "vague")
    assert kept["sequence_optimal"][2] == [0, len(ids), 0]  # candidates shortest first: precise, vague, verbose
    lps, _, picks, ids = kept["token_optimal"]
    assert lps == [CRAFTED["verbose" if t % 2 == 0 else "vague"][t % 2] for t in ids]
    assert picks == [0, sum(t % 2 for t in ids), sum(t % 2 == 0 for t in ids)]


def test_one_hint_per_turn_gives_every_rule_the_same_choice(policy_server, one_hint_judge, make_proxy):
    kept = _kept(policy_server, one_hint_judge, make_proxy, "opd")
    assert {kind for _, kind, *_ in kept.values()} == {"precise"}
    assert len({tuple(lps) for lps, *_ in kept.values()}) == 1


def test_local_takes_the_judge_from_its_flag(tokenizer):
    from openclaw_rl.cli import build_parser
    from openclaw_rl.embedded.local_command import local_config

    ns = build_parser().parse_args(["local", "--mode", "opd", "--judge-hints", "several",
                                    "--hint-selection", "token_optimal"])
    assert (local_config(ns).judge_hints, local_config(ns).hint_selection) == ("several", "token_optimal")
    default = local_config(build_parser().parse_args(["local", "--mode", "opd"]))
    assert default.judge_hints == "one"
    assert type(judge_core("one", tokenizer, None, 0)) is RuleJudgeModel
    assert isinstance(judge_core("several", tokenizer, None, 0), SeveralHintsJudgeModel)
    with pytest.raises(ValueError, match="judge-hints"):
        judge_core("many", tokenizer, None, 0)


def test_hint_picks_counts_the_kind_each_sample_kept(tmp_path):
    import json

    from openclaw_rl.bench.hint_picks import hint_picks

    precise, vague = "Answer formally and politely.", VAGUE[0]
    verbose = several_hints_reply(_render(HINT_SYSTEM, HINT_USER, CORRECTION), 2)[1].split("[HINT_START]")[1]
    verbose = verbose.removesuffix("[HINT_END]")
    lines = [{"accepted": True, "hint": precise},  # shortest: one candidate, no candidates list
             {"accepted": True, "hint": vague, "candidates": [{"hint": precise, "tokens": 0},
                                                              {"hint": vague, "tokens": 7},
                                                              {"hint": verbose, "tokens": 3}]},
             {"accepted": False, "hint": ""}]
    path = tmp_path / "judge.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert hint_picks(path) == {"samples": 2, "turns": {"precise": 1, "vague": 1, "verbose": 0},
                                "tokens": {"precise": 0, "vague": 7, "verbose": 3}}
