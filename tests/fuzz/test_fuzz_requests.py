"""Fuzz: hundreds of seeded malformed or adversarial requests at every endpoint.

Each must get a 4xx with an OpenAI-style error body, never a 500, and leave the proxy's sessions and
spool untouched. Unknown top-level fields are the exception: like OpenAI, they are accepted and ignored.
"""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest

VALID: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
TOOL = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}

WEIRD_STRINGS = ["", "\x00", "\ud800", "\udfff", "\u202e\u2066", "🙂" * 50, "a" * 5000, "\n\r\t", "<|im_end|>",
                 "<tool_call>{", "\\boxed{1}", "null", "[HINT_START]x[HINT_END]"]
BAD_VALUES: list[Any] = [None, 0, -1, 1.5, True, "x", [], {}, [1, 2], {"a": 1}, "9" * 400, float("1e308")]


def bad_bodies(rng: random.Random) -> list[tuple[bytes, str]]:
    """(raw body, what it breaks). Every one of these is invalid."""
    cases: list[tuple[bytes, str]] = []

    def add(obj: Any, why: str) -> None:
        cases.append((json.dumps(obj).encode(), why))

    # raw-byte garbage
    for raw in (b"", b"{", b"}", b"nul", b"\xff\xfe", b'{"messages": [}', b"[" * 100_000, b'"just a string"',
                b"12", b"null", b"\x00" * 10, b'{"messages": "\xc3\x28"}'):
        cases.append((raw, "not a JSON object"))
    cases.append((b"{" + b'"a":' * 5000 + b"1" + b"}" * 5000, "deep object"))
    add([VALID], "array body")
    # missing / wrong messages
    add({}, "no messages")
    for v in BAD_VALUES:
        if not isinstance(v, list) or v == []:
            add({"messages": v}, "messages wrong type")
    for v in BAD_VALUES:
        add({"messages": [v]}, "message wrong type") if not isinstance(v, dict) else None
    for role in ("wizard", "", "USER", None, 5, "assistant\x00"):
        add({"messages": [{"role": role, "content": "x"}]}, "bad role")
    for v in (5, 1.5, True, {"a": 1}, [1], [{"type": "text"}], [{"type": "text", "text": 5}], [{"no": "type"}]):
        add({"messages": [{"role": "user", "content": v}]}, "bad content")
    add({"messages": [{"role": "user"}]}, "user without content")
    add({"messages": [{"role": "tool", "content": None}]}, "tool without content")
    add({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]}, "call without name")
    add({"messages": [{"role": "assistant", "tool_calls": "x"}]}, "tool_calls not a list")
    # field types and ranges
    for field, values in {"max_tokens": [0, -5, "10", 1.5, []], "max_completion_tokens": [0, -1, "x"],
                          "temperature": [-0.1, 2.5, "hot", []], "top_p": [0, 1.5, "x"], "n": [0, 2, 100, "1x"],
                          "top_logprobs": [-1, 21, "x"], "stop": [[str(i) for i in range(17)], 5, {"a": 1}],
                          "stream": ["maybe", 5, {}], "tools": ["x", [1], [{"type": "function"}],
                                                                [{"type": "function", "function": {"name": ""}}],
                                                                [{"type": "code", "function": {"name": "x"}}],
                                                                [{"type": "function", "function": {"name": "a" * 300}}],
                                                                [{"type": "function", "function": {"name": "f",
                                                                                                   "parameters": "x"}}]],
                          "tool_choice": ["sometimes", 5, []], "response_format": [{"type": "json_schema"},
                                                                                   {"type": "json_object"}, "x"],
                          "logit_bias": ["x", {"1": "a"}], "stream_options": ["x", {"include_usage": "maybe"}],
                          "presence_penalty": [3, -3, "x"], "session_done": [[1], {"a": 1}]}.items():
        for v in values:
            add({**VALID, field: v}, f"bad {field}")
    # random structural mutations of a valid body
    for _ in range(400):
        body = json.loads(json.dumps({**VALID, "tools": [TOOL]}))
        target = rng.choice(["messages", "role", "content", "tools", "fn", "call", "field"])
        value = rng.choice(BAD_VALUES[:11])
        if target == "messages":
            body["messages"] = value if not isinstance(value, list) or value == [] else [value]
        elif target == "role":
            body["messages"][0]["role"] = rng.choice(["x", None, 1, "", "systemx"])
        elif target == "content":
            if value is None or isinstance(value, str):
                value = rng.choice([1, 2.5, {"a": 1}, [1]])
            body["messages"][0]["content"] = value
        elif target == "tools":
            body["tools"] = rng.choice(["x", 1, [1], [{"type": "function"}], {"a": 1}])
        elif target == "fn":
            body["tools"][0]["function"]["name"] = rng.choice(["", 5, None, "n" * 1000])
        elif target == "call":
            call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
            key, bad = rng.choice([("id", 5), ("type", "code"), ("function", "x"), ("function", {"arguments": "{}"}),
                                   ("function", {"name": 5}), ("function", {"name": "ls", "arguments": 5})])
            call[key] = bad
            body["messages"].append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            key = rng.choice(["tool_call_id", "name", "reasoning_content"])
            body["messages"][0][key] = rng.choice([5, 1.5, [], {"a": 1}, True])
        add(body, f"mutated {target}")
    return cases


