"""Edge cases an adversarial review found: each request gets a clear answer, and none is silently ignored.

A body cut off by the client is a 499 with one log line (not a 500 with a traceback); request fields the
proxy cannot honour are 400s naming them; a blank session id never makes unrelated conversations one
session; log-prob bytes are the token's own bytes, also for a token that holds part of a character.
"""

from __future__ import annotations

import logging
import socket

import httpx
import pytest
from support import metric, wait_until

from openclaw_rl.protocol import ChatCompletionRequest

HI = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}]


def _chat(url: str, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30)


def _requests(proxy, code: str) -> float:
    return metric(proxy, "openclaw_requests_total", route="/v1/chat/completions", code=code)


def test_a_body_cut_off_by_the_client_is_a_499_with_one_log_line(policy_server, make_proxy, caplog):
    proxy, url = make_proxy(policy_server.url)
    host, port = url.removeprefix("http://").split(":")
    caplog.set_level(logging.INFO, logger="openclaw_rl.routes")
    for framing in (b"Content-Length: 100\r\n", b"Transfer-Encoding: chunked\r\n"):
        with socket.create_connection((host, int(port))) as s:
            body = b'{"messages"' if b"Length" in framing else b'b\r\n{"messages"\r\n'
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + framing + b"\r\n" + body)
    wait_until(lambda: _requests(proxy, "499") == 2)
    assert _requests(proxy, "500") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert sum("client hung up on /v1/chat/completions" in r.getMessage() for r in caplog.records) == 2
    assert _chat(url, {"messages": HI}).status_code == 200  # and the proxy serves on


