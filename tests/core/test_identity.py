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
    user2 = rows[1]["body"]["messages"][-2]["content"]  # [system, user1, assistant, user2, ctx]
    assert states[1] == {"role": "user", "content": user2} and "3+3" in user2
    tool = rows[3]["body"]["messages"][-2]["content"]  # [..., assistant(tool_calls), tool, ctx]
    assert states[3] == {"role": "tool", "content": tool}  # the tool result after the ls tool call


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


# --- next state: every shape that can follow an assistant reply ---------------------------------------

CTX = {"role": "user", "content": [{"type": "text", "text": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nActive exec "
                                                             "sessions: none\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"}]}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": f"c{i}", "type": "function", "function": {"name": "ls", "arguments": "{}"}} for i in (1, 2)]}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def tool(text: str, i: int = 1) -> dict:
    return {"role": "tool", "tool_call_id": f"c{i}", "content": text}


def state_after(*tail: dict) -> dict | None:
    """The next state of a request: a first exchange, then an assistant tool call, then ``tail``."""
    messages = [{"role": "system", "content": "s"}, user("list the files"), {"role": "assistant", "content": "ok"},
                user("again please"), CALL, *tail]
    return next_state_of(ChatCompletionRequest.model_validate({"messages": messages}).messages)


@pytest.mark.parametrize("tail,expected", [
    ([user("thanks")], {"role": "user", "content": "thanks"}),
    ([tool("a.txt", 1), tool("b.txt", 2)], {"role": "tool", "content": "a.txt\n\nb.txt"}),
    ([tool("error: no such dir")], {"role": "tool", "content": "error: no such dir"}),
    # a correction, then a follow-up: the judge needs the first as much as the last
    ([user("no, that's wrong"), user("use metric units")],
     {"role": "user", "content": "no, that's wrong\n\nuse metric units"}),
    ([tool("error: denied"), user("why did you do that?")],
     {"role": "user", "content": "[tool result]\nerror: denied\n\n[user]\nwhy did you do that?"}),
    ([user("stop"), tool("a.txt")], {"role": "user", "content": "[user]\nstop\n\n[tool result]\na.txt"}),
    ([tool("a.txt", 1), user("first"), tool("b.txt", 2), user("second")],
     {"role": "user", "content": "[tool result]\na.txt\n\n[user]\nfirst\n\n[tool result]\nb.txt\n\n[user]\nsecond"}),
], ids=["user", "tools", "tool-error", "users", "tool-then-user", "user-then-tool", "interleaved"])
@pytest.mark.parametrize("ctx_at", [None, "first", "between", "last"])
def test_the_next_state_is_the_whole_trailing_run_in_order(tail, expected, ctx_at):
    """The rule of ``next_state_of`` (and docs/differences.md): all of the run, the internal-context block
    left out wherever OpenClaw puts it (it is always last on the wire; first/between guard the rule)."""
    tail = list(tail)
    if ctx_at is not None:
        tail.insert({"first": 0, "between": 1, "last": len(tail)}[ctx_at], CTX)
    assert state_after(*tail) == expected


def test_content_parts_read_like_strings_and_non_text_parts_are_named():
    parts = [{"type": "text", "text": "no,"}, {"type": "text", "text": "use metric units"}]
    assert state_after({"role": "user", "content": parts}) == state_after(user("no, use metric units"))
    assert state_after({"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a.txt"}]}, CTX) == \
        {"role": "tool", "content": "a.txt"}
    # OpenClaw turns an image a tool returned into a user message after the tool result
    image = {"role": "user", "content": [{"type": "text", "text": "screenshot:"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}
    assert state_after(tool("saved shot.png"), image, CTX) == \
        {"role": "user", "content": "[tool result]\nsaved shot.png\n\n[user]\nscreenshot: [image_url]"}


def test_no_next_state_without_user_or_tool_evidence():
    assert state_after() is None  # the request ends with the assistant's tool call
    assert state_after(CTX) is None  # only OpenClaw's block
    assert next_state_of(ChatCompletionRequest.model_validate({"messages": [user("hi"), CTX]}).messages) == \
        {"role": "user", "content": "hi"}  # a first request: its own message (the tracker has no turn to give it)
