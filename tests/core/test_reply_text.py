"""The client reads the text of the ids that train (idstext.py): a backend whose ``text`` is anything else
costs its turn (``backend_invalid_output``) and the client gets none of that text.

Stage: backend → ids text → serving. A hostile backend answered 10 MB of text with 48 output ids: the
10 MB reached the client while the 48 ids became the sample. Here 100 KB stands for the 10 MB.
"""

from __future__ import annotations

import json

import httpx
import pytest
from support import fault_backend, metric, settle

from openclaw_rl.idstext import IdsText, text_problem

BODY = {"messages": [{"role": "user", "content": "hello"}]}


def _chat(url: str, stream: bool, sid: str, **extra) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={**BODY, "stream": stream, **extra}, timeout=30,
                      headers={"X-Session-Id": sid})


def _content(r: httpx.Response) -> str:
    """The reply's text: the message's, or a stream's content deltas joined."""
    if not r.headers.get("content-type", "").startswith("text/event-stream"):
        return r.json()["choices"][0]["message"]["content"] or ""
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    return "".join((e["choices"][0].get("delta") or {}).get("content") or "" for e in events if e.get("choices"))


def _ids(tokenizer, text: str) -> list[int]:
    return [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
@pytest.mark.parametrize("text", ["x" * 100_000, "ho"], ids=["much_more_text", "other_text_same_length"])
def test_text_that_is_not_the_ids_text_never_reaches_the_client(make_proxy, tokenizer, stream, text):
    with fault_backend(tokenizer=tokenizer) as backend:
        proxy, url = make_proxy(backend.url)
        backend.plan = [{"text": text, "ids": _ids(tokenizer, "hi")}]
        r = _chat(url, stream, "s")
        if stream:  # the stream was open: it ends with an error event, without a byte of that text
            events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == 502
        else:
            assert r.status_code == 502
        assert "invalid output" in r.text
        # not a byte of that text: at most the part of the ids' own text that agrees with it (a stream's "h")
        assert text[:2] not in (_content(r) if stream else r.text.replace("invalid output", ""))
        assert metric(proxy, "openclaw_turns_dropped_total", reason="backend_invalid_output") == 1


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
def test_the_ids_text_itself_and_a_trimmed_stop_string_are_served(make_proxy, tokenizer, stream):
    with fault_backend(tokenizer=tokenizer) as backend:
        proxy, url = make_proxy(backend.url)
        # as SGLang: the matched stop string is in the ids, not in the text
        backend.plan = [{}, {"text": "hello", "ids": tokenizer.encode("hello world", add_special_tokens=False)}]
        r = _chat(url, stream, "a")
        assert r.status_code == 200 and "ok" in r.text
        r = _chat(url, stream, "b", stop=[" world"])
        assert r.status_code == 200 and _content(r) == "hello" and "invalid" not in r.text
        settle(proxy)
        assert metric(proxy, "openclaw_turns_dropped_total", reason="backend_invalid_output") == 0


def test_a_stop_trims_no_more_than_a_stop_string_and_a_token():
    assert text_problem("hel", "hello world", final=True, stopped=True, trim_bytes=7) == \
        "its text lacks the last 8 bytes of its output ids' text"
    assert text_problem("hello", "hello world", final=True, stopped=True, trim_bytes=6) is None
    assert text_problem("hel", "hello world", final=True, stopped=True, trim_bytes=6) is not None
    assert text_problem("hello", "hello world", final=True, stopped=False, trim_bytes=99) is not None  # length
    assert text_problem("hello", "hello world", final=False, stopped=False, trim_bytes=0) is None  # streaming
    assert text_problem("help", "hello world", final=False, stopped=False, trim_bytes=0) is not None


def test_incremental_decoding_holds_an_incomplete_character_back(tokenizer):
    ids = tokenizer.encode("a 🙂 b 日本", add_special_tokens=False)
    decode = lambda part: tokenizer.decode(part, skip_special_tokens=True)  # noqa: E731
    text = IdsText(decode, tokenizer.encode("prompt", add_special_tokens=False))
    seen = []
    for k in range(1, len(ids) + 1):
        seen.append(text.update(ids[:k]))
    assert seen[-1] == decode(ids) == "a 🙂 b 日本"
    assert all(seen[-1].startswith(s.rstrip("\ufffd")) for s in seen)
    assert text.stable == seen[-1]