@pytest.mark.parametrize(("extra", "says"), [
    ({"logit_bias": {"100": -100}}, "logit_bias is not supported"),
    ({"logit_bias": {"1": float("nan")}}, "finite number"),
    ({"top_logprobs": 5}, "top_logprobs needs logprobs=true"),
    ({"top_logprobs": 21, "logprobs": True}, "less than or equal to 20"),
    ({"logprobs": True, "top_logprobs": 2, "stream": True}, "top_logprobs come with non-streamed replies only"),
    ({"tool_choice": "required"}, "needs 'tools'"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": TOOLS}, "do not offer: 'nope'"),
    ({"stop": [""]}, "cannot be empty"),
    ({"stop": ""}, "cannot be empty"),
    ({"temperature": float("nan")}, "finite number"),
    ({"messages": [*HI, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
                   {"role": "tool", "content": "a.txt"}]}, "needs the 'tool_call_id'"),
])
def test_fields_the_proxy_cannot_honour_are_400s_that_name_them(extra, says):
    """Validated by the schema itself; the proxy answers its message as a 400 (tests/fuzz covers the route)."""
    with pytest.raises(ValueError, match=says):
        ChatCompletionRequest.model_validate({"messages": HI, **extra})


def test_what_stays_accepted(policy_server, make_proxy):
    """An empty logit_bias, a seed (OpenAI promises no determinism), a tool_choice naming an offered tool,
    and the Bearer scheme in any case (RFC 9110: case-insensitive)."""
    proxy, url = make_proxy(policy_server.url, proxy_api_keys=["k"])
    for extra in ({"logit_bias": {}, "seed": 7}, {"tools": TOOLS, "tool_choice": {"type": "function",
                                                                                   "function": {"name": "ls"}}},
                  {"tools": TOOLS, "tool_choice": "required"}, {"logprobs": True, "top_logprobs": 0}):
        assert _chat(url, {"messages": HI, **extra}, authorization="bearer k").status_code == 200, extra
    answer = _chat(url, {"messages": HI, "logit_bias": {"5": 1}}, authorization="BEARER k")
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "logit_bias"


def test_no_docs_no_redirects_every_unknown_path_is_a_json_404(policy_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, proxy_api_keys=["k"])
    for path in ("/docs", "/redoc", "/openapi.json"):
        answer = httpx.get(f"{url}{path}")
        assert answer.status_code == 404 and answer.json()["error"]["code"] == 404, path
    answer = httpx.post(f"{url}/v1/chat/completions/", json={"messages": HI}, headers={"authorization": "Bearer k"})
    assert answer.status_code == 404 and "error" in answer.json()


def test_a_blank_session_id_falls_through_and_an_overlong_one_is_refused(policy_server, make_proxy):
    proxy, url = make_proxy(policy_server.url)
    for blank in ("   ", "\t"):
        assert _chat(url, {"messages": [{"role": "user", "content": f"alone {blank!r}"}],
                           "session_id": blank}).status_code == 200
    keys = [key.split("\x1f", 1)[1] for key in proxy.tracker.sessions]
    assert "" not in keys and len(keys) == 2 and all(k.startswith("prefix-") for k in keys), keys
    answer = _chat(url, {"messages": HI}, **{"X-Session-Id": "s" * 513})
    assert answer.status_code == 400 and "at most 512" in answer.json()["error"]["message"]
    assert _chat(url, {"messages": HI}, **{"X-Session-Id": "s" * 512}).status_code == 200
    assert metric(proxy, "openclaw_turns_total", type="main") == 3  # the refused request counts no turn


def test_main_line_turns_drop_the_penalties_as_they_drop_top_p(policy_server, make_proxy, caplog):
    """With a rollout temperature (the default), main-line sampling is the policy's own distribution: a
    client's presence/frequency penalty would reshape it as top_p would. Side turns keep them."""
    proxy, _ = make_proxy(policy_server.url)
    req = ChatCompletionRequest.model_validate({"messages": HI, "presence_penalty": 0.5, "frequency_penalty": 0.3,
                                                "top_p": 0.9})
    main, _ = proxy.service._sampling_params(req, main=True)
    side, _ = proxy.service._sampling_params(req, main=False)
    assert "presence_penalty" not in main and "frequency_penalty" not in main and main["top_p"] == 1.0
    assert (side["presence_penalty"], side["frequency_penalty"], side["top_p"]) == (0.5, 0.3, 0.9)
    assert "presence_penalty and frequency_penalty dropped on main-line turns" in caplog.text


def test_logprob_bytes_are_the_tokens_own_bytes(policy_server, make_proxy, tokenizer):
    """The scripted reply holds "café" and an emoji: some tokens carry part of a character, whose decode
    alone is U+FFFD. Their bytes joined are the reply's UTF-8 bytes exactly."""
    proxy, url = make_proxy(policy_server.url)
    reply = _chat(url, {"messages": HI, "logprobs": True}).json()["choices"][0]
    content = reply["message"]["content"]
    tokens = reply["logprobs"]["content"]
    assert any(t["token"] == "\ufffd" for t in tokens)  # the case the old bytes got wrong
    joined = b"".join(bytes(t["bytes"]) for t in tokens)
    assert joined.decode().removesuffix("<|im_end|>") == content and "\U0001f642" in content
    renderer = proxy.service.renderer
    for text in ("naïve 🙂 日本語", "<|im_end|>", " x"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert b"".join(bytes(renderer.token_bytes(i)) for i in ids) == text.encode(), text


def test_top_logprobs_come_with_each_token(policy_server, make_proxy):
    """``top_logprobs: k``: each sampled token's k most likely alternatives, best first, in the same shape as
    the token itself; the sampled token, where it is among them, has the same log-prob there."""
    proxy, url = make_proxy(policy_server.url)
    entries = _chat(url, {"messages": HI, "logprobs": True, "top_logprobs": 3}).json()["choices"][0]["logprobs"]["content"]
    assert entries
    for e in entries:
        tops = e["top_logprobs"]
        assert len(tops) == 3 and all(set(t) == {"token", "logprob", "bytes"} for t in tops)
        assert [t["logprob"] for t in tops] == sorted((t["logprob"] for t in tops), reverse=True)
        assert e["logprob"] <= tops[0]["logprob"] + 1e-6
        same = [t for t in tops if t["bytes"] == e["bytes"]]
        assert not same or same[0]["logprob"] == pytest.approx(e["logprob"], abs=1e-5)
    assert any(t["bytes"] == e["bytes"] for e in entries for t in e["top_logprobs"])  # the sampled token shows up
    plain = _chat(url, {"messages": HI, "logprobs": True}).json()["choices"][0]["logprobs"]["content"]
    assert all(e["top_logprobs"] == [] for e in plain)


def test_a_stream_carries_each_tokens_log_prob_once_in_order(policy_server, make_proxy):
    """``logprobs: true`` on a stream: after each snapshot's text, a chunk with the log-probs of its new
    tokens; joined, they are the reply's tokens, their bytes the reply's text, as a non-streamed reply's."""
    import json

    proxy, url = make_proxy(policy_server.url)
    body = {"messages": HI, "logprobs": True, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    entries = [e for ev in events for c in ev["choices"] if c.get("logprobs") for e in c["logprobs"]["content"]]
    text = "".join(c["delta"].get("content") or "" for ev in events for c in ev["choices"])
    assert len(entries) == events[-1]["usage"]["completion_tokens"] > 1
    assert b"".join(bytes(e["bytes"]) for e in entries).decode().removesuffix("<|im_end|>") == text
    whole = _chat(url, {"messages": HI, "logprobs": True}).json()["choices"][0]["logprobs"]["content"]
    assert [(e["token"], e["bytes"]) for e in entries] == [(e["token"], e["bytes"]) for e in whole]


def test_a_validation_error_names_the_field_not_the_union_member(policy_server, make_proxy):
    """`content: []` used to answer "should be a valid string (at messages.0.content.str)": the first member of
    the content union, not the one the input was meant for."""
    proxy, url = make_proxy(policy_server.url)
    error = _chat(url, {"messages": [{"role": "user", "content": []}]}).json()["error"]
    assert "at least 1 item" in error["message"] and error["param"] == "messages.0.content"
