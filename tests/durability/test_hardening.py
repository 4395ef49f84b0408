"""Issue 11: one request cannot stall the proxy, requests fit the context, backends that answer nonsense
cost one turn (never a 500 or a wedged session), retries replace the turn they repeat, keys are exact,
judge failures are not zero scores, the spool pushes back, and /healthz knows the backends."""

from __future__ import annotations

import json
import logging
import threading

import httpx
import pytest
from support import fault_backend, metric, on_loop, scripted_server, settle, wait_for_samples

from openclaw_rl.errors import BadRequest
from openclaw_rl.servers import free_port

BODY = {"messages": [{"role": "user", "content": "hello"}]}


def chat(url: str, body: dict, sid: str = "s", timeout: float = 30, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-Id": sid, **headers},
                      timeout=timeout)


def dropped(proxy, reason: str) -> float:
    return metric(proxy, "openclaw_turns_dropped_total", reason=reason)


# --- one request cannot stall the others ------------------------------------------------------------------

def test_healthz_and_other_requests_are_served_while_a_huge_request_renders(policy_server, make_proxy):
    proxy, url = make_proxy(policy_server.url)
    entered, release = threading.Event(), threading.Event()
    render = proxy.renderer.render_ids

    def blocking_render(messages, *a, **kw):
        if len(messages) > 1000:  # only the huge request waits, inside the renderer, until the test lets it go
            entered.set()
            assert release.wait(30)
            raise BadRequest("released by the test")  # (tokenising 1.2M tokens would only slow the suite)
        return render(messages, *a, **kw)

    proxy.renderer.render_ids = blocking_render
    huge = {"messages": [{"role": "user", "content": "x" * 200} for _ in range(6000)], "max_tokens": 4}
    assert len(json.dumps(huge)) > (1 << 20)  # a bulk request (its own render thread)
    result: dict = {}
    big = threading.Thread(target=lambda: result.update(r=chat(url, huge, "big", timeout=120)))
    big.start()
    try:
        assert entered.wait(60), "the huge request never reached the renderer"
        # The renderer is blocked mid-request. Were rendering on the event loop, nothing below could be served.
        health = httpx.get(f"{url}/healthz", timeout=10)
        assert health.status_code == 200
        assert chat(url, BODY, "small", timeout=10).status_code == 200  # ordinary turns are not held up either
        assert big.is_alive()  # served concurrently: the huge request is still in progress
    finally:
        release.set()
        big.join(120)
    assert result["r"].status_code == 400 and result["r"].json()["error"]["message"] == "released by the test"


def test_message_count_is_bounded_before_anything_is_rendered(policy_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, proxy_max_messages=100)
    calls = []
    render = proxy.renderer.render_ids
    proxy.renderer.render_ids = lambda *a, **kw: calls.append(1) or render(*a, **kw)
    r = chat(url, {"messages": [{"role": "user", "content": "x"}] * 101})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert "too many messages" in r.json()["error"]["message"] and not calls
    assert chat(url, {"messages": [{"role": "user", "content": "x"}] * 100}).status_code == 200
    assert calls  # the hook sees the proxy's renders: "not calls" above means none happened


def test_a_prompt_that_cannot_fit_is_refused_before_it_is_rendered(policy_server, make_proxy):
    proxy, url = make_proxy(policy_server.url)
    calls = []
    render = proxy.renderer.render_ids
    proxy.renderer.render_ids = lambda *a, **kw: calls.append(1) or render(*a, **kw)
    limit = proxy.service.context_length * proxy.service.max_token_bytes  # bytes that may still fit
    r = chat(url, {"messages": [{"role": "user", "content": "z" * (limit + 10)}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "at least" in r.json()["error"]["message"] and not calls
    assert chat(url, BODY).status_code == 200 and calls  # the hook sees the proxy's renders


# --- requests fit the server's context --------------------------------------------------------------------

def prompt_of(tokenizer, n_tokens: int) -> list[dict]:
    """A one-message conversation whose rendered prompt has exactly ``n_tokens`` tokens."""
    def size(k: int) -> int:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "a " * k}], tokenize=False,
                                             add_generation_prompt=True)
        return len(tokenizer.encode(text, add_special_tokens=False))
    lo, hi = 0, n_tokens
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if size(mid) < n_tokens else (lo, mid)
    assert size(lo) == n_tokens
    return [{"role": "user", "content": "a " * lo}]


