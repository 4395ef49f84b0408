"""SGLang's per-request ``sampling_params.stream_interval``: fewer stream events, the same generation.

Real SGLang 0.5.23 (``tests/data/sglang-golden/stream_interval.jsonl``, both streaming modes) sends the
first token at once, then an event whenever at least ``stream_interval`` tokens are unsent, and the
finish always. The engine (and so every mock built on it) must send events at the same token counts
and in the same shapes; the proxy asks for an interval on streamed turns and must assemble exactly what
it assembles at interval 1; a server that refuses the field (an SGLang without it answers SGLang's
"unknown field" 400) costs one retry, once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from openclaw_rl.backend import SSEReader, StreamAssembler, _may_refuse_interval
from openclaw_rl.engine import ScriptedModel, make_engine_app
from openclaw_rl.errors import BackendUnavailable, BadRequest, ContextLengthExceeded
from openclaw_rl.servers import BackgroundServer

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "sglang-golden" / "stream_interval.jsonl"
EXCHANGES = [json.loads(line) for line in GOLDEN.read_text().splitlines()]  # missing data fails loudly
REPLY = "Done: caf\u00e9 \U0001f642 ok, na\u00efve \u4e2d\u6587. " * 8  # multi-byte characters split across events
MODES = ("cumulative", "incremental")


def events_of(lines: list[str] | list[bytes]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        text = line.decode() if isinstance(line, bytes) else line
        if text.startswith("data: {"):
            out.append(json.loads(text[6:]))
    return out


def expected_counts(n: int, interval: int) -> list[int]:
    """Completion tokens at each event under SGLang's rule, for a reply of ``n`` tokens."""
    counts, sent = [], 0
    for k in range(1, n + 1):
        if k == n or interval <= 1 or k - sent >= interval or (sent == 0 and k > 0):
            counts.append(k)
            sent = k
    return counts


class Counting:
    """The engine app, counting the /generate requests it gets."""

    def __init__(self, app: Any):
        self.app, self.calls = app, 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/generate":
            self.calls += 1
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def engines(tokenizer: Any) -> Iterator[dict[str, Any]]:
    """Per mode: an engine replying REPLY; and one (cumulative) that refuses ``stream_interval``."""
    servers: dict[str, Any] = {}
    try:
        for name in (*MODES, "refusing"):
            refused = frozenset({"stream_interval"}) if name == "refusing" else frozenset()
            app = Counting(make_engine_app(ScriptedModel(tokenizer, responder=lambda ids: REPLY, context_length=65536),
                                           tokenizer, served_model_name="tiny", model_path="tiny",
                                           incremental_streaming_output=name == "incremental",
                                           refused_sampling_fields=refused))
            servers[name] = BackgroundServer(app).start()
            servers[name].counting = app
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def body(stream: bool, interval: int | None = None, max_new_tokens: int = 4000) -> dict[str, Any]:
    params: dict[str, Any] = {"max_new_tokens": max_new_tokens, "temperature": 1.0}
    if interval is not None:
        params["stream_interval"] = interval
    return {"input_ids": [5, 6, 7], "return_logprob": True, "stream": stream, "sampling_params": params}


def raw_stream(url: str, req: dict[str, Any]) -> bytes:
    with httpx.stream("POST", f"{url}/generate", json=req, timeout=120) as r:
        assert r.status_code == 200
        return b"".join(r.iter_bytes())


def assemble(raw: bytes) -> Any:
    """The proxy's own reading: SSEReader spans, StreamAssembler.feed_many (one read)."""
    reader, asm = SSEReader(), StreamAssembler()
    result = asm.feed_many(reader.buf, reader.push(raw))
    assert reader.done
    return result


# --- real SGLang: event positions and shapes ------------------------------------------------------------

@pytest.mark.parametrize("exchange", EXCHANGES, ids=[e["name"] for e in EXCHANGES])
def test_engine_streams_at_the_token_counts_and_in_the_shapes_of_real_sglang(exchange: dict[str, Any],
                                                                              tokenizer: Any) -> None:
    mode = exchange["name"].split("_")[0]
    real = events_of(exchange["sse_lines"])
    final = real[-1]["meta_info"]
    n, finish = final["completion_tokens"], final["finish_reason"]
    stopped = finish["type"] == "stop"
    req = exchange["request_json"]
    interval = req["sampling_params"].get("stream_interval") or 1
    assert [e["meta_info"]["completion_tokens"] for e in real] == expected_counts(n, interval)
    # the scripted core "samples" n byte tokens (n - 1 and the eos when real SGLang stopped on it)
    app = make_engine_app(ScriptedModel(tokenizer, responder=lambda ids: "ab" * n), tokenizer,
                          served_model_name="tiny", model_path="tiny", incremental_streaming_output=mode == "incremental")
    if stopped:
        assert finish["matched"] == tokenizer.eos_token_id
        app.service.model.responder = lambda ids: "a" * (n - 1)
    with BackgroundServer(app) as server:
        ours = events_of(raw_stream(server.url, req).split(b"\n"))
    assert [e["meta_info"]["completion_tokens"] for e in ours] == [e["meta_info"]["completion_tokens"] for e in real]
    assert ours[-1]["meta_info"]["finish_reason"]["type"] == finish["type"]
    for mine, theirs in zip(ours, real):
        assert list(mine) == list(theirs)
        assert list(mine["meta_info"]) == list(theirs["meta_info"])
        assert len(mine["output_ids"]) == len(theirs["output_ids"])  # cumulative: all so far; incremental: the new
        for key in ("output_token_logprobs", "output_token_logprobs_length"):
            got, want = mine["meta_info"].get(key), theirs["meta_info"].get(key)
            assert (len(got) if isinstance(got, list) else got) == (len(want) if isinstance(want, list) else want)
        assert (mine["meta_info"]["finish_reason"] is None) == (theirs["meta_info"]["finish_reason"] is None)
    if mode == "cumulative":  # each text extends the previous one
        for earlier, later in zip(real, real[1:]):
            assert later["text"].startswith(earlier["text"])


