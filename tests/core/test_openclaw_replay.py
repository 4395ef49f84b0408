"""Replay stock OpenClaw 2026.9.6's recorded requests through the proxy (tests/data/openclaw-golden).

Every main-line turn that has a next state must become a sample of the right session, with the right
next state, even though OpenClaw sends no X-Session-Id / X-Turn-Type and wraps every request with an
internal-context message.
"""

from __future__ import annotations

import json

import httpx
import pytest
from support import load_conversation, wait_for_samples

SKIP_HEADERS = {"host", "content-length", "connection", "accept-encoding", "authorization"}


def replay(url: str, rows: list[dict]) -> list[str]:
    events = []
    for row in rows:
        headers = {k: v for k, v in row["headers"].items() if k not in SKIP_HEADERS}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=row["body"], headers=headers, timeout=30) as r:
            assert r.status_code == 200, r.read()
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line[6:]) for line in lines[:-1]]
        assert chunks[-1]["usage"]["completion_tokens"] > 0  # OpenClaw asks for include_usage
        events.append("".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]))
    return events


@pytest.mark.parametrize("name,session", [("conversation_A.jsonl", "convA"), ("conversation_B.jsonl", "convB"),
                                          ("conversation_D_prompt_cache_key.jsonl", "convD")])
def test_recorded_openclaw_conversation_becomes_samples(name, session, policy_server, judge_server, make_proxy,
                                                        tmp_path):
    rows = load_conversation(name)
    proxy, url = make_proxy(policy_server.url, judge_server.url, judge_votes=1, rl_keep_masked_samples=True,
                            proxy_record_dir=str(tmp_path / "records"))
    replay(url, rows)
    expected = len(rows) - 1  # the last request's turn still waits for its next state
    samples = wait_for_samples(proxy, expected)
    assert [(s.session_id, s.turn) for s in samples] == [(session, i + 1) for i in range(expected)]
    proxy.writer.flush()
    records = [json.loads(line) for line in (tmp_path / "records" / "conversations.jsonl").read_text().splitlines()]
    for record, row_after in zip(records, rows[1:]):
        state = record["next_state"]
        last_real = [m for m in row_after["body"]["messages"]
                     if m["role"] in ("user", "tool") and "OPENCLAW_INTERNAL_CONTEXT" not in json.dumps(m)][-1]
        assert state["role"] == last_real["role"]
        content = last_real["content"] if isinstance(last_real["content"], str) else last_real["content"][0]["text"]
        assert state["content"] == content
        assert "INTERNAL_CONTEXT" not in state["content"]
    # the tool round trip of conversation A/B: the ls call's next state is the tool result, judged +1
    if len(rows) == 4:
        assert samples[2].reward == 1.0 and records[2]["next_state"]["role"] == "tool"


def test_replay_with_upstream_headers_keys_by_x_session_id(policy_server, make_proxy):
    rows = load_conversation("conversation_A.jsonl")
    proxy, url = make_proxy(policy_server.url, rl_keep_masked_samples=True)
    for row in rows:
        row["headers"]["x-session-id"] = "upstream-style"
    rows[-1]["headers"]["x-session-done"] = "1"  # (re-sending the last request would be a retry: see sessions)
    replay(url, rows)
    samples = wait_for_samples(proxy, 4)  # session_done flushes the last turn without a next state
    assert {s.session_id for s in samples} == {"upstream-style"} and samples[-1].loss_mask[0] == 0
