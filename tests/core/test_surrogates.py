"""A lone UTF-16 surrogate (\\ud800-\\udfff) is not Unicode: wherever it enters a chat request it is a 400.

Stage: client → protocol. Escaped in the body, as raw CESU-8 bytes (``ED A0 80``, which Python's
``json`` decodes with surrogatepass), or double-escaped inside a tool call's JSON ``arguments`` string
(decoded by the proxy for the chat template): every path ends as the same 400, never a 500.
"""

from __future__ import annotations

import httpx
import pytest
from support import metric

ESC = "\\ud800"  # as it appears inside the JSON body: an escape
RAW = "\udc80"  # placeholder replaced by raw CESU-8 bytes below


def _call(arguments: str) -> str:
    return ('{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"ls",'
            '"arguments":' + arguments + '}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}')


CASES = {
    "content": '{"role":"user","content":"a' + ESC + '"}',
    "content_raw_bytes": '{"role":"user","content":"a' + RAW + '"}',
    "arguments_string_double_escaped": _call('"{\\"p\\": \\"\\\\ud800\\"}"'),
    "arguments_string_key_double_escaped": _call('"{\\"\\\\udfff\\": 1}"'),
    "arguments_string_escaped": _call('"{\\"p\\": \\"' + ESC + '\\"}"'),
    "arguments_object": _call('{"p":"' + ESC + '"}'),
    "arguments_object_raw_bytes": _call('{"p":"' + RAW + '"}'),
    "tool_call_name": _call('"{}"').replace('"name":"ls"', '"name":"l' + ESC + '"'),
    "message_name": '{"role":"user","content":"a","name":"n' + ESC + '"}',
    "tool_call_id": _call('"{}"').replace('"tool_call_id":"c1"', '"tool_call_id":"c' + RAW + '"'),
}
TOOLS = ('[{"type":"function","function":{"name":"ls","description":"d' + RAW + '","parameters":{"type":"object"}}}]')


def _body(messages: str, extra: str = "") -> bytes:
    text = '{"messages":[{"role":"user","content":"hi"},' + messages + ']' + extra + '}'
    return text.encode("utf-8", "surrogatepass").replace(RAW.encode("utf-8", "surrogatepass"), b"\xed\xa0\x80")


@pytest.mark.parametrize("where", [*CASES, "tool_definition_raw_bytes", "tool_definition_in_arguments"])
def test_a_lone_surrogate_anywhere_in_a_chat_request_is_a_400(policy_server, make_proxy, where):
    proxy, url = make_proxy(policy_server.url)
    if where == "tool_definition_raw_bytes":
        body = _body('{"role":"user","content":"x"}', ',"tools":' + TOOLS)
    elif where == "tool_definition_in_arguments":
        body = _body(_call('"[\\"\\\\udbff\\"]"'))  # not a dict: rendered as the string itself, which is fine
    else:
        body = _body(CASES[where])
    r = httpx.post(f"{url}/v1/chat/completions", content=body, timeout=30,
                   headers={"content-type": "application/json", "X-Turn-Type": "side"})
    if where == "tool_definition_in_arguments":
        assert r.status_code in (200, 400), r.text
    else:
        assert r.status_code == 400, (r.status_code, r.text[:300])
        assert "surrogate" in r.json()["error"]["message"], r.text
    assert metric(proxy, "openclaw_requests_total", route="/v1/chat/completions", code="500") == 0
