"""A generation aborted by SGLang's ``/pause_generation`` (its default ``abort`` mode, which Slime uses for
every weight update) is resumed by the proxy from its tokens: the client gets the whole reply, and the
sample holds every sampled token with its log-prob, its version ``mixed:`` across the update.

Before, the client got the partial reply labelled ``finish_reason: stop``. The engine pauses as SGLang
0.5.23 does: running requests end with ``{"type": "abort", "status_code": null}``, later ones wait for
``/continue_generation``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support import wait_for_samples, wait_until
from token_gate import GatedModel, TokenGate

from openclaw_rl.backend import MAX_RESUMES, GenerateResult, continuation, joined
from openclaw_rl.engine import make_engine_app
from openclaw_rl.servers import BackgroundServer

REPLY = "The weather in Paris is sunny and warm today, with a light breeze."  # ASCII: one token per char


class CountingModel(GatedModel):
    """Counts the tokens it has produced; its gate holds a generation mid-reply so a test can act there;
    its responder continues the reply from the tokens of an aborted attempt (the request after an abort
    carries them in its prompt)."""

    def __init__(self, tokenizer: Any, gate: TokenGate):
        super().__init__(tokenizer, gate, responder=self.rest_of_reply)
        self.first_prompt: int | None = None
        self.emitted = 0
        self.prompts: list[int] = []

    def rest_of_reply(self, prompt_ids: list[int]) -> str:
        self.prompts.append(len(prompt_ids))
        if self.first_prompt is None:
            self.first_prompt = len(prompt_ids)
        done = len(prompt_ids) - self.first_prompt
        assert prompt_ids[self.first_prompt:] == self.encode_non_canonical(REPLY[:done])
        return REPLY[done:]

    async def generate(self, prompt_ids, sampling):  # type: ignore[override]
        async for step in super().generate(prompt_ids, sampling):
            self.emitted += 1
            yield step


@pytest.fixture
def engine(tokenizer: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The engine; its gate holds the first ``times`` generations after ``at`` tokens (param ``(at, times)``,
    default ``(10, 1)``: the first request, ten tokens into its reply)."""
    at, times = getattr(request, "param", (10, 1))
    gate = TokenGate(at, times)
    model = CountingModel(tokenizer, gate)
    app = make_engine_app(model, tokenizer, served_model_name="tiny", model_path="tiny")
    with BackgroundServer(app) as server:
        server.model = model
        yield server
        gate.close()


def _pause_update_continue(engine: Any) -> None:
    """What Slime does for a weight update, once the request is held mid-reply (its gate's tokens out)."""
    engine.model.gate.wait_held()
    assert httpx.post(f"{engine.url}/pause_generation", json={}).json()["status"] == "ok"  # Slime's call
    update = httpx.post(f"{engine.url}/update_weights_from_disk", json={"model_path": "tiny", "weight_version": "v1"})
    assert update.json()["success"], update.text
    httpx.post(f"{engine.url}/continue_generation", json={})
    engine.model.gate.release()  # the aborted request takes its one more step and ends


@pytest.mark.parametrize("stream", [False, True])
def test_an_aborted_generation_is_resumed_and_the_client_gets_the_whole_reply(engine, make_proxy, stream):
    import threading

    proxy, url = make_proxy(engine.url, rl_keep_masked_samples=True)
    body = {"messages": [{"role": "user", "content": "weather?"}], "stream": stream, "max_tokens": 200}
    headers = {"X-Session-Id": f"s{stream}", "X-Session-Done": "1"}
    pauser = threading.Thread(target=_pause_update_continue, args=(engine,))
    pauser.start()
    if stream:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        assert not any("error" in e for e in events), events
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
        finish = [e["choices"][0]["finish_reason"] for e in events if e.get("choices")][-1]
    else:  # with log-probs and top log-probs: both parts' lists joined, one entry per token
        body |= {"logprobs": True, "top_logprobs": 2}
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60).json()
        text, finish = answer["choices"][0]["message"]["content"], answer["choices"][0]["finish_reason"]
        entries = answer["choices"][0]["logprobs"]["content"]
        assert len(entries) == answer["usage"]["completion_tokens"] and all(len(e["top_logprobs"]) == 2
                                                                             for e in entries)
    pauser.join()
    assert (text, finish) == (REPLY, "stop")
    assert len(engine.model.prompts) == 2 and engine.model.prompts[1] > engine.model.prompts[0]  # one resume
    assert proxy.service.backend.resumed == 1
    sample = wait_for_samples(proxy, 1)[0]
    assert sample.response_ids[:len(REPLY)] == engine.model.encode_non_canonical(REPLY)
    assert len(sample.rollout_log_probs) == len(sample.response_ids)
    assert sample.metadata["weight_version"] == "mixed:default,v1"


