"""The synthetic preference task: style detection, requests, and the pre-training chats' shapes."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from openclaw_opd import teacher
from openclaw_rl.embedded import task
from openclaw_rl.embedded.pretrain import encode_chats
from openclaw_rl.embedded.task import (
    REQUESTS,
    STYLE_NAMES,
    STYLES,
    THINK_PREFIX,
    answer,
    correction,
    detect_style,
    instruction_style,
    is_instructed,
    opener_token_ids,
    pretraining_chats,
    thanks,
    with_hint,
)


def test_pool_and_styles() -> None:
    assert len(STYLE_NAMES) >= 4 and 1 / len(STYLE_NAMES) <= 0.3
    assert len({r.text for r in REQUESTS}) == len(REQUESTS) >= 100
    assert task.DEFAULT_STYLE in STYLES
    instructions = [s.instruction for s in STYLES.values()]
    assert len(set(instructions)) == len(instructions)
    assert all(i[0].isupper() and i.endswith(".") for i in instructions)


@pytest.mark.parametrize("style", STYLE_NAMES)
def test_every_answer_is_detected_as_its_style(style: str) -> None:
    rng = random.Random(0)
    for request in REQUESTS[::7]:
        text = answer(style, request, rng)
        assert detect_style(text) == style
        assert detect_style(THINK_PREFIX + text) == style
        assert detect_style("<think>\nhm, " + STYLES["formal"].templates[0] + "\n</think>\n\n" + text) == style


@pytest.mark.parametrize(("text", "expected"), [
    ("", None), ("   ", None), ("Sure, here you go.", None), ("Certainly", "formal"), ("certainly not", "formal"),
    ("hey there", "casual"), ("Heyday is a word", None), ("* one\n* two", "bullet"), ("-- not a list", None),
    ("👍 ok", "emoji"), ("Arrr, matey", "pirate"), ("Arrow keys", None), ("<think>\n\n</think>", None),
    ("\n\n- Plan", "bullet"),
    ("<think>\n\nCertainly.", None),  # an unclosed thinking block is all reasoning: the user sees no reply
])
def test_detect_style_edge_cases(text: str, expected: str | None) -> None:
    assert detect_style(text) == expected


def test_user_messages() -> None:
    rng = random.Random(1)
    request = REQUESTS[3].text
    assert correction("formal", request) == f"No, please answer formally and politely. {request}"
    assert thanks(request, rng).endswith(request)
    for style in STYLE_NAMES:
        assert instruction_style(correction(style, request)) == style
        assert instruction_style(with_hint(request, STYLES[style].instruction)) == style
        for variant in STYLES[style].variants:
            assert instruction_style(f"{request} {variant}") == style
    assert instruction_style(thanks(request, rng)) is None
    assert all(instruction_style(r.text) is None for r in REQUESTS)


def test_hint_form_is_exactly_the_opd_teachers() -> None:
    assert task.HINT_HEADER == teacher.HINT_HEADER
    messages = [{"role": "user", "content": "How do I clean the kitchen?"}]
    hint = STYLES["pirate"].instruction
    enhanced = teacher.enhanced_messages(messages, hint)
    assert enhanced[-1]["content"] == with_hint(messages[0]["content"], hint)


def test_pretraining_chats_are_seeded_and_well_formed() -> None:
    chats = pretraining_chats(600, seed=3)
    assert chats == pretraining_chats(600, seed=3)
    assert chats != pretraining_chats(600, seed=4)
    for chat in chats:
        body = chat[1:] if chat[0]["role"] == "system" else chat
        assert [m["role"] for m in body] == ["user", "assistant"] * (len(body) // 2)
        style = detect_style(chat[-1]["content"])
        assert style is not None
        asked = instruction_style(chat[-2]["content"])
        assert asked is None or asked == style  # instructed answers follow the instruction
    assert any(len(c) >= 6 for c in chats)  # multi-turn sessions are present


def test_pretraining_mix_covers_every_form() -> None:
    chats = pretraining_chats(2000, seed=0)
    last = [c[-2]["content"] for c in chats]
    uninstructed = [c for c in chats if not is_instructed(c)]
    assert 0.35 < len(uninstructed) / len(chats) < 0.6
    counts = Counter(detect_style(c[-1]["content"]) for c in uninstructed)
    assert set(counts) == set(STYLE_NAMES)
    assert max(counts.values()) - min(counts.values()) <= 2  # balanced rounds: exactly uniform
    assert sum(task.HINT_HEADER in m for m in last) > 200
    assert sum(m.startswith("No, please") for m in last) > 200
    assert sum(m.startswith(("Thanks", "Great")) and not is_instructed(c) for m, c in zip(last, chats)) > 100
    # corrections earlier in a session, then an uninstructed final request: must not copy the style
    assert sum(any(m["content"].startswith("No, please") for m in c[:-2]) and not is_instructed(c) for c in chats) > 50


def test_answers_are_short_and_openers_distinct(tokenizer: Any) -> None:
    chats = pretraining_chats(300, seed=0)
    for ids, prompt_len in encode_chats(tokenizer, chats):
        assert len(ids) - prompt_len <= 40
        assert ids[-1] == tokenizer.eos_token_id
    openers = opener_token_ids(tokenizer)
    flat = [t for ids in openers.values() for t in ids]
    assert len(flat) == len(set(flat)) and set(openers) == set(STYLE_NAMES)
