"""Session identity, turn type and next state, on upstream's vectors and stock OpenClaw's real requests."""

from __future__ import annotations

import pytest
from support import load_conversation

from openclaw_rl.identity import classify_turn, next_state_of, resolve_identity, session_done
from openclaw_rl.protocol import ChatCompletionRequest

ORDER = ["explicit", "affinity", "prompt_cache_key", "openclaw_runtime", "prefix"]


def req(**body) -> ChatCompletionRequest:
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return ChatCompletionRequest.model_validate(body)


def test_upstream_header_precedence_vectors():
    assert resolve_identity(ORDER, {"x-session-id": "a"}, req(session_id="b")).session_id == "a"
    assert resolve_identity(ORDER, {}, req(session_id="b")) .session_id == "b"
    assert session_done({"x-session-done": "Yes "}, req())
    assert session_done({}, req(session_done=1))
    assert not session_done({}, req())
    assert classify_turn("auto", {"x-turn-type": "MAIN"}, req()) == "main"
    assert classify_turn("auto", {"x-turn-type": "side"}, req(tools=[{"type": "function",
                                                                      "function": {"name": "f"}}])) == "side"


@pytest.mark.parametrize("name,expected,source", [
    ("conversation_A.jsonl", "convA", "openclaw_runtime"),
    ("conversation_B.jsonl", "convB", "affinity"),
    ("conversation_D_prompt_cache_key.jsonl", "convD", "affinity"),
])
def test_stock_openclaw_requests_resolve_to_their_session(name, expected, source):
    for row in load_conversation(name):
        r = ChatCompletionRequest.model_validate(row["body"])
        identity = resolve_identity(ORDER, row["headers"], r)
        assert (identity.session_id, identity.source) == (expected, source)
        assert classify_turn("auto", row["headers"], r) == "main"  # OpenClaw agent requests carry tools


def test_prompt_cache_key_and_prefix_fallbacks():
    row = load_conversation("conversation_D_prompt_cache_key.jsonl")[0]
    r = ChatCompletionRequest.model_validate(row["body"])
    assert resolve_identity(["prompt_cache_key"], {}, r).session_id == "convD"
    a = resolve_identity(["prefix"], {}, req(messages=[{"role": "system", "content": "s"},
                                                       {"role": "user", "content": "first"}]))
    b = resolve_identity(["prefix"], {}, req(messages=[{"role": "system", "content": "s"},
                                                       {"role": "user", "content": "first"},
                                                       {"role": "assistant", "content": "x"},
                                                       {"role": "user", "content": "second"}]))
    assert a == b and a.source == "prefix"


def test_next_state_skips_openclaw_internal_context():
    rows = load_conversation("conversation_A.jsonl")
    states = [next_state_of(ChatCompletionRequest.model_validate(r["body"]).messages) for r in rows]
    assert states[1]["role"] == "user" and "3+3" in states[1]["content"].replace(" ", "")
    assert "INTERNAL_CONTEXT" not in states[1]["content"]
    assert states[3]["role"] == "tool"  # the tool result after the ls tool call


def test_side_requests_of_openclaw_without_tools():
    row = load_conversation("conversation_A.jsonl")[0]
    body = dict(row["body"])
    body.pop("tools")
    assert classify_turn("auto", {}, ChatCompletionRequest.model_validate(body)) == "side"
    assert classify_turn("auto", {}, req()) == "main"  # generic clients are trained by default
    assert classify_turn("tools_only", {}, req()) == "side"
    assert classify_turn("all_main", {}, ChatCompletionRequest.model_validate(body)) == "main"


def test_several_tool_results_join_into_one_next_state():
    r = req(messages=[{"role": "user", "content": "go"},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "1", "type": "function", "function": {"name": "a", "arguments": "{}"}}]},
                      {"role": "tool", "tool_call_id": "1", "content": "r1"},
                      {"role": "tool", "tool_call_id": "2", "content": "r2"}])
    assert next_state_of(r.messages) == {"role": "tool", "content": "r1\n\nr2"}
