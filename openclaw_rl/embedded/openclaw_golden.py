"""Render a recorded (or live) OpenClaw request body into the prompt ids the proxy would build.

Used to evaluate the tiny stack on OpenClaw's real request shape (the recordings in
tests/data/openclaw-golden are held out from the tokenizer corpus and the pre-training data).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def flatten_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """String contents, as the proxy renders them: text parts joined with a space, null content as ''."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        out.append({**m, "content": content or ""})
    return out


def golden_prompt_ids(tokenizer: Any, body: dict[str, Any]) -> list[int]:
    """The generation prompt of a chat-completions `body` (messages + tools) as token ids."""
    text = tokenizer.apply_chat_template(flatten_messages(body["messages"]), tools=body.get("tools") or None,
                                         tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def recorded_bodies(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    """(``name#line``, request body) of every recorded request in ``folder``'s ``conversation_*.jsonl``."""
    return [(f"{path.name}#{i}", json.loads(line)["body"]) for path in sorted(folder.glob("conversation_*.jsonl"))
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines())]


def reply_styles(model: Any, tokenizer: Any, body: dict[str, Any], n: int, *, seed: int,
                 max_new_tokens: int = 48) -> list[tuple[str | None, str]]:
    """(style, text) of `n` pure-sampled replies to one request, each decoded as OpenClaw would show it
    (special tokens dropped; ``task.detect_style`` skips a think block and reads the opener only)."""
    from openclaw_rl.embedded import task
    from openclaw_rl.embedded.pretrain import sample_continuations

    ids = golden_prompt_ids(tokenizer, body)
    rows = sample_continuations(model, ids, n, seed=seed, max_new_tokens=max_new_tokens,
                                stop_ids=(tokenizer.eos_token_id,))
    texts = [tokenizer.decode(r, skip_special_tokens=True) for r in rows]
    return [(task.detect_style(t), t) for t in texts]