def test_context_is_learned_from_the_server_and_max_tokens_clamped(tokenizer, make_proxy):
    with scripted_server(tokenizer, lambda p: "ok " * 2000, context_length=4096) as policy:
        proxy, url = make_proxy(policy.url)
        assert proxy.service.context_length == 4096
        assert httpx.get(f"{url}/healthz").json()["backends"]["policy"]["context_length"] == 4096
        messages = prompt_of(tokenizer, 3012)
        r = chat(url, {"messages": messages})  # no max_tokens: the default 2048 would not fit (SGLang: 400)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == 3012
        assert r.json()["usage"]["completion_tokens"] <= 4096 - 3012
        r = chat(url, {"messages": messages, "max_tokens": 4000}, "s2")  # clamped to what is left
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
        r = chat(url, {"messages": prompt_of(tokenizer, 4096)}, "s3")
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and err["type"] == "invalid_request_error"
        assert err["param"] == "messages" and "maximum context length is 4096" in err["message"]


def test_judge_max_new_tokens_fit_the_judges_context(policy_server, tokenizer, make_proxy):
    with scripted_server(tokenizer, lambda p: "fine \\boxed{1}", context_length=1024) as judge:
        # 4096 new tokens never fit a 1024-token judge: unclamped, every vote fails (the server says 400)
        proxy, url = make_proxy(policy_server.url, judge.url, judge_votes=1, judge_max_new_tokens=4096)
        assert proxy.judge.context_length == 1024
        r = chat(url, BODY, "j")
        chat(url, {"messages": BODY["messages"] + [r.json()["choices"][0]["message"],
                                                   {"role": "user", "content": "thanks"}]}, "j")
        samples = wait_for_samples(proxy, 1)
        assert samples[0].reward == 1.0 and samples[0].metadata["judge_votes"] == [1]


# --- backends: reachability, failures, nonsense values ----------------------------------------------------

def test_healthz_reports_backend_reachability(policy_server, make_proxy):
    dead = f"http://127.0.0.1:{free_port()}"
    _, url = make_proxy(dead, policy_server.url)
    health = httpx.get(f"{url}/healthz").json()
    assert health["ok"] is False and health["backends"]["policy"]["reachable"] is False
    assert health["backends"]["judge"]["reachable"] is True
    _, url = make_proxy(policy_server.url)
    health = httpx.get(f"{url}/healthz").json()
    assert health["ok"] is True and health["backends"]["policy"]["reachable"] is True


@pytest.mark.parametrize("bad", [{"ids": [65, 2 ** 40, 2]}, {"ids": [65, 99_999, 2]},
                                 {"ids": [65, 66, 2], "logprobs": [-0.1, float("nan"), -0.2]},
                                 {"ids": [65, 66, 2], "logprobs": [-0.1, float("-inf"), -0.2]}],
                         ids=["id_2^40", "id_out_of_vocab", "nan_logprob", "minus_inf_logprob"])
@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
def test_untrainable_backend_values_cost_one_turn_never_the_session(make_proxy, tokenizer, bad, stream):
    with fault_backend(tokenizer=tokenizer) as backend:
        proxy, url = make_proxy(backend.url)
        backend.plan = [{}, bad]
        convo = list(BODY["messages"])
        r = chat(url, {"messages": convo, "stream": stream})
        assert r.status_code == 200
        convo += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
        r = chat(url, {"messages": convo, "stream": stream})
        if stream:  # headers were sent: the stream ends with an error event and [DONE], never cut
            events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == 502
        else:
            assert r.status_code == 502 and "invalid values" in r.json()["error"]["message"]
        assert dropped(proxy, "backend_invalid_output") == 1
        convo += [{"role": "user", "content": "once more"}]  # the session goes on: later turns still count
        for text in ("and again", "thanks"):
            assert chat(url, {"messages": convo, "stream": stream}).status_code == 200
            convo += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": text}]
        settle(proxy)
        tracker_state = on_loop(proxy, lambda: (proxy.tracker.unsettled_turns, proxy.tracker.pending_turns))
        assert tracker_state == (1, 1)  # only the newest turn waits; nothing is stuck behind the bad one
        assert dropped(proxy, "settle_failed") == 0


def test_judge_failure_is_judge_failed_not_zero_score(policy_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, f"http://127.0.0.1:{free_port()}", judge_votes=3,
                            judge_retry_attempts=1)
    convo = list(BODY["messages"])
    for text in ("thanks", "thanks", "bye"):
        r = chat(url, {"messages": convo}, "dead-judge")
        convo += [r.json()["choices"][0]["message"], {"role": "user", "content": text}]
    settle(proxy)
    assert dropped(proxy, "judge_failed") == 2 and dropped(proxy, "zero_score") == 0
    assert proxy.spool.depth() == 0  # a dead judge's 0 is not a verdict: nothing is trained on it
    assert 'openclaw_turns_dropped_total{reason="judge_failed"} 2.0' in httpx.get(f"{url}/metrics").text


# --- retries, disconnects ---------------------------------------------------------------------------------

