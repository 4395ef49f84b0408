"""OpenClaw's message shapes through the embedded stack: judge rules, task labels, tokenizer, context, replies.

The recorded requests in tests/data/openclaw-golden are held out: the tokenizer corpus uses synthetic
OpenClaw-like text (openclaw_like.py) only.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from openclaw_rl.embedded import openclaw_like, task
from openclaw_rl.embedded.openclaw_golden import golden_prompt_ids, recorded_bodies, reply_styles
from openclaw_rl.embedded.rule_judge import extract_hint, judge_reply, score_next_state

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "openclaw-golden"
STAMP = "[Tue 2026-12-01 10:18 UTC]"


def golden_bodies() -> list[dict[str, Any]]:
    bodies = recorded_bodies(GOLDEN)
    assert bodies, f"golden OpenClaw recordings missing under {GOLDEN}"
    return [body for _, body in bodies]


def test_recorded_bodies_are_every_recorded_request_named_by_file_and_line():
    named = recorded_bodies(GOLDEN)
    expected = [(f"{f.name}#{i}", json.loads(line)["body"]) for f in sorted(GOLDEN.glob("conversation_*.jsonl"))
                for i, line in enumerate(f.read_text().splitlines())]
    assert named == expected and len({name for name, _ in named}) == len(named) >= 8


def test_reply_styles_classifies_each_sampled_reply_by_its_opener(tokenizer, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    body = {"messages": [{"role": "user", "content": "How do I clean the kitchen?"}]}
    replies = reply_styles(model, tokenizer, body, 6, seed=1, max_new_tokens=12)
    assert len(replies) == 6 and reply_styles(model, tokenizer, body, 6, seed=1, max_new_tokens=12) == replies
    assert all(style == task.detect_style(text) for style, text in replies)
    assert any(style is not None for style, _ in replies)  # the task model answers in its styles


@pytest.mark.parametrize(("text", "score"), [
    ("No.", -1), ("Thanks, perfect! Next: How do I water the garden?", 1), ("ok", 0),
    ("No, please answer formally and politely. How do I clean the kitchen?", -1),
])
def test_the_judge_reads_timestamped_messages_as_the_bare_text(text, score):
    assert score_next_state(text) == score
    assert score_next_state(f"{STAMP} {text}") == score
    assert extract_hint(f"{STAMP} {text}") == extract_hint(text)


def test_the_judge_ignores_the_runtime_line_and_the_internal_context_block():
    first = f"{STAMP} No, please answer like a pirate. Any tips?\n\n" + openclaw_like.runtime_line(random.Random(0), "s1")
    assert task.user_text(first) == "No, please answer like a pirate. Any tips?"
    assert extract_hint(first) == "Answer like a pirate."
    assert task.user_text(openclaw_like.INTERNAL_CONTEXT) == ""
    assert score_next_state(openclaw_like.INTERNAL_CONTEXT) == 0  # data, not the user's words
    assert task.is_openclaw_context(openclaw_like.INTERNAL_CONTEXT)


def test_a_prm_prompt_with_an_openclaw_next_state_scores_like_the_bare_one():
    from openclaw_rl.judge import PRM_USER

    fields = {"response": "Hey! Just clean the kitchen.", "role": "user", "history": "", "instruction": "",
              "next_state": f"{STAMP} No."}
    prompt = PRM_USER.format_map({k: fields.get(k, "") for k in _fields(PRM_USER)})
    assert judge_reply(prompt)[1] == "\\boxed{-1}"


def _fields(template: str) -> list[str]:
    import string

    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def test_task_labels_see_through_openclaw_shapes():
    request = task.REQUESTS[3]
    assert task.request_by_text(f"{STAMP} {request.text}") == request
    assert task.instruction_style(f"{STAMP} No, please answer as a bulleted list. {request.text}") == "bullet"
    chat = [{"role": "user", "content": f"{STAMP} Use bullet points. {request.text}"},
            {"role": "user", "content": openclaw_like.INTERNAL_CONTEXT}]
    assert task.is_instructed(chat)
    # the block as content parts (OpenClaw's wire shape) is skipped too; a hint appended to it counts
    plain = [{"role": "user", "content": f"{STAMP} {request.text}"}]
    assert task.is_instructed(chat[:1] + [openclaw_like.context_message()])
    assert not task.is_instructed(plain + [openclaw_like.context_message()])
    assert not task.is_instructed(plain + [{"role": "user", "content": openclaw_like.INTERNAL_CONTEXT}])
    hinted = openclaw_like.context_message(task.STYLES["pirate"].instruction)
    assert task.is_instructed(plain + [hinted]) and task.instruction_style(task.user_text(
        task.message_text(hinted["content"]))) == "pirate"
    from openclaw_opd.teacher import enhanced_messages  # the pre-training shape is the teacher's exact prompt

    teacher = enhanced_messages(plain + [{"role": "user", "content": openclaw_like.INTERNAL_CONTEXT}],
                                task.STYLES["pirate"].instruction)
    assert teacher[-1]["content"] == task.message_text(hinted["content"])


def test_openclaws_prompt_fits_with_room_and_tokenises_compactly(tokenizer, tiny_model_dir):
    from transformers import AutoConfig

    context = AutoConfig.from_pretrained(tiny_model_dir).max_position_embeddings
    for body in golden_bodies():
        ids = golden_prompt_ids(tokenizer, body)
        chars = len(tokenizer.decode(ids))
        # a prose-only vocabulary needed 24.8K tokens (2.04 characters a token) for the same prompt; now ~15.6K
        assert chars / len(ids) >= 3.1, (chars, len(ids))
        assert len(ids) + 8192 <= context