@pytest.fixture
def fuzz_proxy(policy_server, make_proxy):
    return make_proxy(policy_server.url, proxy_max_body_bytes=200_000, proxy_api_keys=["k"])


def check_error(r: httpx.Response, why: str) -> None:
    assert 400 <= r.status_code < 500, (why, r.status_code, r.text[:300])
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and err["code"] == r.status_code, why


def test_fuzz_every_endpoint(fuzz_proxy, policy_server):
    proxy, url = fuzz_proxy
    rng = random.Random(1234)
    auth = {"Authorization": "Bearer k", "content-type": "application/json"}
    tried = 0
    with httpx.Client(timeout=30) as c:
        for raw, why in bad_bodies(rng):
            check_error(c.post(f"{url}/v1/chat/completions", content=raw, headers=auth), why)
            tried += 1
        for body in ({}, {"session_id": 5, "rating": 1}, {"session_id": "s", "rating": "up"}, {"rating": 1},
                     {"session_id": "s", "rating": 1, "text": 5}, {"session_id": "s" * 600, "rating": 1}, [1], "x"):
            check_error(c.post(f"{url}/v1/feedback", json=body, headers=auth), "feedback")
            tried += 1
        for raw in (b"{", b"\xff", b"[" * 50_000):
            check_error(c.post(f"{url}/v1/feedback", content=raw, headers=auth), "feedback raw")
            tried += 1
        check_error(c.post(f"{url}/v1/chat/completions", content=b" " * 300_000, headers=auth), "huge body")
        for headers in ({}, {"Authorization": "Bearer"}, {"Authorization": "Basic k"}, {"Authorization": "Bearer k2"},
                        {"Authorization": "Bearer " + "k" * 10_000}, {"Authorization": "bearer k2"},
                        {"Authorization": "Bearer  k"}):
            for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("POST", "/v1/feedback")):
                check_error(c.request(method, f"{url}{path}", json=VALID, headers=headers), f"auth {headers}")
                tried += 1
        for method, path in (("GET", "/v1/chat/completions"), ("PUT", "/v1/models"), ("GET", "/v1/completions"),
                             ("POST", "/v1/responses"), ("GET", "/../etc/passwd"), ("DELETE", "/healthz")):
            check_error(c.request(method, f"{url}{path}", headers=auth), f"{method} {path}")
            tried += 1
        # unknown top-level fields are accepted and ignored, like OpenAI (side turn: nothing is trained)
        ok = c.post(f"{url}/v1/chat/completions", headers={**auth, "X-Turn-Type": "side"},
                    json={**VALID, "frobnicate": {"x": [1, 2]}, "metadata": {"a": "b"}, "store": True})
        assert ok.status_code == 200
    assert tried >= 500, tried
    proxy.writer.flush()
    assert proxy.tracker.unsettled_turns == 0 and proxy.spool.depth() == 0 and not proxy.tracker.sessions
    assert not policy_server.app.crashed  # no out-of-vocabulary ids ever reached the backend


def test_surrogates_and_control_characters_in_content_are_served(fuzz_proxy):
    proxy, url = fuzz_proxy
    auth = {"Authorization": "Bearer k"}
    for s in WEIRD_STRINGS:
        body = json.dumps({"messages": [{"role": "user", "content": s or "x"}]}).encode()  # \\ud800 stays escaped
        r = httpx.post(f"{url}/v1/chat/completions", content=body, timeout=30,
                       headers={**auth, "X-Turn-Type": "side", "content-type": "application/json"})
        assert r.status_code in (200, 400), (repr(s[:20]), r.status_code, r.text[:200])


def test_oversized_headers_are_refused(fuzz_proxy):
    proxy, url = fuzz_proxy
    r = httpx.post(f"{url}/v1/chat/completions", json=VALID, headers={"Authorization": "Bearer k",
                                                                      "X-Padding": "x" * 100_000})
    assert r.status_code == 431 and r.json()["error"]["code"] == 431
    assert httpx.get(f"{url}/healthz").status_code == 200  # the server is unaffected
