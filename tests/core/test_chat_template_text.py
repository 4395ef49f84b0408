"""The direct chat-template path renders exactly what ``apply_chat_template`` renders, or is not used."""

from __future__ import annotations

import random
from typing import Any

import pytest
import test_chat_formats
from support import load_conversation

from openclaw_rl.chat import ChatRenderer, normalize_messages
from openclaw_rl.chat_template import ChatTemplateText
from openclaw_rl.judge import PRM_SYSTEM, JudgeClient
from openclaw_rl.protocol import ChatCompletionRequest

TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": f"does thing {i} (caf\u00e9)",
                                            "parameters": {"type": "object", "properties": {
                                                "path": {"type": "string"}, "n": {"type": "integer", "default": 3}},
                                                "required": ["path"]}}} for i in range(3)]

mistral_tokenizer = test_chat_formats.mistral_tokenizer  # the fixture: that file's Mistral-family tokenizer


def reference(tokenizer: Any, messages: list[dict[str, Any]], tools: Any = None, gen: bool = True, **kw: Any) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen, **kw)


def random_conversation(rng: random.Random) -> list[dict[str, Any]]:
    pieces = ["hello", " world", "\n", "🙂", "café", "<think>", "</think>", "<tool_call>", "  ", "\u00e9\u0301",
              "<tool_response>", "</tool_response>", "{\"a\": 1}", "'s", "?!", "\t"]

    def text(n: int) -> str:
        return "".join(rng.choice(pieces) for _ in range(rng.randint(0, n)))

    msgs: list[dict[str, Any]] = [{"role": "system", "content": text(20)}] if rng.random() < 0.7 else []
    for k in range(rng.randint(1, 6)):
        msgs.append({"role": "user", "content": text(15)})
        reply: dict[str, Any] = {"role": "assistant", "content": text(10)}
        if rng.random() < 0.4:
            reply["reasoning_content"] = text(8)
        if rng.random() < 0.4:
            reply["tool_calls"] = [{"id": f"c{k}", "type": "function",
                                    "function": {"name": "tool_1", "arguments": rng.choice([{"path": text(3)}, "{}"])}}]
            msgs.append(reply)
            msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": text(6)})
        else:
            msgs.append(reply)
    if rng.random() < 0.5:
        msgs.append({"role": "user", "content": text(10)})
    return msgs


def test_the_probe_selects_the_direct_path_for_both_families(tokenizer, mistral_tokenizer):
    assert ChatTemplateText(tokenizer).fast
    assert ChatTemplateText(mistral_tokenizer).fast
    assert ChatTemplateText(tokenizer, enable_thinking=False).fast


@pytest.mark.parametrize("family", ["qwen", "mistral"])
def test_random_conversations_render_as_apply_chat_template(family, tokenizer, mistral_tokenizer):
    tok = tokenizer if family == "qwen" else mistral_tokenizer
    text = ChatTemplateText(tok)
    rng = random.Random(1)
    for _ in range(60):
        msgs = random_conversation(rng)
        tools = TOOLS if rng.random() < 0.5 else None
        gen = rng.random() < 0.8
        try:
            want = reference(tok, msgs, tools, gen)
        except Exception as e:  # the template refuses this order: so must the direct path
            with pytest.raises(type(e)):
                text(msgs, tools, gen)
            continue
        assert text(msgs, tools, gen) == want


def test_openclaw_traffic_renders_as_apply_chat_template(tokenizer):
    """Also with ``plain=True``, as the proxy renders (no per-turn walk of messages and tool schemas):
    what ``normalize_messages`` and the tools' ``model_dump`` make of parsed requests is plain data."""
    from openclaw_rl.chat_template import _is_plain

    renderer = ChatRenderer(tokenizer)
    for name in ("conversation_A.jsonl", "conversation_B.jsonl"):
        for row in load_conversation(name):
            req = ChatCompletionRequest.model_validate(row["body"])
            msgs = normalize_messages(req.messages)
            tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
            assert _is_plain(msgs) and (tools is None or _is_plain(tools))
            want = reference(tokenizer, msgs, tools)
            assert renderer.render(msgs, req.tools)[0] == renderer.render(msgs, req.tools, plain=True)[0] == want


