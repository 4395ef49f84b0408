"""Render a recorded (or live) OpenClaw request body into the prompt ids the proxy would build.

Used to evaluate the tiny stack on OpenClaw's real request shape (the recordings in
tests/data/openclaw-golden are held out from the tokenizer corpus and the pre-training data).
"""

from __future__ import annotations

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
