"""The rule judge: pure rules, prompt reading, and the core served to a real ``JudgeClient``."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from openclaw_rl.config import JudgeSettings
from openclaw_rl.embedded import task
from openclaw_rl.embedded.rule_judge import (
    RuleJudgeModel,
    extract_hint,
    judge_reply,
    read_judge_prompt,
    score_next_state,
)
from openclaw_rl.engine.model import SamplingConfig
from openclaw_rl.errors import BackendUnavailable
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


@pytest.mark.parametrize(("text", "role", "score"), [
    ("Thanks, perfect! Next: How do I water the garden?", "user", 1),
    ("Great, thank you! Next question: Any tips to bake simple bread?", "user", 1),
    ("thank you, that works", "user", 1),
    ("Moving on: what about the budget?", "user", 1),
    (f"No, please answer formally and politely. {REQUEST}", "user", -1),
    ("That's wrong, the answer is 42.", "user", -1),
    ("Please answer as a bulleted list.", "user", -1),
    ("Thanks, but please keep it casual and relaxed.", "user", -1),
    ("Can you try again?", "user", -1),
    ("I asked for Python, not Java.", "user", -1),
    ("ok", "user", 0),
    ("Can you help me fix a slow computer?", "user", 0),
    ("No problem, what's next?", "user", 0),
    ("", "user", 0),
    ('{"files": ["a.txt", "b.txt"]}', "tool", 1),
    ("Sunny, 21 °C", "tool", 1),
    ("Error: file not found", "tool", -1),
    ("Traceback (most recent call last): ...", "tool", -1),
    ('{"ok": false, "reason": "quota"}', "tool", -1),
    ("command exited with exit code 2", "tool", -1),
])
def test_score_next_state(text: str, role: str, score: int) -> None:
    assert score_next_state(text, role) == score


@pytest.mark.parametrize(("text", "hint"), [
    (f"No, please answer formally and politely. {REQUEST}", "Answer formally and politely."),
    (f"No, please keep it casual and relaxed. {REQUEST}", "Keep it casual and relaxed."),
    ("Wrong, use bullet points!", "Use bullet points."),
    ("Could you answer like a pirate?", "Answer like a pirate."),
    ("That's not what I wanted. I want you to write shorter replies.", "Write shorter replies."),
    ("Thanks, perfect! Next: How do I water the garden?", ""),
    ("ok", ""),
])
def test_extract_hint(text: str, hint: str) -> None:
    assert extract_hint(text) == hint


@pytest.mark.parametrize("style", task.STYLE_NAMES)
def test_correction_hints_are_the_pretraining_instructions(style: str) -> None:
    assert extract_hint(task.correction(style, REQUEST)) == task.STYLES[style].instruction


def _client(url: str = "", tokenizer: Any = None, **kw: Any) -> JudgeClient:
    return JudgeClient(httpx.AsyncClient(), JudgeSettings(url=url, **kw), tokenizer=tokenizer)


@pytest.mark.parametrize("with_template", [True, False])
def test_reads_rendered_prompts(tokenizer: Any, with_template: bool) -> None:
    client = _client(tokenizer=tokenizer if with_template else None)
    response = "Hey! Just clean the kitchen, no stress.\n\n## Next state [role: user]\nfake"
    prm = client.render(PRM_SYSTEM, PRM_USER.format(response=response, role="user",
                                                     next_state="Thanks!\n\nNext: more."))
    assert read_judge_prompt(prm) == ("prm", "user", "Thanks!\n\nNext: more.")
    hint = client.render(HINT_SYSTEM, HINT_USER.format(response="x", role="tool", next_state="Error: boom"))
    assert read_judge_prompt(hint) == ("hint", "tool", "Error: boom")
    assert read_judge_prompt("hello") is None
    assert parse_boxed(judge_reply("hello")[0]) == 0


def test_judge_replies_parse_with_the_clients_parsers(tokenizer: Any) -> None:
    client = _client(tokenizer=tokenizer)
    state = task.correction("bullet", REQUEST)
    full, short = judge_reply(client.render(HINT_SYSTEM, HINT_USER.format(response="x", role="user", next_state=state)))
    for text in (full, short):
        assert parse_boxed(text, (1, -1)) == 1 and parse_hint(text) == "Answer as a bulleted list."
    full, short = judge_reply(client.render(PRM_SYSTEM, PRM_USER.format(response="x", role="user", next_state=state)))
    assert parse_boxed(full) == parse_boxed(short) == -1


def test_generate_emits_canonical_ids_then_eos(tokenizer: Any) -> None:
    model = RuleJudgeModel(tokenizer)
    prompt = _client(tokenizer=tokenizer).render(PRM_SYSTEM, PRM_USER.format(response="x", role="user",
                                                                           next_state="Thanks!"))
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)

    async def run(budget: int) -> list[int]:
        sampling = SamplingConfig(temperature=0.6, top_p=1.0, top_k=-1, min_p=0.0, max_new_tokens=budget)
        return [step.token_id async for step in model.generate(prompt_ids, sampling)]

    ids = asyncio.run(run(64))
    text = judge_reply(prompt)[0]
    expected = tokenizer.encode(text, add_special_tokens=False)
    assert ids[:len(expected)] == expected and set(ids[len(expected):]) == {tokenizer.eos_token_id}
    short = asyncio.run(run(len(expected) - 1))  # too small for the reason: the bare verdict still fits
    assert tokenizer.decode(short[:short.index(tokenizer.eos_token_id)]) == "\\boxed{1}"
    assert model.vocab_size == len(tokenizer) and model.eos_token_ids == {tokenizer.eos_token_id}
    with pytest.raises(RuntimeError, match="no teacher"):
        asyncio.run(model.score(prompt_ids, 1, 0))


@pytest.fixture
def judge_url(tokenizer: Any) -> Iterator[str]:
    from openclaw_rl.engine.app import make_engine_app
    from openclaw_rl.engine.scripted import ScriptedModel
    from openclaw_rl.servers import BackgroundServer

    core = RuleJudgeModel(tokenizer, teacher=ScriptedModel(tokenizer, scorer=lambda prefix, token: -0.5))
    app = make_engine_app(core, tokenizer, served_model_name="rule-judge", model_path="rules")
    with BackgroundServer(app) as server:
        yield server.url


def test_served_judge_answers_a_real_judge_client(tokenizer: Any, judge_url: str) -> None:
    response = task.answer("casual", task.REQUESTS[0], random.Random(0))

    async def main() -> None:
        async with httpx.AsyncClient() as http:
            client = JudgeClient(http, JudgeSettings(url=judge_url, votes=3, max_new_tokens=64), tokenizer=tokenizer,
                                 vocab_size=len(tokenizer))
            user = {"role": "user", "content": "Thanks, perfect! Next: How do I water the garden?"}
            good = await client.prm(response, user)
            assert good.score == 1.0 and good.votes == [1, 1, 1] and "\\boxed{1}" in good.representative
            fix = {"role": "user", "content": task.correction("formal", REQUEST)}
            assert (await client.prm(response, fix)).score == -1.0
            assert (await client.prm(response, {"role": "user", "content": "ok"})).score == 0.0
            assert (await client.prm(response, {"role": "tool", "content": "done: 3 files"})).score == 1.0
            assert (await client.prm(response, {"role": "tool", "content": "Error: denied"})).score == -1.0

            hints = await client.hints(response, fix)
            assert [v.score for v in hints.votes] == [1, 1, 1]
            assert hints.best_hint(10) == "Answer formally and politely."
            none = await client.hints(response, user)
            assert [v.score for v in none.votes] == [-1, -1, -1] and none.best_hint(10) == ""

            prompt_ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
            scores = await client.teacher_log_probs(prompt_ids, [100, 200, 300])
            assert scores.log_probs == [-0.5, -0.5, -0.5]  # delegated to the wrapped teacher core

    asyncio.run(main())


def test_teacherless_judge_fails_teacher_calls_cleanly(tokenizer: Any) -> None:
    from openclaw_rl.engine.app import make_engine_app
    from openclaw_rl.servers import BackgroundServer

    app = make_engine_app(RuleJudgeModel(tokenizer), tokenizer, served_model_name="rule-judge", model_path="rules")

    async def main(url: str) -> None:
        async with httpx.AsyncClient() as http:
            # the 500 is retried like any 5xx (judge_retry.py): once, at once, here
            client = JudgeClient(http, JudgeSettings(url=url, votes=1, max_new_tokens=32, retry_attempts=2,
                                                     retry_backoff_s=0), tokenizer=tokenizer)
            assert (await client.prm("x", {"role": "user", "content": "Thanks!"})).score == 1.0
            with pytest.raises(BackendUnavailable):
                await client.teacher_log_probs([1, 2, 3], [4, 5])

    with BackgroundServer(app) as server:
        asyncio.run(main(server.url))
