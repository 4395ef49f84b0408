"""Both SGLang streaming modes: the engine produces them, the proxy's ``StreamAssembler`` reads them.

SGLang's default stream is cumulative (every chunk repeats all ids and log-prob triples so far);
``--incremental-streaming-output`` sends only what is new, with ``completion_tokens`` still cumulative.
The engine serves either (a server flag); whatever the mode, the assembled stream must equal the
non-streamed answer, and a stream that loses tokens must fail rather than yield a truncated sample.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from openclaw_rl.backend import SSEReader, StreamAssembler
from openclaw_rl.engine import ScriptedModel, make_engine_app
from openclaw_rl.errors import BackendUnavailable
from openclaw_rl.servers import BackgroundServer

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "sglang-golden" / "exchanges.jsonl"
LONG = "Done. I updated the handler and reran the tests; caf\u00e9 \U0001f642 ok. " * 12  # ~760 tokens


@pytest.fixture(scope="module")
def engines(tokenizer: Any) -> Iterator[dict[str, Any]]:
    """One engine per mode, replying LONG to prompts that start with id 0, else a short text."""
    def responder(prompt_ids: list[int]) -> str:
        return LONG if prompt_ids[0] == 0 else "Hi \u00e9!"

    servers = {}
    try:
        for mode in ("cumulative", "incremental"):
            app = make_engine_app(ScriptedModel(tokenizer, responder=responder, context_length=65536), tokenizer,
                                  served_model_name="tiny", model_path="tiny",
                                  incremental_streaming_output=mode == "incremental")
            servers[mode] = BackgroundServer(app).start()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def body(first_id: int, stream: bool, max_new_tokens: int = 8000) -> dict[str, Any]:
    return {"input_ids": [first_id, 5, 6, 7], "return_logprob": True, "stream": stream,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 1.0}}


def stream_events(url: str, req: dict[str, Any]) -> list[bytes]:
    with httpx.stream("POST", f"{url}/generate", json=req, timeout=120) as r:
        raw = b"".join(r.iter_bytes())
    return [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: {")]


def assemble(events: list[bytes]) -> Any:
    asm, last = StreamAssembler(), None
    for e in events:
        last = asm.feed(e)
    return asm, last


@pytest.mark.parametrize("first_id", [0, 9], ids=["long", "short"])
def test_engine_modes_stream_the_same_generation(engines: dict[str, Any], first_id: int) -> None:
    whole = httpx.post(f"{engines['cumulative'].url}/generate", json=body(first_id, False), timeout=120).json()
    n = whole["meta_info"]["completion_tokens"]
    cum = [json.loads(e) for e in stream_events(engines["cumulative"].url, body(first_id, True))]
    inc = [json.loads(e) for e in stream_events(engines["incremental"].url, body(first_id, True))]
    assert len(cum) == len(inc) == n  # one chunk per token in both modes
    for i, (c, d) in enumerate(zip(cum, inc)):
        assert len(c["output_ids"]) == i + 1 and len(d["output_ids"]) == 1
        assert c["output_ids"][-1] == d["output_ids"][0]
        assert d["meta_info"]["output_token_logprobs"] == c["meta_info"]["output_token_logprobs"][-1:]
        for key in ("completion_tokens", "output_token_logprobs_length"):  # cumulative in both modes
            assert c["meta_info"][key] == d["meta_info"][key] == i + 1
        assert list(c["meta_info"]) == list(d["meta_info"])  # same keys, same order
    assert "".join(d["text"] for d in inc) == cum[-1]["text"] == whole["text"]
    assert cum[-1]["output_ids"] == whole["output_ids"]
    assert inc[-1]["meta_info"]["finish_reason"] == cum[-1]["meta_info"]["finish_reason"] == \
        whole["meta_info"]["finish_reason"]
    for mode in ("cumulative", "incremental"):
        info = httpx.get(f"{engines[mode].url}/get_server_info").json()
        assert info["incremental_streaming_output"] is (mode == "incremental")


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
@pytest.mark.parametrize("first_id", [0, 9], ids=["long", "short"])
def test_assembler_equals_the_non_streamed_answer(engines: dict[str, Any], mode: str, first_id: int) -> None:
    url = engines[mode].url
    whole = httpx.post(f"{url}/generate", json=body(first_id, False), timeout=120).json()
    events = stream_events(url, body(first_id, True))
    if first_id == 0:
        assert max(map(len, events)) > 2048 or mode == "incremental"  # the spliced path runs
    asm, result = assemble(events)
    assert result.output_ids == whole["output_ids"]
    assert result.logprobs == [t[0] for t in whole["meta_info"]["output_token_logprobs"]]
    assert result.text == whole["text"] and result.finish_reason == whole["meta_info"]["finish_reason"]["type"]
    assert asm.mode == (None if len(events) == 1 else mode)


def test_sse_reader_splits_at_any_byte_boundary() -> None:
    raw = b'data: {"a":1}\n\ndata:{"b":[2,3]}\r\n\n: comment\ndata: [DONE]\n\ndata: {"late":1}\n\n'
    for size in (1, 2, 7, len(raw)):
        reader, payloads = SSEReader(), []
        for i in range(0, len(raw), size):
            payloads += [bytes(reader.buf[s:e]) for s, e in reader.push(raw[i:i + size])]
            reader.consume()
            if reader.done:
                break
        assert payloads == [b'{"a":1}', b'{"b":[2,3]}'] and reader.done


def test_lost_incremental_chunk_fails_the_stream(engines: dict[str, Any]) -> None:
    events = stream_events(engines["incremental"].url, body(9, True))
    assert len(events) > 3
    with pytest.raises(BackendUnavailable, match="lost tokens"):
        assemble(events[:2] + events[3:])


def test_shrinking_cumulative_chunk_fails_the_stream(engines: dict[str, Any]) -> None:
    events = stream_events(engines["cumulative"].url, body(0, True))
    with pytest.raises(BackendUnavailable, match="lost tokens"):
        assemble(events[:50] + events[10:11])
    # a cumulative chunk that claims more completion tokens than it holds (truncated arrays)
    last = json.loads(events[-1])
    last["output_ids"] = last["output_ids"][:-1]
    last["meta_info"]["output_token_logprobs"] = last["meta_info"]["output_token_logprobs"][:-1]
    with pytest.raises(BackendUnavailable):
        assemble(events[:5] + [json.dumps(last, separators=(",", ":")).encode()])


def test_mixed_modes_fail_the_stream(engines: dict[str, Any]) -> None:
    cum = stream_events(engines["cumulative"].url, body(9, True))
    inc = stream_events(engines["incremental"].url, body(9, True))
    assert len(cum) > 4
    with pytest.raises(BackendUnavailable, match="switched"):
        assemble(inc[:3] + cum[3:])


def test_misaligned_logprobs_fail_the_stream(engines: dict[str, Any]) -> None:
    events = stream_events(engines["cumulative"].url, body(0, True))
    bad = json.loads(events[100])
    bad["meta_info"]["output_token_logprobs"][-1][1] += 1
    with pytest.raises(BackendUnavailable, match="do not match"):
        assemble(events[:100] + [json.dumps(bad, separators=(",", ":")).encode()])


def test_real_sglang_golden_streams_in_both_modes() -> None:
    """Real SGLang 0.5.23 chunks (cumulative), and the incremental chunks SGLang's slicing makes of them."""
    exchanges = [json.loads(line) for line in GOLDEN.read_text().splitlines()]
    streams = [e for e in exchanges if e.get("sse_lines") and e["path"] == "/generate"]
    assert streams
    checked = 0
    for e in streams:
        chunks = [json.loads(line[6:]) for line in e["sse_lines"] if line.startswith("data: {")]
        if not chunks or "error" in chunks[0] or not e["request_json"].get("return_logprob"):
            continue
        final = chunks[-1]
        _, result = assemble([json.dumps(c, separators=(",", ":")).encode() for c in chunks])
        assert result.output_ids == final["output_ids"] and result.text == final.get("text", "")
        sliced, prev_ids, prev_text = [], 0, ""
        for c in chunks:  # what --incremental-streaming-output sends for the same tokens
            d = json.loads(json.dumps(c))
            d["output_ids"] = c["output_ids"][prev_ids:]
            d["meta_info"]["output_token_logprobs"] = c["meta_info"]["output_token_logprobs"][prev_ids:]
            if "text" in c:
                d["text"] = c["text"][len(prev_text):]
                prev_text = c["text"]
            prev_ids = len(c["output_ids"])
            sliced.append(json.dumps(d, separators=(",", ":")).encode())
        _, inc = assemble(sliced)
        assert inc.output_ids == result.output_ids and inc.logprobs == result.logprobs and inc.text == result.text
        checked += 1
    assert checked >= 1


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
def test_proxy_trains_the_whole_streamed_reply_in_both_modes(engines: dict[str, Any], make_proxy: Any,
                                                             tokenizer: Any, mode: str) -> None:
    """The regression: an incremental server's chunks were read as cumulative (1-token samples)."""
    from support import wait_for_samples

    proxy, url = make_proxy(engines[mode].url, rl_keep_masked_samples=True)
    messages = [{"role": "user", "content": "hello"}]
    whole = httpx.post(f"{url}/v1/chat/completions", json={"messages": messages}, timeout=60,
                       headers={"X-Session-Id": "whole", "X-Session-Done": "1"}).json()
    req = {"messages": messages, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=req, timeout=60,
                      headers={"X-Session-Id": "streamed", "X-Session-Done": "1"}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert content == whole["choices"][0]["message"]["content"] == "Hi \u00e9!"
    assert events[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"] > 3
    samples = {s.session_id: s for s in wait_for_samples(proxy, 2)}
    assert samples["streamed"].response_ids == samples["whole"].response_ids
    assert samples["streamed"].rollout_log_probs == samples["whole"].rollout_log_probs
    assert len(samples["streamed"].response_ids) == whole["usage"]["completion_tokens"]
    backend = proxy.service.backend  # the server's declared mode, as the proxy reads it (in the background)
    assert asyncio.run_coroutine_threadsafe(backend.read_stream_mode(), proxy.server.loop).result(30) == mode
    assert proxy.service.backend.streams._idle  # the stream ended cleanly: its connection is kept for reuse


def test_raw_stream_connection_dechunks_at_any_byte_boundary() -> None:
    from openclaw_rl.rawstream import StreamConnection

    payload = [b'data: {"a":1}\n\n', b"data: " + b"x" * 300 + b"\n\n", b"data: [DONE]\n\n"]
    raw = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + \
        b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in payload) + b"0\r\n\r\n"
    for size in (1, 3, 17, len(raw)):
        conn = StreamConnection()
        for i in range(0, len(raw), size):
            piece = raw[i:i + size]
            conn.get_buffer(len(piece))[:len(piece)] = piece
            conn.buffer_updated(len(piece))
        assert conn.status == 200 and conn.complete and conn.error is None and conn.keep_alive
        assert bytes(conn.body) == b"".join(payload)
    closed = StreamConnection()
    head = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 4\r\nConnection: close\r\n\r\noops"
    closed.get_buffer(len(head))[:len(head)] = head
    closed.buffer_updated(len(head))
    assert closed.status == 502 and closed.complete and bytes(closed.body) == b"oops" and not closed.keep_alive


def _cumulative_events(texts: list[str], ensure_ascii: bool) -> list[bytes]:
    """SGLang-shaped cumulative chunks (text first), padded past the splicing threshold."""
    events = []
    for i, text in enumerate(texts, 1):
        ids = list(range(100, 100 + i * 40))
        obj = {"text": text, "output_ids": ids, "meta_info": {
            "id": "r", "finish_reason": {"type": "stop"} if i == len(texts) else None, "prompt_tokens": 3,
            "weight_version": "default", "output_token_logprobs": [[-0.5 - t / 1e4, t, None] for t in ids],
            "output_token_logprobs_length": len(ids), "completion_tokens": len(ids)}}
        events.append(json.dumps(obj, separators=(",", ":"), ensure_ascii=ensure_ascii).encode())
    return events


@pytest.mark.parametrize("ensure_ascii", [False, True], ids=["utf8", "escaped"])
def test_cumulative_text_is_decoded_past_what_was_seen(ensure_ascii: bool) -> None:
    """Only the new text bytes are decoded; escapes, non-BMP characters (a surrogate pair split across
    chunks when escaped) and a text that does not extend the previous one all give the server's text."""
    pieces = ["Hello", " caf\u00e9", " \"q\"\n\\", " \U0001f642", "\U0001f642", " done"]
    texts = ["".join(pieces[:k]) for k in range(1, len(pieces) + 1)]
    if ensure_ascii:  # a chunk ending inside a surrogate pair (only escaped JSON can say that)
        texts[3] = texts[3][:-1] + "\ud83d"
    texts.insert(5, "rewritten entirely")
    texts[6] = "rewritten entirely and more"
    events = _cumulative_events(texts, ensure_ascii)
    asm = StreamAssembler()
    for event, text in zip(events, texts):
        result = asm.feed(event)
        assert result.text == text
    assert asm.mode == "cumulative" and result.output_ids == json.loads(events[-1])["output_ids"]
    assert result.logprobs == [t[0] for t in json.loads(events[-1])["meta_info"]["output_token_logprobs"]]


def test_a_read_of_several_cumulative_events_decodes_the_last() -> None:
    from openclaw_rl.backend import PolicyBackend

    events = _cumulative_events(["a", "ab", "abc", "abcd", "abcde"], False)
    reader, asm = SSEReader(), StreamAssembler()
    first = PolicyBackend._feed(reader, asm, b"data: " + events[0] + b"\n\ndata: " + events[1] + b"\n\n")
    assert first.text == "ab" and asm.chunks == 2 and asm.mode == "cumulative"
    rest = b"".join(b"data: " + e + b"\n\n" for e in events[2:])
    last = PolicyBackend._feed(reader, asm, rest)
    assert asm.chunks == 3  # one decode for three events
    assert last.text == "abcde" and last.output_ids == json.loads(events[-1])["output_ids"]
    assert last.finish_reason == "stop"


@pytest.mark.parametrize("read_size", [1, 2, 7, 4096])
def test_raw_connection_dechunks_at_any_read_boundary(read_size: int) -> None:
    """Chunk-size lines, chunk ends and the trailer may each be split across reads."""
    from openclaw_rl.rawstream import StreamConnection

    body = b"data: " + b"x" * 300 + b"\n\n"
    wire = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
            + b"".join(b"%x;ext=1\r\n" % len(part) + part + b"\r\n" for part in (body[:17], body[17:]))
            + b"0\r\nX-Trailer: 1\r\n\r\n")
    conn = StreamConnection()
    for i in range(0, len(wire), read_size):
        piece = wire[i:i + read_size]
        buf = conn.get_buffer(len(piece))
        buf[:len(piece)] = piece
        conn.buffer_updated(len(piece))
    assert conn.error is None and conn.status == 200
    assert conn.complete and bytes(conn.body) == body


