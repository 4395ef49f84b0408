"""Render an OpenAI conversation into the exact prompt token ids the policy will consume.

Stage: protocol → **chat template** → backend. The proxy renders the policy's own HF chat template
(with tools) and sends token ids to SGLang's ``/generate``, so the sample's prompt ids are exactly
what the policy saw. Content-part lists are flattened to text (images dropped: text-only policies),
``developer`` becomes ``system``. Sampled text is never tokenised here or anywhere else.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import BadRequest
from .protocol import ChatMessage, Tool


def normalize_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                                 for c in m.tool_calls]
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        if m.name:
            msg["name"] = m.name
        if m.reasoning_content:
            msg["reasoning_content"] = m.reasoning_content
        out.append(msg)
    return out


def _arguments(arguments: str | dict[str, Any]) -> dict[str, Any] | str:
    """Templates render dict arguments as JSON; a JSON string is decoded so both render alike."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return value if isinstance(value, dict) else arguments


class ChatRenderer:
    """Owns the policy tokenizer: messages (+ tools) → prompt text and ids."""

    def __init__(self, tokenizer: Any, enable_thinking: bool | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the policy tokenizer has no chat template; the proxy renders prompts itself")
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.template_kwargs: dict[str, Any] = {}
        if enable_thinking is not None:
            self.template_kwargs["enable_thinking"] = enable_thinking

    def render(self, messages: list[dict[str, Any]], tools: list[Tool] | None = None,
               add_generation_prompt: bool = True) -> tuple[str, list[int]]:
        tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools else None
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=tool_dicts, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt,
                                                      **self.template_kwargs)
        except Exception as e:  # jinja raise_exception(), bad role order, …: the client's conversation
            raise BadRequest(f"the conversation cannot be rendered with the policy's chat template: {e}",
                             param="messages") from e
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return text, ids

    def encode(self, text: str) -> list[int]:
        """Tokenise text the *proxy* wrote (templates, hints), never sampled text."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    @staticmethod
    def opens_thinking(prompt_text: str) -> bool:
        """Thinking templates end the generation prompt inside an open ``<think>`` block."""
        return prompt_text.rstrip().endswith("<think>")
