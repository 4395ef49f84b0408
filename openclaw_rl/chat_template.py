"""A tokenizer's chat template rendered to text, without ``apply_chat_template``'s per-call copying.

Stage: used by the **chat renderer** (``chat.py``, every turn's prompt) and the **judge** (its vote
prompts). ``transformers``' ``apply_chat_template(tokenize=False)`` rebuilds every message, tool schema
and keyword as fresh plain data on each call (so that rich objects such as images or tensors never reach
the template's sandbox) before it renders the compiled template. With OpenClaw's twelve tools that
copying cost as much CPU as the template itself (profile of the side-by-side benchmark: 8.8% of the
proxy's CPU in ``_plain_template_data`` against 9.8% in ``Template.render``). The proxy's messages and
tools are plain JSON data already (``normalize_messages`` and pydantic's ``model_dump`` build them), so
here the compiled template is called directly with what ``apply_chat_template`` passes it: the template
chosen for these tools, the messages without ``None`` values and with the reasoning field aliases,
the tokenizer's special tokens and the extra keywords. The template is compiled in a copy of transformers'
sandbox whose per-access checks are memoised for plain builtin data (``template_sandbox.py``: the same
verdicts, about half the template's CPU).

Exactness is checked, not assumed: at construction probe conversations (tools, tool calls, a tool
result, reasoning, non-ASCII text) must render identically both ways (or be refused alike by the
template, with at least one rendered), or every call goes through
``apply_chat_template``; so does any input that is not plain JSON data, and any ``transformers`` without
the two helpers used here. Tests compare both paths on the project's templates and random conversations.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from .template_sandbox import fast_sandbox_template

log = logging.getLogger(__name__)

try:  # transformers' own compile cache and reasoning-field aliasing: what apply_chat_template runs
    from transformers.utils.chat_template_utils import _alias_reasoning_fields, _compile_jinja_template
except ImportError:  # pragma: no cover - another transformers: the slow path, which is always exact
    _alias_reasoning_fields = _compile_jinja_template = None  # type: ignore[assignment]

_PLAIN = (str, int, float, bool, type(None))

_PROBE_TOOLS = [{"type": "function", "function": {
    "name": "read", "description": "Read a file (caf\u00e9 🙂).",
    "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "where"},
                                                    "limit": {"type": "integer"}}, "required": ["path"]}}}]
_PROBE = [
    {"role": "system", "content": "You are a careful assistant.  \n"},
    {"role": "user", "content": "Read a.txt, please \u00e9\u0301 🙂"},
    {"role": "assistant", "content": "", "reasoning_content": "The user wants a file.",
     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read", "arguments": {"path": "a.txt"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "read", "content": "hello\nworld"},
    {"role": "assistant", "content": "It says hello."},
    {"role": "user", "content": "<tool_response>\nthanks\n</tool_response>"},
]


def _is_plain(value: Any) -> bool:
    """JSON data of exact builtin types, which ``apply_chat_template`` would pass on unchanged."""
    kind = type(value)
    if kind in _PLAIN:
        return True
    if kind is dict:
        return all(type(k) is str and _is_plain(v) for k, v in value.items())
    if kind is list:
        return all(_is_plain(v) for v in value)
    return False


# The probe's verdict per ``_probe_key``: the same inputs render the same way, so a process that builds many
# renderers (the test suite's proxies, a judge beside its policy) probes each template once. 24 probe
# pairs cost ~35 ms of CPU.
_PROBED: dict[tuple[Any, ...], bool] = {}


def _probe_key(tokenizer: Any, kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """What the probe's outcome depends on (the tokenizer class and its rendering methods, the two
    transformers helpers the direct path runs, the template, special tokens and keywords), or None when it
    cannot be captured: then the probe always runs."""
    template = getattr(tokenizer, "chat_template", None)
    specials = getattr(tokenizer, "special_tokens_map", None)
    if not isinstance(specials, dict) or not isinstance(template, (str, dict)):
        return None
    own = getattr(tokenizer, "__dict__", {})
    if "apply_chat_template" in own or "get_chat_template" in own:  # rendering changed on this one object
        return None
    kind = type(tokenizer)
    try:
        return (kind, kind.apply_chat_template, getattr(kind, "get_chat_template", None), _compile_jinja_template,
                _alias_reasoning_fields, json.dumps(template, sort_keys=True), json.dumps(specials, sort_keys=True),
                json.dumps(kwargs, sort_keys=True))
    except (TypeError, ValueError):
        return None


class ChatTemplateText:
    """``tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=…,
    **kwargs)``, the same text at less cost (see the module docstring)."""

    def __init__(self, tokenizer: Any, **kwargs: Any):
        self.tokenizer, self.kwargs = tokenizer, kwargs
        self._compiled: dict[str, Any] = {}
        self.fast = _compile_jinja_template is not None and _is_plain(kwargs)
        if self.fast:
            key = _probe_key(tokenizer, kwargs)
            verdict = _PROBED.get(key) if key is not None else None
            if verdict is None:
                outcomes = [self._both(_PROBE[i:n], tools, gen) for i, n in ((0, 2), (1, 2), (0, 4), (1, 4), (0, 6), (1, 6))
                            for tools in (None, _PROBE_TOOLS) for gen in (True, False)]
                # each probe renders alike both ways or fails alike (a template may refuse e.g. a system
                # message), and at least one renders
                verdict = all(same for same, _ in outcomes) and any(rendered for _, rendered in outcomes)
                if key is not None:
                    _PROBED[key] = verdict
            self.fast = verdict
            if not self.fast:
                log.info("chat template rendered through apply_chat_template (the direct path differs on a probe)")

    def _both(self, messages: list[dict[str, Any]], tools: Any, gen: bool) -> tuple[bool, bool]:
        """(the two paths agree: same text or the same kind of error, the slow path rendered)."""
        out = []
        for path in (self._slow, self._render):
            try:
                out.append(path(messages, tools, gen))
            except Exception as e:  # noqa: BLE001 - a template's refusal is an outcome to compare
                out.append(type(e))
        return out[0] == out[1], isinstance(out[0], str)

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                 add_generation_prompt: bool = True, *, plain: bool = False) -> str:
        """``plain``: the caller built ``messages`` and ``tools`` from parsed JSON itself, so they are
        plain data and the check (~0.1 ms for OpenClaw's twelve tools) is skipped."""
        if self.fast and messages and (plain or (_is_plain(messages) and (tools is None or _is_plain(tools)))):
            return self._render(messages, tools, add_generation_prompt)
        return self._slow(messages, tools, add_generation_prompt)

    def _slow(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
              add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt, **self.kwargs)

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                add_generation_prompt: bool) -> str:
        tok = self.tokenizer
        template = tok.get_chat_template(None, tools)  # a dict of templates picks "tool_use" when tools are given
        compiled = self._compiled.get(template)
        if compiled is None:
            base = _compile_jinja_template(template)
            compiled = self._compiled[template] = fast_sandbox_template(base, template) or base
        # apply_chat_template's steps on plain data: drop None values, alias the reasoning fields
        chat = _alias_reasoning_fields([{k: v for k, v in m.items() if v is not None} for m in messages])
        context = {**tok.special_tokens_map, **self.kwargs}
        return compiled.render(messages=chat, tools=tools, documents=None,
                               add_generation_prompt=add_generation_prompt, **context)
