"""Reasoning and tool-call parsing; streaming must agree with non-streaming for any chunking."""

from __future__ import annotations

import json

import pytest

from openclaw_rl.parsers import OutputParser

P = OutputParser.named("qwen3", "qwen25")
CASES = [
    "plain text with a < sign and <b>html</b>",
    "<think>\nplan\n</think>\n\nanswer",
    'Let me check.\n<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>',
    '<tool_call>{"name":"a","arguments":{}}</tool_call>\n<tool_call>{"name":"b","arguments":{"x":1}}</tool_call>',
    "<tool_call>not json</tool_call> after",
    "<think>\ncut off while thinking",
]


def stream(text: str, step: int, opens: bool = False) -> tuple[str, str, list]:
    sp = P.streaming(True, opens)
    deltas = []
    for i in range(step, len(text) + step, step):
        deltas += sp.feed(text[:i])
    deltas += sp.finish(text)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content", "") for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    return reasoning, content, calls


@pytest.mark.parametrize("text", CASES)
@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_streaming_matches_non_streaming(text, step):
    parsed = P.parse(text)
    reasoning, content, calls = stream(text, step)
    assert content.strip() == parsed.content.strip()
    assert reasoning.strip("\n") == (parsed.reasoning or "")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]
    assert [c["index"] for c in calls] == list(range(len(calls)))


def test_thinking_template_opens_the_block_in_the_prompt():
    assert P.parse("plan</think>\n\nanswer", starts_in_reasoning=True).reasoning == "plan"
    assert P.parse("still thinking", starts_in_reasoning=True).content == ""
    reasoning, content, _ = stream("plan</think>\n\nanswer", 1, opens=True)
    assert (reasoning, content) == ("plan", "answer")


def test_malformed_tool_call_stays_visible():
    parsed = P.parse("<tool_call>not json</tool_call>")
    assert parsed.tool_calls == [] and "not json" in parsed.content


@pytest.mark.parametrize("call", ['{"name": "ls", "arguments": {"p": "\\ud800"}}', '{"name": "l\\udfff", "arguments": {}}',
                                  '{"name": "ls", "arguments": "\\udbff"}', '{"name": "ls", "arguments": {"\\ud800": 1}}'])
def test_a_tool_call_whose_json_decodes_to_a_lone_surrogate_stays_visible_text(call):
    """The model wrote valid text; its JSON escapes would make a tool call no client can read (not Unicode)."""
    text = f"<tool_call>{call}</tool_call>"
    parsed = P.parse(text)
    assert parsed.tool_calls == [] and parsed.content == text
    _, content, calls = stream(text, 3)
    assert calls == [] and content == text