# --- the engine: exact at every interval, held-back UTF-8 kept ----------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_every_interval_assembles_the_same_generation(engines: dict[str, Any], mode: str, tokenizer: Any) -> None:
    url = engines[mode].url
    whole = httpx.post(f"{url}/generate", json=body(False), timeout=120).json()
    n = whole["meta_info"]["completion_tokens"]
    assert n == len(REPLY.encode()) + 1  # one byte token per byte, then the eos
    reference = None
    for interval in (None, 1, 3, 8, 64, 10_000):
        raw = raw_stream(url, body(True, interval))
        events = events_of(raw.split(b"\n"))
        assert [e["meta_info"]["completion_tokens"] for e in events] == expected_counts(n, interval or 1)
        result = assemble(raw)
        got = (result.output_ids, result.logprobs, result.text, result.finish_reason)
        assert got[:3] == (whole["output_ids"], [t[0] for t in whole["meta_info"]["output_token_logprobs"]],
                           whole["text"])
        reference = reference or got
        assert got == reference


def test_held_back_utf8_follows_the_events(engines: dict[str, Any], tokenizer: Any) -> None:
    """Text is decoded per event, as SGLang's detokenizer sees only what is sent: an event ending inside a
    UTF-8 sequence repeats the previous text, and a later one catches up; never a U+FFFD on the way."""
    for interval in (1, 3):
        events = events_of(raw_stream(engines["cumulative"].url, body(True, interval)).split(b"\n"))
        held = 0
        for e in events[:-1]:
            full = tokenizer.decode(e["output_ids"])
            assert "\ufffd" not in e["text"] and full.startswith(e["text"])
            held += e["text"] != full
        assert held, f"no event of interval {interval} ends inside a character: the reply does not exercise it"
        pieces = events_of(raw_stream(engines["incremental"].url, body(True, interval)).split(b"\n"))
        assert "".join(p["text"] for p in pieces) == events[-1]["text"]


# --- the proxy: asks for the interval, exact, and copes with a server that refuses it ------------------

def stream_turn(url: str, sid: str) -> str:
    req = {"messages": [{"role": "user", "content": "hello"}], "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=req, timeout=60,
                      headers={"X-Session-Id": sid, "X-Session-Done": "1"}) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert not any("error" in e for e in events), events
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))


@pytest.mark.parametrize("interval", [0, 1, 8])
def test_proxy_sends_the_interval_on_streamed_calls_only(make_proxy: Any, tokenizer: Any, interval: int) -> None:
    from support import fault_backend

    with fault_backend(tokenizer=tokenizer) as backend:
        _, url = make_proxy(backend.url, proxy_stream_interval=interval)
        stream_turn(url, "s")
        httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=60,
                   headers={"X-Session-Id": "p", "X-Session-Done": "1"})
        streamed, plain = backend.calls
    assert streamed["stream"] and streamed["sampling_params"].get("stream_interval") == (interval or None)
    assert "stream_interval" not in plain["sampling_params"]


@pytest.mark.parametrize("mode", MODES)
def test_proxy_samples_at_interval_8_equal_interval_1(engines: dict[str, Any], make_proxy: Any, mode: str) -> None:
    from support import wait_for_samples

    texts, samples = {}, {}
    for interval in (1, 8):
        proxy, url = make_proxy(engines[mode].url, proxy_stream_interval=interval, rl_keep_masked_samples=True)
        texts[interval] = stream_turn(url, f"i{interval}")
        samples[interval] = wait_for_samples(proxy, 1)[0]
    assert texts[1] == texts[8] and len(texts[1]) > 100
    assert samples[1].response_ids == samples[8].response_ids
    assert samples[1].rollout_log_probs == samples[8].rollout_log_probs