def test_identical_resend_replaces_the_unanswered_turn(policy_server, judge_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, judge_server.url, judge_votes=1)
    first = chat(url, BODY, "r")
    second = chat(url, BODY, "r")  # the client never used `first`
    assert first.status_code == second.status_code == 200
    convo = BODY["messages"] + [second.json()["choices"][0]["message"], {"role": "user", "content": "thanks"}]
    assert chat(url, {"messages": convo}, "r").status_code == 200
    samples = wait_for_samples(proxy, 1)
    settle(proxy)
    assert [(s.session_id, s.turn) for s in samples] == [("r", 2)]
    assert dropped(proxy, "superseded_by_retry") == 1
    assert samples[0].reward == 1.0  # judged on the real next state, not on the repeated question


def test_openai_sdk_timeout_retry_cancels_the_backend_call_and_trains_once(make_proxy, tokenizer):
    openai = pytest.importorskip("openai")
    with fault_backend(tokenizer=tokenizer) as backend:
        proxy, url = make_proxy(backend.url)
        backend.plan = [{"delay": 5.0, "text": "slow"}, {"text": "fast"}]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", timeout=1.0, max_retries=1)
        reply = client.chat.completions.create(model="m", messages=BODY["messages"],
                                               extra_headers={"X-Session-Id": "sdk"})
        assert reply.choices[0].message.content == "fast"
        assert len(backend.calls) == 2
        settle(proxy)
        # the proxy hung up on the slow call as soon as the SDK gave up on it (not after 5 s)
        assert backend.hung_up == 1
        assert dropped(proxy, "client_disconnected") == 1
        assert on_loop(proxy, lambda: proxy.tracker.pending_turns) == 1  # only the answered turn waits


# --- keys ------------------------------------------------------------------------------------------------

def test_tokens_are_compared_exactly(policy_server, make_proxy):
    _, url = make_proxy(policy_server.url, proxy_api_keys=["k"])
    side = {"X-Turn-Type": "side"}
    # (trailing spaces cannot be sent: HTTP strips them as optional whitespace, and h11 refuses to send them)
    for auth in ("Bearer  k", "Bearer k\xa0", "Bearer \xa0", "Bearer \xa0k", "Bearer K", "Bearer k\tk"):
        r = httpx.post(f"{url}/v1/chat/completions", json=BODY,
                       headers={"Authorization": auth.encode("latin-1"), **side})
        assert r.status_code == 401, auth
    assert chat(url, BODY, Authorization="Bearer k", **side).status_code == 200


# --- back-pressure ----------------------------------------------------------------------------------------

def test_full_spool_and_overflow_push_back_with_503_then_reopen(policy_server, judge_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, judge_server.url, judge_votes=1, spool_max_bytes=1,
                            spool_max_overflow=2)
    def converse(sid: str, n: int) -> list[int]:
        convo, codes = list(BODY["messages"]), []
        for _ in range(n):
            r = chat(url, {"messages": convo}, sid)
            codes.append(r.status_code)
            if r.status_code == 200:
                convo += [r.json()["choices"][0]["message"], {"role": "user", "content": "thanks"}]
        return codes
    assert converse("a", 2) == [200, 200]  # 1 sample fills the 1-byte cap
    assert converse("b", 3) == [200, 200, 200]  # 2 more wait in memory
    settle(proxy)
    assert proxy.spool.depth() == 1 and len(proxy.writer.overflow) == 2
    r = chat(url, BODY, "c")
    assert r.status_code == 503 and r.headers["retry-after"] == "30"
    assert metric(proxy, "openclaw_backpressure_total") == 1
    batch, _ = proxy.spool.lease(10)  # the trainer takes and acknowledges a batch: room again
    proxy.spool.max_bytes = 1 << 30
    proxy.spool.ack(batch)
    wait_for_samples(proxy, 2, timeout=10)  # the writer retries the backlog on its own (idle retry)
    assert len(proxy.writer.overflow) == 0 and proxy.spool.depth() == 2
    assert chat(url, BODY, "c").status_code == 200


# --- logs ------------------------------------------------------------------------------------------------

def test_client_strings_are_escaped_and_capped_in_logs(caplog):
    from openclaw_rl.metrics import ProxyMetrics
    from openclaw_rl.turns import DropReason

    caplog.set_level(logging.INFO, logger="openclaw_rl.drops")
    forged = "x\n2026-12-01 09:00:00,000 ERROR openclaw_rl: FORGED\x00" + "y" * 1_000_000
    ProxyMetrics().drop(DropReason.NO_NEXT_STATE, forged, 1, detail="\r\nFORGED too")
    message = caplog.records[-1].getMessage()
    assert "\n" not in message and "\r" not in message and "\x00" not in message
    assert "\\n2026-12-01" in message and len(message) < 1000 and "+999" in message
