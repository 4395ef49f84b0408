"""Tool-call arguments sent as a JSON string render exactly like the object the policy emitted.

OpenClaw (tests/data/openclaw-golden, conversation A, request 4) replays the model's ``ls`` call with
``"arguments": "{\\"path\\":\\".\\"}"``, a compact JSON string. SGLang's and vLLM's chat servers decode such a
string before templating (upstream's proxies too, since 28a8d39/16bef77); a Qwen3 template prints a
string verbatim and ``tojson``s a mapping, so without the decode the prompt would hold
``{"path":"."}`` where the model wrote (and a server renders) ``{"path": "."}``.
"""

from __future__ import annotations

import copy

import pytest
from support import load_conversation

from openclaw_rl.chat import ChatRenderer, normalize_messages
from openclaw_rl.errors import BadRequest
from openclaw_rl.protocol import ChatCompletionRequest


def _with_arguments(body: dict, arguments: object) -> dict:
    body = copy.deepcopy(body)
    for m in body["messages"]:
        for call in m.get("tool_calls") or []:
            call["function"]["arguments"] = arguments
    return body


def _render(renderer: ChatRenderer, body: dict) -> tuple[str, list[int]]:
    req = ChatCompletionRequest.model_validate(body)
    return renderer.render(normalize_messages(req.messages), req.tools, plain=True)


@pytest.fixture(scope="module")
def replayed_call() -> dict:
    rows = load_conversation("conversation_A.jsonl")
    body = rows[3]["body"]
    calls = [c for m in body["messages"] for c in m.get("tool_calls") or []]
    assert [c["function"]["arguments"] for c in calls] == ['{"path":"."}']  # the recorded string shape
    return body


def test_recorded_string_arguments_render_as_the_object(tokenizer, replayed_call):
    renderer = ChatRenderer(tokenizer)
    text, ids = _render(renderer, replayed_call)
    assert '<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>' in text
    # the object shape of the same call: the same prompt, token for token
    assert _render(renderer, _with_arguments(replayed_call, {"path": "."})) == (text, ids)
    # what a chat server renders (arguments decoded, then transformers' own apply_chat_template)
    req = ChatCompletionRequest.model_validate(replayed_call)
    decoded = normalize_messages(req.messages)
    for m in decoded:
        for call in m.get("tool_calls") or []:
            assert isinstance(call["function"]["arguments"], dict)
    server_text = tokenizer.apply_chat_template(decoded, tools=[t.model_dump(exclude_none=True) for t in req.tools],
                                                tokenize=False, add_generation_prompt=True)
    assert server_text == text
    assert ids == tokenizer.encode(server_text, add_special_tokens=False)


@pytest.mark.parametrize("arguments,rendered", [
    ("", "{}"),                       # no arguments: an empty object, never `"arguments": }`
    ("  ", "{}"),
    ("not json", "not json"),         # kept as sent (upstream renders {}: a call the policy never made)
    ("[1,2]", "[1,2]"),               # JSON, but not an object: kept, printed verbatim by the template
])
def test_other_argument_strings(tokenizer, replayed_call, arguments, rendered):
    text, _ = _render(ChatRenderer(tokenizer), _with_arguments(replayed_call, arguments))
    assert f'{{"name": "ls", "arguments": {rendered}}}\n</tool_call>' in text


def test_a_template_that_needs_an_object_refuses_a_non_json_string(tokenizer, replayed_call):
    """Qwen3.5's XML tool calls iterate ``arguments|items``: a string that is no JSON object is a 400."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = ("{%- for m in messages %}{%- for c in m.tool_calls or [] %}"
                         "{%- for k, v in c.function.arguments|items %}<{{ k }}={{ v }}>{%- endfor %}"
                         "{%- endfor %}{{ m.content }}{%- endfor %}")
    renderer = ChatRenderer(tok)
    text, _ = _render(renderer, replayed_call)
    assert "<path=.>" in text
    with pytest.raises(BadRequest, match="chat template"):
        _render(renderer, _with_arguments(replayed_call, "not json"))
