"""What a model family's chat markup looks like, written down once: turn markers, think tags, tool-call tags.

Stage: owned by the **chat renderer** (``chat.py``), which detects the policy's family from its tokenizer;
the output parsers (``parsers.py``), the judge (reading a verdict after the judge model's thinking) and
the simulator (stripping an LLM user's thinking) take their markup from here instead of spelling it out.
The chat *template* itself always comes from the model's tokenizer: the proxy renders prompts exactly as
the model was trained, and this module only names the markers that template and the model's output use.

Three families; the first two differ in every respect that matters to the parsers:
- ``qwen`` (ChatML, Qwen2.5/Qwen3, Hermes): ``<|im_start|>role\\n…<|im_end|>``, ``<think>…</think>``, and
  ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` blocks closed by an end tag;
- ``mistral`` (Mistral/Magistral instruct, tokenizer v11+ markup): ``[INST]…[/INST]`` turns with no assistant
  header, ``[THINK]…[/THINK]``, and ``[TOOL_CALLS]name[ARGS]{…}`` calls that have no end tag: a call ends
  where its JSON arguments end (the older ``[TOOL_CALLS][{"name": …, "arguments": …}, …]`` form too);
- ``qwen35`` (Qwen3.5, Qwen3-Coder): Qwen's turns and think tags, but tool calls as
  ``<tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>\n</function>\n</tool_call>``
  (the template walks ``arguments|items``), recognised by ``<function=`` in the tokenizer's template.

Adding a family is one ``ChatFormat`` in ``FORMATS`` (plus a parser class in ``parsers.py`` only if its
tool calls have a shape neither of these has); ``tests/core/test_chat_formats.py`` shows the checks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ChatFormat:
    name: str
    turn_start: str  # special token that opens turns; the prefix cache cuts right before it
    think_start: str | None  # reasoning block tags (None: the family does not reason in the open)
    think_end: str | None
    tool_start: str  # opens a tool call
    tool_end: str | None  # closes it; None: the call ends with its JSON arguments (see parsers.py)
    tool_args: str | None = None  # separates the function name from its JSON arguments, if the family has one
    # "tagged_json" (start {json} end), "named_args" (start name args {json}) or "xml_params" (start
    # <function=name><parameter=key>value</parameter>…</function> end)
    tool_style: str = "tagged_json"
    markup_is_special: bool = False  # the tags are special tokens: the backend must not skip them when decoding
    turn_end: str | None = None  # the token that ends a reply's turn, where it is not the tokenizer's EOS
    template_marker: str | None = None  # text only this family's chat template holds (tells apart same-token families)

    @property
    def reasons(self) -> bool:
        return bool(self.think_start and self.think_end)

    def after_reasoning(self, text: str) -> str:
        """The part of a reply after its reasoning block ("" if it never left the block)."""
        if self.think_end and self.think_end in text:
            return text.rsplit(self.think_end, 1)[1]
        if self.think_start and text.lstrip().startswith(self.think_start):
            return ""
        return text

    def opens_reasoning(self, prompt_text: str) -> bool:
        """Thinking templates end the generation prompt inside an open reasoning block."""
        return bool(self.think_start) and prompt_text.rstrip().endswith(self.think_start)  # type: ignore[arg-type]


QWEN = ChatFormat(name="qwen", turn_start="<|im_start|>", think_start="<think>", think_end="</think>",
                  tool_start="<tool_call>", tool_end="</tool_call>", turn_end="<|im_end|>")
# Qwen3.5 (and Qwen3-Coder): Qwen's ChatML turns and think tags, tool calls as XML-ish parameters rendered
# from ``arguments|items`` (SGLang's ``qwen3_coder`` parser); told apart from Qwen3 by its template.
QWEN35 = ChatFormat(name="qwen35", turn_start="<|im_start|>", think_start="<think>", think_end="</think>",
                    tool_start="<tool_call>", tool_end="</tool_call>", tool_style="xml_params", turn_end="<|im_end|>",
                    template_marker="<function=")
MISTRAL = ChatFormat(name="mistral", turn_start="[INST]", think_start="[THINK]", think_end="[/THINK]",
                     tool_start="[TOOL_CALLS]", tool_end=None, tool_args="[ARGS]", tool_style="named_args",
                     markup_is_special=True)

FORMATS: dict[str, ChatFormat] = {f.name: f for f in (QWEN, QWEN35, MISTRAL)}
DEFAULT = QWEN  # what an unrecognised tokenizer is parsed as (the proxy's historical behaviour)


def detect(tokenizer: Any) -> ChatFormat | None:
    """The family whose turn marker is a special (added) token of the tokenizer and appears in its chat
    template, or None. (A tokenizer can carry another family's tokens: the template says which it speaks.)"""
    specials = set(getattr(tokenizer, "all_special_tokens", None) or [])
    added = getattr(tokenizer, "get_added_vocab", None)
    if callable(added):
        specials |= set(added())
    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else ""
    marked_first = sorted(FORMATS.values(), key=lambda f: f.template_marker is None)
    return next((f for f in marked_first if f.turn_start in specials and (not template or f.turn_start in template)
                 and (f.template_marker is None or f.template_marker in template)), None)


def get(name: str) -> ChatFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown chat format {name!r}; formats: {', '.join(FORMATS)}") from None


_ANY_REASONING = re.compile("|".join(
    f"{re.escape(f.think_start)}.*?(?:{re.escape(f.think_end)}|$)"  # type: ignore[arg-type]
    for f in FORMATS.values() if f.reasons), re.DOTALL)


def strip_reasoning(text: str) -> str:
    """Text without any family's reasoning blocks, for replies of a model whose family is unknown."""
    return _ANY_REASONING.sub("", text).strip()