def test_template_kwargs_and_a_changed_template_are_honoured(tokenizer):
    """enable_thinking reaches the template, and a template swapped after construction is the one used."""
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}:{{ m.content }}"
                         "{% if enable_thinking is defined %}[think={{ enable_thinking }}]{% endif %}"
                         "{% if m.thinking is defined %}[{{ m.thinking }}]{% endif %}<|im_end|>{% endfor %}"
                         "{% if tools %}{{ tools | tojson }}{% endif %}{{ eos_token }}")
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok", "reasoning_content": "r"}]
    for kw in ({}, {"enable_thinking": False}):
        text = ChatTemplateText(tok, **kw)
        assert text.fast
        assert text(msgs, TOOLS) == reference(tok, msgs, TOOLS, **kw)
    text = ChatTemplateText(tok)
    tok.chat_template = "{% for m in messages %}{{ m.content | upper }}{% endfor %}"
    assert text(msgs) == reference(tok, msgs) == "HIOK"


def test_a_template_that_differs_on_the_probe_is_rendered_by_transformers(tokenizer):
    """A template whose direct rendering would differ (here: it reads a variable only transformers' copy
    step would leave out) fails the probe, and every call takes apply_chat_template."""
    import copy

    from openclaw_rl import chat_template

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    original = chat_template._alias_reasoning_fields
    try:  # a transformers whose aliasing differs from what the direct path runs
        chat_template._alias_reasoning_fields = lambda chat: [{**m, "content": m["content"] + "!"} for m in chat]
        text = ChatTemplateText(tok)
    finally:
        chat_template._alias_reasoning_fields = original
    assert not text.fast
    assert text([{"role": "user", "content": "a"}]) == "a"



def test_a_template_that_refuses_system_messages_still_renders_directly(tokenizer):
    """A refusal (raise_exception) on some probes is an outcome both paths share: such a template keeps
    the direct path, and refuses the same conversations through it."""
    import copy

    from jinja2.exceptions import TemplateError

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = ("{% if messages[0].role == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
                         "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    text = ChatTemplateText(tok)
    assert text.fast
    msgs = [{"role": "user", "content": "hi 🙂"}, {"role": "assistant", "content": "ok"}]
    assert text(msgs) == reference(tok, msgs)
    with pytest.raises(TemplateError):
        text([{"role": "system", "content": "s"}, *msgs])

def test_non_plain_input_takes_apply_chat_template(tokenizer):
    class Text(str):
        pass

    text = ChatTemplateText(tokenizer)
    msgs = [{"role": "user", "content": Text("hi")}]
    assert text(msgs) == reference(tokenizer, msgs)


def test_the_judge_prompt_renders_as_apply_chat_template(tokenizer, mistral_tokenizer):
    import httpx

    from openclaw_rl.config import JudgeSettings

    for tok in (tokenizer, mistral_tokenizer):
        judge = JudgeClient(httpx.AsyncClient(), JudgeSettings(), tokenizer=tok)
        msgs = [{"role": "system", "content": PRM_SYSTEM}, {"role": "user", "content": "## Assistant output\nok 🙂"}]
        assert judge.render(PRM_SYSTEM, msgs[1]["content"]) == reference(tok, msgs)


def test_a_template_is_probed_once_per_process_and_again_when_what_it_depends_on_changes(tokenizer, monkeypatch):
    """The probe's verdict is kept per (tokenizer class, template, special tokens, keywords, transformers
    helpers): a second renderer of the same template renders nothing at construction; another template,
    other keywords or other helpers are probed afresh."""
    import copy

    from openclaw_rl import chat_template

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{{ suffix | default('') }}"
    monkeypatch.setattr(chat_template, "_PROBED", {})
    calls = []
    real = type(tok).apply_chat_template

    def counting(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(tok), "apply_chat_template", counting)
    first = ChatTemplateText(tok)
    probes = len(calls)
    assert first.fast and probes >= 12
    second = ChatTemplateText(tok)
    assert second.fast and len(calls) == probes  # the verdict was kept: no render at construction
    ChatTemplateText(tok, suffix="!")
    assert len(calls) == 2 * probes  # other keywords: probed again
    tok.chat_template = tok.chat_template.replace("[", "<")
    ChatTemplateText(tok)
    assert len(calls) == 3 * probes  # another template: probed again
    monkeypatch.setattr(chat_template, "_alias_reasoning_fields", lambda chat: [{**m, "content": "x"} for m in chat])
    assert not ChatTemplateText(tok).fast and len(calls) == 4 * probes  # other helpers: probed again, and differ
    monkeypatch.undo()
    own = copy.deepcopy(tokenizer)
    own.chat_template = tok.chat_template
    assert ChatTemplateText(own).fast  # probed (the helpers are transformers' again) and kept
    own.apply_chat_template = lambda *args, **kwargs: "rendered some other way"
    assert not ChatTemplateText(own).fast  # an object whose own rendering differs is always probed

