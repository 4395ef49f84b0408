"""The Qwen3.5 chat format: the tiny (Qwen-shaped) tokenizer with a Qwen3.5-shaped template of our own
(tests/data/chat-formats/qwen35.jinja; the real one cannot be downloaded here). Golden renders of a tool
conversation, detection apart from Qwen3 by the template, and the XML tool calls the model writes parsed
back into the calls that were rendered, at every chunk boundary of a stream.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from openclaw_rl import chat_format
from openclaw_rl.chat import ChatRenderer, normalize_messages
from openclaw_rl.chat_format import QWEN, QWEN35
from openclaw_rl.parsers import OutputParser, XmlParamsToolParser
from openclaw_rl.protocol import ChatMessage, Tool

TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "chat-formats" / "qwen35.jinja"
TOOLS = [{"type": "function", "function": {"name": "ls", "description": "list files",
                                            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def qwen35_tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = TEMPLATE.read_text()
    return tok


def conversation(arguments: str = '{"path": ".", "flags": ["-l", "-a"]}') -> list[dict[str, Any]]:
    msgs = [ChatMessage.model_validate(m) for m in [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": "Sure.", "reasoning_content": "old thought", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt b.txt"},
        {"role": "user", "content": "thanks, and the biggest?"},
    ]]
    return normalize_messages(msgs)


def test_detected_apart_from_qwen3_by_its_template(tokenizer, qwen35_tokenizer):
    assert chat_format.detect(qwen35_tokenizer) is QWEN35
    assert chat_format.detect(tokenizer) is QWEN  # the same special tokens, Qwen3's template
    assert ChatRenderer(qwen35_tokenizer).format is QWEN35
    assert isinstance(OutputParser.named("qwen3", "auto", QWEN35).tools, XmlParamsToolParser)
    assert isinstance(OutputParser.named("qwen3", "qwen3_coder").tools, XmlParamsToolParser)


def test_tool_conversation_renders_exactly(qwen35_tokenizer):
    renderer = ChatRenderer(qwen35_tokenizer)
    text, ids = renderer.render(conversation(), [Tool.model_validate(t) for t in TOOLS])
    tools_json = json.dumps(TOOLS[0]["function"], ensure_ascii=False)
    assert text == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
        + tools_json + "\n</tools>\n\nTo call a function reply with:\n<tool_call>\n<function=example_function_name>\n"
        "<parameter=example_parameter>\nvalue\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nlist the files<|im_end|>\n"
        "<|im_start|>assistant\nSure.\n\n<tool_call>\n<function=ls>\n<parameter=path>\n.\n</parameter>\n"
        "<parameter=flags>\n[\"-l\", \"-a\"]\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\na.txt b.txt\n</tool_response><|im_end|>\n"
        "<|im_start|>user\nthanks, and the biggest?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n")
    assert "old thought" not in text  # reasoning before the last user query is dropped
    assert ids == qwen35_tokenizer.encode(text, add_special_tokens=False)
    assert renderer.opens_thinking(text)
    no_think, _ = ChatRenderer(qwen35_tokenizer, enable_thinking=False).render(conversation())
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_the_rendered_call_parses_back_to_the_call(qwen35_tokenizer):
    """What the template writes for a call is what the model writes: the parser must give the call back."""
    text, _ = ChatRenderer(qwen35_tokenizer).render(conversation())
    reply = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    parsed = OutputParser.for_format(QWEN35).parse(reply)
    assert parsed.content == "Sure."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls] == [
        ("ls", {"path": ".", "flags": ["-l", "-a"]})]


REPLY = ("<think>\nwhich dir?\n</think>\n\nLooking.\n\n<tool_call>\n<function=ls>\n<parameter=path>\nsrc/a b\n"
         "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=read>\n<parameter=n>\n42\n</parameter>\n"
         "<parameter=opts>\n{\"deep\": true}\n</parameter>\n</function>\n</tool_call>")
WANT = [("ls", {"path": "src/a b"}), ("read", {"n": "42", "opts": {"deep": True}})]


def _calls(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_xml_calls_parse_the_same_split_at_every_boundary():
    parser = OutputParser.for_format(QWEN35)
    whole = parser.parse(REPLY)
    assert (whole.reasoning, whole.content, _calls(whole.tool_calls)) == ("which dir?", "Looking.", WANT)
    chunkings = [[REPLY[:i], REPLY] for i in range(len(REPLY) + 1)]  # one split at each boundary
    chunkings.append([REPLY[:i] for i in range(1, len(REPLY) + 1)])  # every boundary at once
    for chunks in chunkings:
        stream = parser.streaming(True)
        deltas = [d for chunk in chunks for d in stream.feed(chunk)] + stream.finish(REPLY)
        content = "".join(d.get("content", "") for d in deltas)
        calls = [c for d in deltas for c in d.get("tool_calls", [])]
        assert (content.strip(), _calls(calls)) == ("Looking.", WANT), chunks


@pytest.mark.parametrize("bad", [
    "<tool_call>\n<function=ls>\n<parameter=path>\n.\n</parameter>\n</tool_call>",  # no </function>
    "<tool_call>\n<function=l s>\n</function>\n</tool_call>",  # not a function name
    "<tool_call>\n<function=ls>\nstray text\n</function>\n</tool_call>",  # text that is no parameter
    "<tool_call>\n<function=ls>\n<parameter=path>\n.\n</parameter>\n</function>",  # never closed
])
def test_malformed_calls_stay_visible_as_content(bad):
    parsed = OutputParser.for_format(QWEN35).parse("x " + bad)
    assert parsed.tool_calls == [] and bad in parsed.content


def test_arguments_that_are_not_an_object_are_refused_by_the_template(qwen35_tokenizer):
    """``arguments|items`` needs a mapping: a string that is not JSON is not rendered as something else."""
    msgs = conversation()
    bad = copy.deepcopy(msgs)
    bad[2]["tool_calls"][0]["function"]["arguments"] = "not json"
    with pytest.raises(Exception):  # noqa: B017, PT011  (jinja's error; the proxy answers it with a 400)
        ChatRenderer(qwen35_tokenizer).render(bad)
