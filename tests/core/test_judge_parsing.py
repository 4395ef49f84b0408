"""Upstream §13 vectors for the judge's vote parsing and majority, plus our thinking-block fix."""

from __future__ import annotations

import pytest

from openclaw_rl.judge import HintJudgement, HintVote, majority_vote, parse_boxed, parse_hint


@pytest.mark.parametrize("votes,score", [([1, 1, -1], 1.0), ([1, -1], 0.0), ([1, None, None], 1.0),
                                         ([None, None], 0.0), ([0, 0, 1], 0.0), ([1, -1, 0], 0.0), ([], 0.0)])
def test_majority_vote(votes, score):
    assert majority_vote(votes) == score


def test_boxed_parsing():
    assert parse_boxed("... \\boxed{-1} ... \\boxed{1}") == 1
    assert parse_boxed("\\boxed{+1}") == 1
    assert parse_boxed("\\boxed{2}") is None
    assert parse_boxed("\\boxed{0}", allowed=(1, -1)) is None
    assert parse_boxed("\\boxed{ -1 }") == -1  # upstream bug 13: whitespace was not matched
    assert parse_boxed("no verdict") is None


def test_scores_inside_the_thinking_block_do_not_vote():
    """Upstream bug 13: a score considered while thinking, or a generation cut mid-thought, voted."""
    assert parse_boxed("<think>could be \\boxed{-1}</think> final \\boxed{1}") == 1
    assert parse_boxed("<think>I think \\boxed{1} but it is cut") is None
    assert parse_boxed("reasoning \\boxed{1}</think>") is None


def test_hint_selection():
    assert parse_hint("[HINT_START] short [HINT_END]") == "short"
    j = HintJudgement([HintVote(1, "short", ""), HintVote(1, "a much longer useful hint", ""),
                       HintVote(1, "a longer useful hint", ""), HintVote(-1, "the longest hint of them all here", "")])
    assert j.best_hint(10) == "a much longer useful hint"
    assert HintJudgement([HintVote(1, "tiny hint", "")]).best_hint(10) == ""


def test_judge_clamp_off_the_event_loop_matches_the_counted_clamp(tokenizer) -> None:
    """The async clamp skips tokenising only when the byte bound leaves the whole budget, and otherwise
    counts (on a worker thread) exactly like the synchronous clamp."""
    import asyncio

    from openclaw_rl.config import JudgeSettings
    from openclaw_rl.errors import BadRequest
    from openclaw_rl.judge import JudgeClient

    prompt = "Judge this reply: caf\u00e9 \U0001f642 " * 40
    n = len(tokenizer.encode(prompt, add_special_tokens=False))
    for context, budget in ((10_000, 512), (n + 100, 512), (n + 3, 512), (n + 512, 512)):
        client = JudgeClient(None, JudgeSettings(url="http://judge", context_length=context, max_new_tokens=budget),
                             tokenizer=tokenizer)
        assert asyncio.run(client.max_new_tokens_async(prompt)) == client.max_new_tokens_for(prompt) == \
            min(budget, context - n)
    full = JudgeClient(None, JudgeSettings(url="http://judge", context_length=n, max_new_tokens=64), tokenizer=tokenizer)
    with pytest.raises(BadRequest):
        asyncio.run(full.max_new_tokens_async(prompt))