def test_an_abort_with_a_status_code_is_an_error_not_a_resume():
    """An abort that is an error (SGLang gives it a status code) is not resumed; a pause's is, with the
    token budget reduced by the tokens it already has."""
    from openclaw_rl.backend import _finish_and_version

    pause = {"finish_reason": {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}}
    error = {"finish_reason": {"type": "abort", "message": "too long", "status_code": 400, "err_type": "BadRequest"}}
    assert _finish_and_version(pause)[2] and not _finish_and_version(error)[2]
    done = GenerateResult("ab", [1, 2], [-0.1, -0.2], "abort", 5, "v0", True)
    payload = {"input_ids": [7, 8], "sampling_params": {"max_new_tokens": 5, "temperature": 1.0}, "stream": True}
    assert continuation(payload, done) == {"input_ids": [7, 8, 1, 2], "stream": True,
                                           "sampling_params": {"max_new_tokens": 3, "temperature": 1.0}}
    assert continuation({**payload, "sampling_params": {"max_new_tokens": 2}}, done) is None  # no budget left
    more = GenerateResult("c", [3], [-0.3], "stop", 7, "v1")
    both = joined(done, more)
    assert (both.text, both.output_ids, both.logprobs, both.finish_reason, both.prompt_tokens, both.weight_version) == \
        ("abc", [1, 2, 3], [-0.1, -0.2, -0.3], "stop", 5, "mixed:v0,v1")
    assert joined(both, GenerateResult("", [], [], "stop", 0, "v1")).weight_version == "mixed:v0,v1"


@pytest.mark.parametrize("engine", [(3, MAX_RESUMES + 1)], ids=["every-attempt-held"], indirect=True)
def test_a_generation_aborted_again_and_again_ends_as_a_502_and_an_aborted_drop(engine, make_proxy):
    """After ``MAX_RESUMES`` resumes the next abort ends the request: a 502 naming the abort, and the turn
    dropped as ``aborted`` (counted), not a partial reply passed off as whole."""
    import threading

    from support import metric

    proxy, url = make_proxy(engine.url, rl_keep_masked_samples=True)

    def keep_aborting() -> None:
        for n in range(MAX_RESUMES + 1):
            engine.model.gate.wait_held(n + 1)
            httpx.post(f"{engine.url}/pause_generation", json={})
            httpx.post(f"{engine.url}/continue_generation", json={})
            engine.model.gate.release()

    pauser = threading.Thread(target=keep_aborting)
    pauser.start()
    answer = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "weather?"}]},
                        headers={"X-Session-Id": "a", "X-Session-Done": "1"}, timeout=60)
    pauser.join()
    assert answer.status_code == 502 and "aborted the generation" in answer.json()["error"]["message"]
    assert len(engine.model.prompts) == MAX_RESUMES + 1
    wait_until(lambda: metric(proxy, "openclaw_turns_dropped_total", reason="aborted") == 1)


def _backend(results: list[GenerateResult], seen: list[dict[str, Any]], **kw: Any) -> Any:
    """A PolicyBackend whose calls return ``results`` in turn, streamed as one snapshot each."""
    from openclaw_rl.backend import PolicyBackend

    backend = PolicyBackend(httpx.AsyncClient(), "http://127.0.0.1:9", end_ids=frozenset({99}), **kw)
    queue = list(results)

    async def once(payload: dict[str, Any], routing_key: Any = None) -> GenerateResult:
        seen.append(payload)
        return queue.pop(0)

    async def stream_once(payload: dict[str, Any], routing_key: Any = None, gather_s: float = 0.0):
        yield await once(payload)

    backend._generate_once, backend._stream_once = once, stream_once
    return backend