def test_a_server_that_refuses_the_field_costs_one_retry_once(engines: dict[str, Any], make_proxy: Any,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    from support import wait_for_samples

    server = engines["refusing"]
    direct = httpx.post(f"{server.url}/generate", json=body(True, 8), timeout=60)
    assert direct.status_code == 400 and "unknown field `stream_interval`" in direct.json()["error"]
    calls0 = server.counting.calls
    proxy, url = make_proxy(server.url, proxy_stream_interval=8, rl_keep_masked_samples=True)
    with caplog.at_level(logging.WARNING, logger="openclaw_rl.backend"):
        first, second = stream_turn(url, "a"), stream_turn(url, "b")
    assert first == second and len(first) > 100
    assert server.counting.calls - calls0 == 3  # refused, retried without the field, then sent without it
    refusals = [r for r in caplog.records if "refused sampling_params.stream_interval" in r.getMessage()]
    assert len(refusals) == 1
    assert proxy.service.backend.stream_interval == 0
    samples = wait_for_samples(proxy, 2)
    assert samples[0].response_ids == samples[1].response_ids


def test_which_failures_may_be_the_field() -> None:
    assert _may_refuse_interval(BadRequest("policy backend rejected the request: {\"error\":\"unknown field "
                                           "`stream_interval`, expected one of `max_new_tokens`\"}")) == "named"
    assert _may_refuse_interval(BadRequest("__init__() got an unexpected keyword argument 'x'")) == "named"
    assert _may_refuse_interval(BackendUnavailable("policy backend answered HTTP 500: Internal Server Error")) \
        == "generic"
    assert _may_refuse_interval(BackendUnavailable("policy backend stream failed: ConnectionResetError()")) == "generic"
    assert not _may_refuse_interval(BadRequest("policy backend rejected the request: max_new_tokens must be at "
                                               "least 0, got -1."))
    assert not _may_refuse_interval(ContextLengthExceeded("policy backend rejected the request: context length"))
    assert not _may_refuse_interval(BackendUnavailable("policy backend at http://x is unreachable: refused"))


@pytest.mark.parametrize("stream", [False, True])
def test_an_unknown_sampling_field_is_refused_as_sglang_refuses_it(engines: dict[str, Any], stream: bool) -> None:
    """Real SGLang 0.5.23 answers a ``sampling_params`` key it does not know with a 400 and a plain JSON body,
    streamed or not (tests/data/sglang-golden/README.md); the engine used to ignore it, so a client's
    misspelt key went unnoticed here and failed only against real SGLang."""
    req = body(stream)
    req["sampling_params"]["no_such_field"] = 1
    r = httpx.post(f"{engines['cumulative'].url}/generate", json=req, timeout=60)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert isinstance(error, str) and error.startswith("unknown field `no_such_field`, expected one of `max_new_tokens`")
    assert "`stream_interval`" in error


class ServerErrorWithTheField:
    """ASGI wrapper: the next ``fails`` streamed ``/generate`` calls that carry ``stream_interval`` get a bare
    500, which is how an SGLang whose SamplingParams lacks the field fails, and also how a passing overload
    looks."""

    def __init__(self, app: Any, fails: int):
        self.app, self.fails = app, fails

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/generate":
            return await self.app(scope, receive, send)
        messages, more = [], True
        while more:
            messages.append(await receive())
            more = messages[-1].get("more_body", False)
        if self.fails > 0 and b'"stream_interval"' in b"".join(m.get("body", b"") for m in messages):
            self.fails -= 1
            await send({"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"text/plain")]})
            return await send({"type": "http.response.body", "body": b"Internal Server Error"})
        replay = iter(messages)
        return await self.app(scope, lambda: _next(replay, receive), send)


async def _next(replay: Iterator[Any], receive: Any) -> Any:
    return next(replay, None) or await receive()


@pytest.mark.parametrize(("fails", "calls", "dropped"), [(1, 3, False), (100, 7, True)])
def test_a_bare_server_error_drops_the_field_only_when_it_keeps_happening(tokenizer: Any, make_proxy: Any,
                                                                          caplog: pytest.LogCaptureFixture,
                                                                          fails: int, calls: int,
                                                                          dropped: bool) -> None:
    """One 500 fixed by a retry without the field is retried, not taken as a refusal: the next call with
    the field works and the proxy keeps asking for it (a passing overload must not cost every later
    streamed turn 2-4x the CPU). Three in a row with no success with the field between them drop it."""
    app = Counting(ServerErrorWithTheField(make_engine_app(ScriptedModel(tokenizer, responder=lambda ids: REPLY,
                                                                         context_length=65536), tokenizer,
                                                           served_model_name="tiny", model_path="tiny"), fails))
    server = BackgroundServer(app).start()
    try:
        proxy, url = make_proxy(server.url, proxy_stream_interval=8, rl_keep_masked_samples=True)
        with caplog.at_level(logging.WARNING, logger="openclaw_rl.backend"):
            replies = [stream_turn(url, f"t{i}") for i in range(3 if dropped else 2)] + \
                ([stream_turn(url, "after")] if dropped else [])
    finally:
        server.stop()
    assert len(set(replies)) == 1 and len(replies[0]) > 100
    assert app.calls == calls  # 1 fail: fail, retry, with the field; 100: 3 x (fail, retry), then without it
    warnings = [r for r in caplog.records if "refused sampling_params.stream_interval" in r.getMessage()]
    assert len(warnings) == int(dropped)
    assert proxy.service.backend.stream_interval == (0 if dropped else 8)
