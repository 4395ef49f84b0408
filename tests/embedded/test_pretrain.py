"""The built tiny model is pre-trained: random style when uninstructed, the instructed style when asked."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from openclaw_rl.embedded import task
from openclaw_rl.embedded.pretrain import (
    FreeChoice,
    encode_chat,
    pretrain,
    sample_replies,
    style_probabilities,
)
from openclaw_rl.embedded.tiny_model import PRESETS


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def uninstructed_prompts(n: int, seed: int) -> list[list[dict[str, str]]]:
    """Fresh requests, half of them after a session where the user corrected towards the default style."""
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        request = rng.choice(task.REQUESTS)
        if i % 2:
            prompts.append([{"role": "user", "content": request.text}])
            continue
        old = rng.choice(task.REQUESTS)
        prompts.append([
            {"role": "user", "content": old.text},
            {"role": "assistant", "content": task.answer("casual", old, rng)},
            {"role": "user", "content": task.correction(task.DEFAULT_STYLE, old.text)},
            {"role": "assistant", "content": task.answer(task.DEFAULT_STYLE, old, rng)},
            {"role": "user", "content": task.thanks(request.text, rng)},
        ])
    return prompts


def instructed_prompts(n: int, seed: int) -> tuple[list[list[dict[str, str]]], list[str]]:
    """Plain instructions, corrections and OPD hint forms, cycling through the styles."""
    rng = random.Random(seed)
    prompts, styles = [], []
    for i in range(n):
        style = task.STYLE_NAMES[i % len(task.STYLE_NAMES)]
        request = rng.choice(task.REQUESTS).text
        form = (i // len(task.STYLE_NAMES)) % 3
        content = (f"{request} {task.STYLES[style].instruction}" if form == 0 else task.correction(style, request)
                   if form == 1 else task.with_hint(task.thanks(request, rng), task.STYLES[style].instruction))
        prompts.append([{"role": "user", "content": content}])
        styles.append(style)
    return prompts, styles


def test_uninstructed_style_is_uniform(model: Any, tokenizer: Any) -> None:
    probs = style_probabilities(model, tokenizer, uninstructed_prompts(64, seed=0))
    print("uninstructed style probabilities:", {k: round(v, 3) for k, v in probs.items()})
    assert sum(probs.values()) > 0.95  # the reply opens with one of the styles
    assert all(0.1 <= p <= 0.3 for p in probs.values()), probs
    replies = sample_replies(model, tokenizer, uninstructed_prompts(64, seed=1), seed=0)
    counts = Counter(task.detect_style(r) for r in replies)
    print("uninstructed sampled styles:", dict(counts))
    assert counts[task.DEFAULT_STYLE] / len(replies) <= 0.3
    assert max(counts.values()) / len(replies) <= 0.35


def test_instructions_and_hints_are_followed(model: Any, tokenizer: Any) -> None:
    prompts, styles = instructed_prompts(64, seed=2)
    replies = sample_replies(model, tokenizer, prompts, seed=0)
    hits = [task.detect_style(r) == s for r, s in zip(replies, styles)]
    print(f"instructed: {sum(hits)}/{len(hits)} in the instructed style")
    assert sum(hits) / len(hits) >= 0.8
    for style in task.STYLE_NAMES:  # and the teacher's view: the instructed style dominates
        hinted = [[{"role": "user", "content": task.with_hint(r.text, task.STYLES[style].instruction)}]
                  for r in task.REQUESTS[:8]]
        assert style_probabilities(model, tokenizer, hinted)[style] >= 0.8


def test_replies_end_with_eos(model: Any, tokenizer: Any) -> None:
    replies = sample_replies(model, tokenizer, uninstructed_prompts(16, seed=3), seed=1, max_new_tokens=64)
    assert sum(len(tokenizer.encode(r)) < 50 for r in replies) >= 12  # short answers that stop


def test_pretrain_is_deterministic_and_learns(tokenizer: Any) -> None:
    config = Qwen3Config(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **PRESETS["h64"])
    chats = task.pretraining_chats(64, seed=0)
    free = FreeChoice({tokenizer.convert_tokens_to_ids("C"): 0.5, tokenizer.convert_tokens_to_ids("H"): 0.5},
                      lambda chat: not task.is_instructed(chat))
    weights = []
    for _ in range(2):
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config)
        stats = pretrain(model, tokenizer, chats, steps=12, seed=0, batch_size=8, free_choice=free)
        assert stats.steps == 12 and stats.last_loss < stats.first_loss
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(weights[0], weights[1])


def test_encode_chat_splits_prompt_and_answer(tokenizer: Any) -> None:
    chat = task.pretraining_chats(1, seed=5)[0]
    ids, prompt_len = encode_chat(tokenizer, chat)
    prompt = tokenizer.apply_chat_template(chat[:-1], tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(ids[:prompt_len]) == prompt
    assert tokenizer.decode(ids[prompt_len:]) == task.THINK_PREFIX + chat[-1]["content"] + "<|im_end|>"
