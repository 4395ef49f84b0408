"""The proxy driven by the real OpenAI SDK against a scripted SGLang-compatible policy and judge."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from support import metric, policy_reply, request_count, scripted_server, wait_for_samples

TOOLS = [{"type": "function", "function": {"name": "ls", "description": "list files",
                                            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


def client(url: str, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=kw.pop("api_key", "x"), max_retries=0, **kw)


def test_non_streaming_reply_and_exact_sample(policy_server, make_proxy, tokenizer):
    proxy, url = make_proxy(policy_server.url, rl_keep_masked_samples=True)
    c = client(url)
    out = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                    extra_headers={"X-Session-Id": "s1"}, max_completion_tokens=200)
    text = out.choices[0].message.content
    assert text.startswith("Sure") and "\U0001f642" in text
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens > 0
    assert out.choices[0].logprobs is None  # forced log-probs never leak to clients (upstream bug 28)
    # the session ends: its turn is flushed without a next state (masked, kept because keep_masked_samples)
    c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "bye"}],
                              extra_headers={"X-Session-Id": "s1", "X-Session-Done": "yes"})
    samples = wait_for_samples(proxy, 2)
    first = next(s for s in samples if s.turn == 1)
    # exactness: the response ids decode to the text but are NOT what re-tokenising the text gives
    assert tokenizer.decode(first.response_ids, skip_special_tokens=True) == text
    retokenized = tokenizer.encode(text, add_special_tokens=False)
    assert first.response_ids[:-1] != retokenized
    assert first.response_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert len(first.rollout_log_probs) == len(first.response_ids) == len(first.loss_mask)
    assert first.tokens[: len(first.prompt_ids)] == first.prompt_ids
    assert first.loss_mask == [0] * len(first.loss_mask) and first.reward == 0.0  # no next state, no judge


def test_streaming_forwards_tokens_and_usage(tokenizer, make_proxy):
    # a model-paced policy: tokens that arrive together in one read are sent as one delta. 100 tokens/s (one per
    # byte: ~0.6 s for the reply) leaves a loaded machine's stalls room; at 400/s a busy run saw only 5 deltas
    with scripted_server(tokenizer, policy_reply, tokens_per_s=100) as paced:
        proxy, url = make_proxy(paced.url)
        c = client(url)
        stream = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}], stream=True,
                                           stream_options={"include_usage": True}, extra_headers={"X-Session-Id": "st"})
        chunks = list(stream)
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert content.startswith("Sure") and content.endswith("ok.")
    assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) > 5  # real token streaming
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["stop"]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_and_reasoning(policy_server, make_proxy, stream):
    _, url = make_proxy(policy_server.url)
    c = client(url)
    msgs = [{"role": "user", "content": "please list the files"}]
    if not stream:
        out = c.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
        call = out.choices[0].message.tool_calls[0]
        assert out.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "ls" and json.loads(call.function.arguments) == {"path": "."}
        out = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "think first"}])
        assert out.choices[0].message.content == "The answer is 42."
        assert out.choices[0].message.model_extra["reasoning_content"].startswith("Let me think.")
    else:
        chunks = list(c.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS, stream=True))
        deltas = [d for ch in chunks if ch.choices for d in (ch.choices[0].delta.tool_calls or [])]
        assert len(deltas) == 1 and deltas[0].index == 0 and deltas[0].function.name == "ls"
        assert json.loads(deltas[0].function.arguments) == {"path": "."}
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        chunks = list(c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "think first"}],
                                                stream=True))
        reasoning = "".join(ch.choices[0].delta.model_extra.get("reasoning_content") or "" for ch in chunks if ch.choices)
        content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert reasoning.startswith("Let me think.") and content == "The answer is 42."


def test_multi_turn_sessions_are_judged_in_order(policy_server, judge_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, judge_server.url, judge_votes=3)
    c = client(url)
    history: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    replies = {"a": ["hello", "thanks, great", "that is wrong", "thanks"], "b": ["hi", "wrong again", "ok thanks"]}
    for step in range(4):  # interleave two sessions
        for sid in ("a", "b"):
            if step >= len(replies[sid]):
                continue
            history[sid].append({"role": "user", "content": replies[sid][step]})
            out = c.chat.completions.create(model="tiny", messages=history[sid], extra_headers={"X-Session-Id": sid})
            history[sid].append({"role": "assistant", "content": out.choices[0].message.content})
    samples = wait_for_samples(proxy, 5)
    by_session = {sid: [s for s in samples if s.session_id == sid] for sid in ("a", "b")}
    # a: turn1 next=thanks (+1), turn2 next=wrong (-1), turn3 next=thanks (+1); turn4 still parked
    assert [(s.turn, s.reward) for s in by_session["a"]] == [(1, 1.0), (2, -1.0), (3, 1.0)]
    assert [(s.turn, s.reward) for s in by_session["b"]] == [(1, -1.0), (2, 1.0)]
    assert all(set(s.loss_mask) == {1} for s in samples)
    assert by_session["a"][0].metadata["judge_votes"] == [1, 1, 1]
    assert proxy.tracker.pending_turns == 2  # the last turn of each session waits for its next state


def test_bad_requests_get_openai_errors_and_leave_state_unchanged(policy_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, proxy_max_body_bytes=20_000)
    cases = [
        (b"{not json", 400), (b"[1,2]", 400), (b"{}", 400), (b'{"messages": []}', 400),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}', 400),
        (b'{"messages": [{"role": "user", "content": 5}]}', 400),
        (b'{"messages": [{"role": "user"}]}', 400),
        (b'{"messages": [{"role": "user", "content": "x"}], "n": 2}', 400),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', 400),
        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', 400),
        (json.dumps({"messages": [{"role": "user", "content": "x" * 30_000}]}).encode(), 413),
    ]
    for body, status in cases:
        r = httpx.post(f"{url}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, (body[:60], r.text)
        err = r.json()["error"]
        assert err["message"] and err["type"] and err["code"] == status
    assert proxy.tracker.pending_turns == 0 and proxy.spool.depth() == 0
    assert httpx.get(f"{url}/v1/nope").status_code == 404



def test_the_chat_route_served_in_front_of_fastapi_keeps_its_answers(policy_server, make_proxy, monkeypatch):
    """POST /v1/chat/completions is served without FastAPI's routing layers (DirectRoute): its errors, the
    header limit, the request metrics and other methods on the path must stay what FastAPI gave."""
    from openclaw_rl.server import DirectRoute

    proxy, url = make_proxy(policy_server.url, proxy_max_header_bytes=4096)
    assert isinstance(proxy.app, DirectRoute)
    chat = f"{url}/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert httpx.post(chat, json=body).status_code == 200
    assert request_count(proxy, 200) == 1
    r = httpx.post(chat, json=body, headers={"x-big": "x" * 5000})
    assert r.status_code == 431 and r.json()["error"]["code"] == 431
    assert httpx.get(chat).status_code == 405  # other methods: FastAPI's answer

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(proxy.service, "complete", broken)
    r = httpx.post(chat, json=body)
    assert r.status_code == 500 and r.json()["error"]["type"] and "a bug" not in r.text
    assert request_count(proxy, 500) == 1 and request_count(proxy, 431) == 1

def test_backend_down_and_timeout_map_to_502_504(make_proxy, tokenizer):
    from support import scripted_server

    from openclaw_rl.servers import free_port

    proxy, url = make_proxy(f"http://127.0.0.1:{free_port()}")
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 502 and "unreachable" in r.json()["error"]["message"]
    with scripted_server(tokenizer, lambda p: "slow", ttft_s=1.0) as slow:
        proxy, url = make_proxy(slow.url, proxy_request_timeout_s=0.3)
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                       headers={"X-Session-Id": "t"}, timeout=10)
        assert r.status_code == 504
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                           "stream": True}, headers={"X-Session-Id": "t"}, timeout=10)
        assert r.status_code == 504
    proxy.writer.flush()
    assert metric(proxy, "openclaw_turns_dropped_total", reason="generation_failed") == 2
    assert proxy.tracker.pending_turns == 0


def test_paused_submission_rejects_with_retry_after_or_holds(policy_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, gate_open=False)
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and r.headers["retry-after"] == "2"
    assert httpx.get(f"{url}/healthz").json()["submission_open"] is False
    proxy, url = make_proxy(policy_server.url, gate_open=False, proxy_pause_mode="hold", proxy_pause_hold_s=10)
    import threading
    threading.Timer(0.3, proxy.gate.open).start()
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=20)
    assert r.status_code == 200


def test_api_keys_namespace_sessions(policy_server, judge_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, judge_server.url, proxy_api_keys=["k1", "k2"], judge_votes=1)
    assert httpx.post(f"{url}/v1/chat/completions", json={"messages": []}).status_code == 401
    assert httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                      headers={"Authorization": "Bearer nope"}).status_code == 401
    for key in ("k1", "k2"):
        c = client(url, api_key=key)
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                  extra_headers={"X-Session-Id": "same"})
    # a next state sent under k2 must not judge k1's turn
    c = client(url, api_key="k2")
    c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}, {"role": "assistant",
                              "content": "x"}, {"role": "user", "content": "thanks"}], extra_headers={"X-Session-Id": "same"})
    samples = wait_for_samples(proxy, 1)
    assert len(samples) == 1 and samples[0].metadata["session_key"].startswith(proxy.auth.keys[1][1])
    assert len(proxy.tracker.sessions) == 2


def test_backend_clients_share_one_verifying_tls_context(make_proxy, monkeypatch):
    """Built once per process (loading the CA bundle costs ~40 ms a client), still verifying, and the one
    each proxy's backend client is given."""
    import ssl

    from openclaw_rl import server
    from openclaw_rl.server import tls_context

    ctx = tls_context()
    assert ctx is tls_context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.cert_store_stats()["x509_ca"] > 0  # the CA bundle is loaded
    given: list[Any] = []

    def recorded() -> ssl.SSLContext:
        given.append(ctx)
        return ctx

    monkeypatch.setattr(server, "tls_context", recorded)
    make_proxy("http://127.0.0.1:9")
    assert given == [ctx]
