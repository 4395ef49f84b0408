"""POST /v1/feedback: an explicit rating is the turn's next state (or overrides the judge)."""

from __future__ import annotations

import httpx
from support import settle, wait_for_samples


def chat(url: str, sid: str, messages: list[dict], key: str | None = None) -> dict:
    headers = {"X-Session-Id": sid, **({"Authorization": f"Bearer {key}"} if key else {})}
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": messages}, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def test_feedback_scores_a_turn_without_any_judge(policy_server, make_proxy):
    proxy, url = make_proxy(policy_server.url)  # no judge URL: only feedback can give a reward
    chat(url, "f", [{"role": "user", "content": "hello"}])
    r = httpx.post(f"{url}/v1/feedback", json={"session_id": "f", "rating": -1, "text": "not what I asked"})
    assert r.json() == {"session_id": "f", "turn": 1, "applied_as": "next_state"}
    s = wait_for_samples(proxy, 1)[0]
    assert (s.reward, set(s.loss_mask)) == (-1.0, {1})
    # the turn is settled: more feedback on it is refused
    assert httpx.post(f"{url}/v1/feedback", json={"session_id": "f", "rating": 1}).status_code == 404


def test_without_a_judge_or_feedback_a_next_state_drops_its_turn_as_no_judge(policy_server, make_proxy):
    """The reason says why: the next state came (not no_next_state), but nothing scored it."""
    from support import metric

    proxy, url = make_proxy(policy_server.url)
    first = [{"role": "user", "content": "hello"}]
    reply = chat(url, "n", first)
    chat(url, "n", [*first, {"role": "assistant", "content": reply["content"]}, {"role": "user", "content": "ok"}])
    httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "bye"}]},
               headers={"X-Session-Id": "n", "X-Session-Done": "1"}, timeout=30)
    settle(proxy)
    dropped = {r: metric(proxy, "openclaw_turns_dropped_total", reason=r) for r in ("no_judge", "no_next_state")}
    assert dropped == {"no_judge": 2.0, "no_next_state": 1.0}


def test_feedback_overrides_the_judge(policy_server, judge_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, judge_server.url, judge_votes=1, proxy_api_keys=["a", "b"])
    reply = chat(url, "o", [{"role": "user", "content": "hello"}], key="a")
    r = httpx.post(f"{url}/v1/feedback", json={"session_id": "o", "rating": 1},
                   headers={"Authorization": "Bearer b"})
    assert r.status_code == 404  # another key's namespace cannot rate this session
    r = httpx.post(f"{url}/v1/feedback", json={"session_id": "o", "rating": 1}, headers={"Authorization": "Bearer a"})
    assert r.status_code == 200
    s = wait_for_samples(proxy, 1)[0]
    assert s.reward == 1.0 and s.metadata["judge_votes"] == []
    assert reply["role"] == "assistant"


def test_bad_feedback_requests(policy_server, make_proxy):
    proxy, url = make_proxy(policy_server.url)
    for body in ({}, {"session_id": "x", "rating": 2}, {"session_id": "", "rating": 1},
                 {"session_id": "x", "rating": 1, "extra": 1}):
        r = httpx.post(f"{url}/v1/feedback", json=body)
        assert r.status_code == 400 and r.json()["error"]["message"]
    assert httpx.post(f"{url}/v1/feedback", json={"session_id": "nope", "rating": 1}).status_code == 404
    settle(proxy)
