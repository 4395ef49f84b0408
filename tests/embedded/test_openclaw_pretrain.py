"""The OpenClaw pre-training phase: its chats have OpenClaw's shape, its cached-prefix loss is the loss
of the whole sequence, and it is seeded; and the replay harness reproduces the recorded request shape."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from openclaw_rl.embedded import openclaw_like, task
from openclaw_rl.embedded.openclaw_golden import flatten_messages
from openclaw_rl.embedded.openclaw_replay import OpenClawShape, shaped_prompts, timestamped
from openclaw_rl.embedded.pretrain import (
    OpenClawPhase,
    _encode_tail,
    _split_prefix,
    _tail_loss,
    pretrain_openclaw_phase,
)
from openclaw_rl.embedded.tiny_model import PRESETS
from openclaw_rl.engine.torch_core import forward_kwargs

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "openclaw-golden"


def _cycle() -> Any:
    styles = iter(list(task.STYLE_NAMES) * 100)
    return lambda: next(styles)


def test_openclaw_chats_have_openclaws_shape():
    rng, draw = random.Random(0), _cycle()
    instructed = hinted = 0
    for _ in range(60):
        chat = openclaw_like.openclaw_chat(rng, draw, ["read", "exec"])
        users = [m for m in chat if m["role"] == "user"]
        context = users[-1]["content"][0]["text"]
        assert task.is_openclaw_context(context) and context.startswith(openclaw_like.INTERNAL_CONTEXT)
        assert all(isinstance(m["content"], str) and m["content"].startswith("[") for m in users[:-1])
        assert "\n\nRuntime: agent=main" in users[0]["content"]
        assert sum("Runtime: agent=" in m["content"] for m in users[:-1]) == 1
        reply = chat[-1]
        assert reply["role"] == "assistant" and task.detect_style(reply["content"]) in task.STYLES
        hint = context.removeprefix(openclaw_like.INTERNAL_CONTEXT)
        if hint:  # the OPD teacher's shape on OpenClaw traffic: the hint after the internal-context block
            assert chat[-2] == openclaw_like.context_message(hint.removeprefix(task.HINT_HEADER))
            assert hint.startswith(task.HINT_HEADER) and task.HINT_HEADER not in users[-2]["content"]
        asked = task.instruction_style(hint) if hint else task.instruction_style(users[-2]["content"])
        assert task.is_instructed(chat) == (asked is not None)
        if asked is not None:
            assert task.detect_style(reply["content"]) == asked  # instructions, corrections, hints are obeyed
        instructed += asked is not None
        hinted += bool(hint)
    assert instructed > 20 and hinted > 5  # the chats the phase trains to follow instructions are there


def _model(tokenizer: Any) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                                        pad_token_id=tokenizer.pad_token_id, **PRESETS["h64"]))


def test_the_cached_prefix_loss_is_the_whole_sequences_loss(tokenizer):
    rng = random.Random(1)
    system, tools = openclaw_like.system_prompt(rng, sections=2), openclaw_like.tools(rng, 3)
    prefix_text, prefix_ids = _split_prefix(tokenizer, system, tools)
    chat = openclaw_like.openclaw_chat(rng, _cycle(), [t["function"]["name"] for t in tools])
    tail, prompt_len = _encode_tail(tokenizer, prefix_text, system, tools, chat)
    messages = flatten_messages([{"role": "system", "content": system}, *chat])
    prompt = tokenizer.apply_chat_template(messages[:-1], tools=tools, tokenize=False, add_generation_prompt=True)
    assert prefix_ids + tail[:prompt_len] == tokenizer.encode(prompt, add_special_tokens=False)  # no re-tokenising

    model = _model(tokenizer).eval()
    cache, kw = DynamicCache(), forward_kwargs(model.model)[0]
    with torch.no_grad():
        model.model(input_ids=torch.tensor([prefix_ids]), use_cache=True, **{kw: cache})
        cached = _tail_loss(model, cache, kw, len(prefix_ids), tail, prompt_len, -1, None, 6, 1.0)
        again = _tail_loss(model, cache, kw, len(prefix_ids), tail, prompt_len, -1, None, 6, 1.0)
        ids = torch.tensor([prefix_ids + tail])
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        start = len(prefix_ids) + prompt_len
        full = -logp[start - 1:-1].gather(1, ids[0, start:].unsqueeze(1)).mean()
    assert cached.item() == pytest.approx(full.item(), abs=1e-5)
    assert again.item() == pytest.approx(cached.item(), abs=1e-6)  # the tail left the cached prefix as it was


def test_the_openclaw_phase_is_seeded_and_learns(tokenizer):
    phase = OpenClawPhase(rounds=2, steps_per_round=3, tails_per_step=2, prefixes=1, min_sections=1,
                          max_sections=2, lr=3e-3)
    weights, stats = [], []
    for _ in range(2):
        model = _model(tokenizer)
        stats.append(pretrain_openclaw_phase(model, tokenizer, seed=0, phase=phase,
                                             short_chats=task.pretraining_chats(16, seed=0)))
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(weights[0], weights[1])
    assert stats[0].steps == 6 and stats[0].last_loss < stats[0].first_loss


def test_the_replay_sends_openclaws_recorded_request_shape():
    lines = (GOLDEN / "conversation_B.jsonl").read_text().splitlines()
    shape = OpenClawShape.from_recording(GOLDEN / "conversation_B.jsonl", 0)
    for line in lines[:3]:
        body = json.loads(line)["body"]
        rebuilt = shape.request(body["messages"][1:-1])
        assert rebuilt == {k: v for k, v in body.items() if k != "model"}
    assert shape.runtime_for("convB") == shape.runtime
    first = shaped_prompts(shape, 1)[0]["messages"][1]["content"]
    assert "sessionId=p0 " in first and task.user_text(first) in {r.text for r in task.REQUESTS}
    assert timestamped("No.", 1_795_000_000).startswith("[") and task.user_text(timestamped("No.", 0)) == "No."