def test_raw_request_reads_whole_answers_and_refuses_cut_ones() -> None:
    """``StreamClient.request`` (the proxy's non-streamed policy and judge calls): a Content-Length body and
    a chunked one arrive whole and the connection is reused; a body cut short by the server closing, and a
    garbled status line, raise instead of returning a partial answer."""
    from openclaw_rl.rawstream import ResponseError, StreamClient

    answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"a\": true}",
               b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"b\"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\n\r\n",
               b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\nno"]
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"partial"
    connections = []

    async def main() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(writer)
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                body = await reader.readexactly(length)
                reply = {b"cut": cut, b"garbled": b"HTTP/9 what\r\n\r\n"}.get(body) or answers[int(body)]
                writer.write(reply)
                await writer.drain()
                if body in (b"cut", b"garbled"):
                    writer.close()
                    return

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = StreamClient(f"http://127.0.0.1:{port}")
        try:
            assert await client.request("/x", b"0", {}, 5.0) == (200, b'{"a": true}')
            assert await client.request("/x", b"1", {}, 5.0) == (200, b'{"b": 1}')
            assert await client.request("/x", b"2", {}, 5.0) == (400, b"no")
            assert len(connections) == 1  # kept alive and reused
            with pytest.raises(ResponseError):
                await client.request("/x", b"cut", {}, 5.0)
            with pytest.raises(ResponseError):
                await client.request("/x", b"garbled", {}, 5.0)
        finally:
            client.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())