async def _outcome(backend: Any, payload: dict[str, Any], stream: bool) -> GenerateResult:
    if not stream:
        return await backend.generate(payload)
    snapshots = [snap async for snap in backend.generate_stream(payload)]
    return snapshots[-1]


def _aborted(ids: list[int], text: str = "") -> GenerateResult:
    return GenerateResult(text or "x" * len(ids), ids, [-0.1] * len(ids), "abort", 2, "v0", True)


@pytest.mark.parametrize("stream", [False, True])
def test_an_abort_whose_output_is_already_complete_is_not_resumed(stream):
    """SGLang runs an aborted request one more decode step, so its output may end with the EOS (a
    "stop") or fill the budget (a "length"): resuming would put text after the end of the reply, or turn
    a whole reply into a 502."""
    import asyncio

    payload = {"input_ids": [7], "sampling_params": {"max_new_tokens": 4}}
    seen: list[dict[str, Any]] = []
    ended = asyncio.run(_outcome(_backend([_aborted([1, 2, 99])], seen), payload, stream))
    assert (ended.output_ids, ended.finish_reason, len(seen)) == ([1, 2, 99], "stop", 1)
    seen.clear()
    full = asyncio.run(_outcome(_backend([_aborted([1, 2, 3, 4])], seen), payload, stream))
    assert (full.output_ids, full.finish_reason, len(seen)) == ([1, 2, 3, 4], "length", 1)
    seen.clear()  # and after a resume: the continuation's abort carried the EOS
    both = asyncio.run(_outcome(_backend([_aborted([1]), _aborted([2, 99])], seen), payload, stream))
    assert (both.output_ids, both.finish_reason, seen[1]["input_ids"]) == ([1, 2, 99], "stop", [7, 1])


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_with_stop_strings_is_not_resumed(stream):
    """SGLang matches stop strings in a request's own output only: one that straddled the resume point
    would be missed, so such a request ends as an abort (502) instead."""
    import asyncio

    from openclaw_rl.errors import GenerationAborted

    seen: list[dict[str, Any]] = []
    payload = {"input_ids": [7], "sampling_params": {"max_new_tokens": 8, "stop": ["\n\n"]}}
    with pytest.raises(GenerationAborted, match="stop strings"):
        asyncio.run(_outcome(_backend([_aborted([1, 2])], seen), payload, stream))
    assert len(seen) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_character_split_by_the_abort_is_decoded_whole(stream):
    """Each part's text is the server's decode of that part alone, so a character whose bytes span the
    resume point comes out as replacement characters; the joined text is then a decode of all the ids."""
    import asyncio

    table = {1: b"caf", 2: b"\xc3", 3: b"\xa9!"}

    def decode(ids: list[int], skip: bool) -> str:
        return b"".join(table[i] for i in ids).decode("utf-8", "replace")

    payload = {"input_ids": [7], "sampling_params": {"max_new_tokens": 8}}
    first = _aborted([1, 2], text="caf\ufffd")
    rest = GenerateResult("\ufffd!", [3], [-0.1], "stop", 3, "v0")
    whole = asyncio.run(_outcome(_backend([first, rest], [], decode=decode), payload, stream))
    assert (whole.text, whole.output_ids) == ("café!", [1, 2, 3])


def test_top_logprobs_survive_a_resume_whose_first_part_had_no_tokens():
    """A pause often aborts a request still queued: its part has no tokens and so no top log-probs."""
    empty = GenerateResult("", [], [], "abort", 5, "default", True, None)
    more = GenerateResult("ab", [7, 8], [-0.1, -0.2], "stop", 5, "v1", False, [[(-0.1, 7)], [(-0.2, 8)]])
    assert joined(empty, more).top_logprobs == [[(-0.1, 7)], [(-0.2, 8)]]
    assert joined(more, GenerateResult("c", [9], [-0.3], "stop", 7, "v1")).top_logprobs is None  # one part lacks them
