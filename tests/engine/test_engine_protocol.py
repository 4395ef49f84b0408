"""The embedded engine over real loopback HTTP: SGLang's /generate semantics on the scripted core.

Every test drives `make_engine_app(ScriptedModel(...))` through uvicorn (`BackgroundServer`) with httpx,
exactly as the proxy, judge and teacher clients will. Exact shapes against real SGLang transcripts are
in `test_sglang_golden.py`; here are the behaviours those transcripts cannot pin down for our vocabulary.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from support import wait_until
from token_gate import GatedModel, TokenGate

from openclaw_rl.engine import EngineModel, ScriptedModel, make_engine_app
from openclaw_rl.engine.scripted import hash_scorer
from openclaw_rl.servers import BackgroundServer

REPLY = "<think>Weather?</think>The weather in Paris is sunny, très agréable."


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def prompt(tokenizer: Any) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "What is the weather in Paris?"}],
                                             add_generation_prompt=True, tokenize=True)
    return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)


class Engine:
    """A running engine app plus its model and an httpx client, for one test."""

    def __init__(self, model: ScriptedModel, tokenizer: Any, **app_kwargs: Any):
        self.model = model
        self.app = make_engine_app(model, tokenizer, served_model_name="tiny", model_path="/models/tiny",
                                   **app_kwargs)
        self.server = BackgroundServer(self.app).start()
        self.client = httpx.Client(base_url=self.server.url, timeout=10)

    def generate(self, **body: Any) -> Any:
        response = self.client.post("/generate", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    def stream(self, **body: Any) -> list[str]:
        with self.client.stream("POST", "/generate", json={**body, "stream": True}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
            return list(response.iter_lines())

    def close(self) -> None:
        self.client.close()
        self.server.stop()


@pytest.fixture
def engine(tokenizer: Any) -> Iterator[Engine]:
    running = Engine(ScriptedModel(tokenizer, responder=lambda ids: REPLY), tokenizer)
    yield running
    running.close()


def events(lines: list[str]) -> list[dict[str, Any]]:
    """The JSON events of an SSE body; asserts SGLang's framing (data line, blank line, final [DONE])."""
    assert lines[-2:] == ["data: [DONE]", ""]
    assert all(line == "" for line in lines[1::2])
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-2:2]]


# --- the non-canonical encoding ---------------------------------------------------------------------


def test_scripted_ids_decode_to_the_text_but_are_not_the_canonical_encoding(tokenizer: Any) -> None:
    model = ScriptedModel(tokenizer)
    assert isinstance(model, EngineModel)
    ids = model.encode_non_canonical(REPLY)
    assert tokenizer.decode(ids, skip_special_tokens=False) == REPLY
    assert tokenizer.encode(REPLY, add_special_tokens=False) != ids  # merges exist, bytes were emitted
    assert len(ids) == len(REPLY.replace("<think>", "").replace("</think>", "").encode()) + 2
    assert ids[0] == tokenizer.convert_tokens_to_ids("<think>")  # added tokens keep their single id


def test_generation_emits_the_script_then_eos_which_is_kept_in_ids_and_trimmed_from_text(
        engine: Engine, prompt: list[int]) -> None:
    out = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 200})
    eos = engine.model.eos_token_ids
    assert out["output_ids"][:-1] == engine.model.encode_non_canonical(REPLY)
    assert out["output_ids"][-1] in eos
    assert out["text"] == REPLY
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": out["output_ids"][-1]}
    assert out["meta_info"]["prompt_tokens"] == len(prompt)


def test_max_new_tokens_cuts_before_eos_with_finish_length(engine: Engine, prompt: list[int]) -> None:
    out = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 5})
    assert out["output_ids"] == engine.model.encode_non_canonical(REPLY)[:5]
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert out["meta_info"]["weight_versions"] == [{"version": "default", "start": 0, "end": 5}]


def test_stop_string_is_trimmed_from_text_and_its_tokens_stay_in_output_ids(
        engine: Engine, prompt: list[int]) -> None:
    out = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 200, "stop": ["Paris"]})
    assert out["text"] == "<think>Weather?</think>The weather in "
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "Paris"}
    assert engine.model.encode_non_canonical(REPLY[:REPLY.index("Paris") + 5]) == out["output_ids"]
    kept = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 200, "stop": "Paris",
                                                              "no_stop_trim": True})
    assert kept["text"].endswith("in Paris")


@pytest.mark.parametrize("incremental", [False, True])
def test_a_stream_holds_what_may_become_a_stop_string(tokenizer: Any, prompt: list[int], incremental: bool) -> None:
    """SGLang (``check_match_stop_str_prefix``) sends no event while the text ends with the start of a stop
    string, so what the stop trims is never shown: ``in P``, ``in Pa``... are held, then the stop ends it."""
    running = Engine(ScriptedModel(tokenizer, responder=lambda ids: REPLY), tokenizer,
                     incremental_streaming_output=incremental)
    try:
        body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 200, "stop": ["Paris"]}}
        chunks = events(running.stream(**body))
        whole = running.generate(**body)
    finally:
        running.close()
    texts = [c["text"] for c in chunks]
    shown = "".join(texts) if incremental else texts[-1]
    assert shown == whole["text"] == "<think>Weather?</think>The weather in "
    so_far = ""
    for text in texts[:-1]:
        so_far = so_far + text if incremental else text
        assert not any(so_far.endswith("Paris"[:i]) for i in range(1, 6)), so_far  # "P" and on are held
    if not incremental:
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # the cumulative text never shrinks
    ids = [i for c in chunks for i in c["output_ids"]] if incremental else chunks[-1]["output_ids"]
    assert ids == whole["output_ids"]  # held tokens come with the next event, none is lost


def test_stop_token_ids_and_ignore_eos(engine: Engine, prompt: list[int]) -> None:
    comma = engine.model.encode_non_canonical(",")[0]
    out = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 200, "stop_token_ids": [comma]})
    assert out["output_ids"][-1] == comma and out["text"] == "<think>Weather?</think>The weather in Paris is sunny"
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": comma}
    script = len(engine.model.encode_non_canonical(REPLY))
    ignored = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": script + 3, "ignore_eos": True})
    assert ignored["output_ids"][script:] == [min(engine.model.eos_token_ids)] * 3
    assert ignored["text"] == REPLY  # special tokens are skipped by default
    assert ignored["meta_info"]["finish_reason"] == {"type": "length", "length": script + 3}


def test_a_large_logit_bias_forces_its_token_at_logprob_zero(engine: Engine, prompt: list[int]) -> None:
    eos = min(engine.model.eos_token_ids)
    out = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 4, "logit_bias": {str(eos): 100}},
                          return_logprob=True)
    assert out["output_ids"] == [eos] and out["text"] == ""
    assert out["meta_info"]["output_token_logprobs"] == [[0.0, eos, None]]


# --- log-probs ----------------------------------------------------------------------------------------


def test_teacher_entry_j_scores_ids_k_plus_j_and_entry_zero_is_null(engine: Engine, prompt: list[int]) -> None:
    response = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 200}, return_logprob=True)
    ids = prompt + response["output_ids"]
    k = len(prompt) - 1
    teacher = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0, "temperature": 0.3},
                              return_logprob=True, logprob_start_len=k)
    entries = teacher["meta_info"]["input_token_logprobs"]
    assert len(entries) == len(ids) - k
    assert entries[0] == [None, ids[k], None]
    for j, (logprob, token, text) in enumerate(entries[1:], start=1):
        assert token == ids[k + j] and text is None
        assert logprob == pytest.approx(hash_scorer(ids[:k + j], ids[k + j]))
    # Dropping entry 0 lines the teacher up 1:1 with the sampled tokens and their own log-probs.
    sampled = [lp for lp, _, _ in response["meta_info"]["output_token_logprobs"]]
    assert [lp for lp, _, _ in entries[1:]] == pytest.approx(sampled)
    assert teacher["output_ids"] == [] and teacher["text"] == ""
    assert teacher["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


@pytest.mark.parametrize(("start", "expected"), [(None, 0), (0, 5), (4, 1), (5, 0)])
def test_logprob_start_len_entry_counts(engine: Engine, start: int | None, expected: int) -> None:
    body: dict[str, Any] = {"input_ids": [5, 6, 7, 8, 9], "sampling_params": {"max_new_tokens": 0},
                            "return_logprob": True}
    if start is not None:
        body["logprob_start_len"] = start
    entries = engine.generate(**body)["meta_info"]["input_token_logprobs"]
    assert len(entries) == expected
    assert all(entry[0] is None for entry in entries[:1])


def test_logprob_start_len_beyond_the_input_is_a_400(engine: Engine) -> None:
    response = engine.client.post("/generate", json={"input_ids": [5, 6, 7], "return_logprob": True,
                                                     "logprob_start_len": 4, "sampling_params": {"max_new_tokens": 0}})
    assert response.status_code == 400
    assert response.json() == {"error": {"message": (
        "req.logprob_start_len=4 is higher than the number of input tokens len(req.origin_input_ids)=3. "
        "Please use a smaller logprob_start_len.")}}


def test_top_logprobs_are_sorted_hold_the_chosen_token_and_add_one_entry_at_zero_tokens(
        engine: Engine, prompt: list[int], tokenizer: Any) -> None:
    out = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 6}, return_logprob=True,
                          top_logprobs_num=3, return_text_in_logprobs=True)
    meta = out["meta_info"]
    assert len(meta["output_top_logprobs"]) == 6 and meta["input_top_logprobs"] == []
    for (lp, token, text), top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert len(top) == 3 and [lp, token, text] in top
        assert [t[0] for t in top] == sorted((t[0] for t in top), reverse=True)
        assert sum(math.exp(t[0]) for t in top) <= 1.0
        assert text == tokenizer.decode([token])
    scored = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 0}, return_logprob=True,
                             top_logprobs_num=3, logprob_start_len=len(prompt) - 2)["meta_info"]
    assert [entry is None for entry in scored["input_top_logprobs"]] == [True, False]
    assert len(scored["output_top_logprobs"]) == 1 and len(scored["output_top_logprobs"][0]) == 3


def test_return_text_in_logprobs_gives_each_token_text(engine: Engine, tokenizer: Any) -> None:
    eos = min(engine.model.eos_token_ids)
    meta = engine.generate(input_ids=[5, eos], sampling_params={"max_new_tokens": 0}, return_logprob=True,
                           logprob_start_len=0, return_text_in_logprobs=True)["meta_info"]
    assert meta["input_token_logprobs"][0] == [None, 5, tokenizer.decode([5])]
    assert meta["input_token_logprobs"][1][1:] == [eos, "<|im_end|>"]


# --- streaming ----------------------------------------------------------------------------------------


def test_stream_is_cumulative_and_holds_back_incomplete_utf8(engine: Engine, prompt: list[int]) -> None:
    lines = engine.stream(input_ids=prompt, sampling_params={"max_new_tokens": 200}, return_logprob=True)
    for line in lines[:-2:2]:  # compact JSON, exactly as SGLang (orjson) writes it
        assert line == "data: " + orjson.dumps(json.loads(line[6:])).decode()  # 1e-05 is 0.00001 there
    chunks = events(lines)
    final = chunks[-1]
    assert len(chunks) == len(final["output_ids"])
    assert final["text"] == REPLY and final["meta_info"]["finish_reason"]["type"] == "stop"
    previous = ""
    for i, chunk in enumerate(chunks):
        meta = chunk["meta_info"]
        assert chunk["output_ids"] == final["output_ids"][:i + 1]
        assert meta["completion_tokens"] == i + 1 == len(meta["output_token_logprobs"])
        assert meta["output_token_logprobs"] == final["meta_info"]["output_token_logprobs"][:i + 1]
        assert ("response_sent_to_client_ts" in meta) == (i == 0)
        if i < len(chunks) - 1:
            assert meta["finish_reason"] is None and "weight_versions" not in meta
            assert chunk["text"].startswith(previous) and "\ufffd" not in chunk["text"]
            previous = chunk["text"]
    held = [i for i in range(1, len(chunks) - 1) if chunks[i]["text"] == chunks[i - 1]["text"]]
    assert held, "the two-byte 'è'/'é' must hold the text back for one chunk"


def test_stream_validation_errors_are_an_event_on_http_200(engine: Engine) -> None:
    lines = engine.stream(sampling_params={"max_new_tokens": -1}, input_ids=[5])
    assert events(lines) == [{"error": {"message": "max_new_tokens must be at least 0, got -1.",
                                        "type": "invalid_request_error", "code": 400, "retryable": False}}]


# --- batches, n ---------------------------------------------------------------------------------------


def test_batch_and_n_return_lists_in_prompt_order(tokenizer: Any) -> None:
    engine = Engine(ScriptedModel(tokenizer, responder=lambda ids: f"reply to {len(ids)}"), tokenizer)
    try:
        batch = engine.generate(input_ids=[[5, 6], [5, 6, 7]], sampling_params={"max_new_tokens": 50},
                                return_logprob=[True, False])
        assert [o["text"] for o in batch] == ["reply to 2", "reply to 3"]
        assert "input_token_logprobs" in batch[0]["meta_info"] and "input_token_logprobs" not in batch[1]["meta_info"]
        texts = engine.generate(text=["a", "b c"], sampling_params={"max_new_tokens": 50})
        assert [o["meta_info"]["prompt_tokens"] for o in texts] == [len(tokenizer.encode(t)) for t in ("a", "b c")]
        two = engine.generate(input_ids=[5, 6], sampling_params={"max_new_tokens": 50, "n": 2})
        assert len(two) == 2 and two[0]["meta_info"]["id"] != two[1]["meta_info"]["id"]
        single = engine.generate(input_ids=[5, 6], sampling_params={"max_new_tokens": 50, "n": 1}, rid="abc")
        assert isinstance(single, dict) and single["meta_info"]["id"] == "abc"
        chunks = events(engine.stream(input_ids=[[5], [5, 6]], sampling_params={"max_new_tokens": 50}))
        finals = {c["index"]: c["text"] for c in chunks if c["meta_info"]["finish_reason"] is not None}
        assert finals == {0: "reply to 1", 1: "reply to 2"}
    finally:
        engine.close()


# --- errors and control -------------------------------------------------------------------------------


@pytest.mark.parametrize(("sampling", "message"), [
    ({"temperature": -1}, "temperature must be non-negative, got -1.0."),
    ({"top_p": 0}, "top_p must be in (0, 1], got 0.0."),
    ({"top_k": 0}, "top_k must be -1 (disable), or at least 1, got 0."),
    ({"max_new_tokens": "x"}, "Invalid sampling_params.max_new_tokens: Input should be a valid integer, "
                              "unable to parse string as an integer."),
])
def test_bad_sampling_params_are_400s(engine: Engine, sampling: dict[str, Any], message: str) -> None:
    response = engine.client.post("/generate", json={"input_ids": [5], "sampling_params": sampling})
    assert (response.status_code, response.json()) == (400, {"error": {"message": message}})


def test_out_of_vocab_ids_are_a_400_when_crashing_is_off(tokenizer: Any) -> None:
    engine = Engine(ScriptedModel(tokenizer), tokenizer, crash_on_bad_ids=False)
    try:
        response = engine.client.post("/generate", json={"input_ids": [1, -2], "sampling_params": {}})
        assert response.status_code == 400
        assert response.json() == {"error": {"message": "Token id -2 is out of the vocabulary (size 4105)."}}
        assert not engine.app.crashed and engine.client.get("/health").status_code == 200
    finally:
        engine.close()


def test_out_of_vocab_ids_crash_the_server_for_every_later_request(engine: Engine) -> None:
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        engine.client.post("/generate", json={"input_ids": [1, engine.model.vocab_size]})
    assert engine.app.crashed
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{engine.server.url}/health")


def test_weight_update_changes_the_reported_version(engine: Engine, prompt: list[int]) -> None:
    response = engine.client.post("/update_weights_from_disk", json={"model_path": "/ckpt/7", "weight_version": "7"})
    assert response.json() == {"success": True, "message": "Succeeded to update model weights. Weight version "
                                                          "updated to 7.", "num_paused_requests": 0}
    assert engine.model.model_path == "/ckpt/7" and engine.model.weight_updates == 1
    info = engine.client.get("/get_model_info").json()
    assert (info["weight_version"], info["model_path"]) == ("7", "/ckpt/7")
    meta = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 3})["meta_info"]
    assert meta["weight_version"] == "7" and meta["weight_versions"] == [{"version": "7", "start": 0, "end": 3}]


def test_pause_holds_an_arriving_request_until_continue(engine: Engine) -> None:
    async def scenario() -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=engine.server.url, timeout=10) as client:
            assert (await client.post("/pause_generation")).json()["status"] == "ok"
            pending = asyncio.ensure_future(client.post("/generate", json={"input_ids": [5]}))
            service = engine.app.service
            while not (service.held_arrivals or service._running or pending.done()):  # it reached the server
                await asyncio.sleep(0.005)
            assert (service.held_arrivals, service._running, pending.done()) == (1, 0, False)  # held at arrival
            await client.post("/continue_generation")
            reply = (await pending).json()
            assert service.held_arrivals == 0
            return reply

    assert asyncio.run(scenario())["text"] == REPLY


@pytest.fixture
def gated_engine(tokenizer: Any) -> Iterator[Engine]:
    """The next three requests stop after their first token until the test releases them."""
    gate = TokenGate(at=1, times=3)
    running = Engine(GatedModel(tokenizer, gate, responder=lambda ids: REPLY), tokenizer)
    yield running
    gate.close()
    running.close()


def test_weight_updates_meet_running_requests_as_in_sglang(gated_engine: Engine, prompt: list[int]) -> None:
    """SGLang 0.5.23: unpaused, an update waits for the running requests (each holds the model-update
    lock's reader side) and then flushes; paused in place, it swaps the weights at once, the running
    request goes on with them, and the flush fails (the call too, and /get_model_info keeps the old
    version); paused in ``retract`` mode (the running requests leave the batch), it succeeds. A request
    that arrives during a pause is held before dispatch and does not block the flush."""
    from openclaw_rl.engine.protocol import FLUSH_REFUSED

    engine, gate = gated_engine, gated_engine.model.gate

    def update(version: str) -> httpx.Response:
        return httpx.post(f"{engine.server.url}/update_weights_from_disk", timeout=10,
                          json={"model_path": f"/ckpt/{version}", "weight_version": version})

    def versions(last_event: dict[str, Any]) -> list[str]:
        return [seg["version"] for seg in last_event["meta_info"]["weight_versions"]]

    body = {"input_ids": prompt, "stream": True, "sampling_params": {"max_new_tokens": 6}}
    with engine.client.stream("POST", "/generate", json=body) as stream, ThreadPoolExecutor(1) as pool:
        lines = stream.iter_lines()
        first = next(lines)
        gate.wait_held(1)  # a token is out and the request holds before the next one
        updating = pool.submit(update, "v1")
        wait_until(lambda: engine.app.service.waiting_updates == 1 or updating.done())  # it waits for it...
        gate.release()
        assert updating.result().status_code == 200  # ...and runs once it is done
        assert versions(events([first, *lines])[-1]) == ["default"]
    assert engine.client.get("/get_model_info").json()["weight_version"] == "v1"

    for held, (mode, outcome) in enumerate((("in_place", 400), ("retract", 200)), start=2):
        with engine.client.stream("POST", "/generate", json=body) as stream:
            lines = stream.iter_lines()
            first = next(lines)
            gate.wait_held(held)
            engine.client.post("/pause_generation", json={"mode": mode})  # holds it between two tokens
            answer = update(mode)
            assert answer.status_code == outcome, answer.text
            if outcome == 400:
                assert answer.json() == {"success": False, "message": FLUSH_REFUSED, "num_paused_requests": 0}
                assert engine.client.get("/get_model_info").json()["weight_version"] == "v1"
            gate.release()  # the next token comes out, and the pause holds the request after it
            engine.client.post("/continue_generation")
            assert versions(events([first, *lines])[-1])[-1] == mode  # it went on with the new weights
    assert engine.client.get("/get_model_info").json()["weight_version"] == "retract"

    async def arrives_during_a_pause() -> int:
        async with httpx.AsyncClient(base_url=engine.server.url, timeout=10) as client:
            await client.post("/pause_generation", json={"mode": "in_place"})
            held = asyncio.ensure_future(client.post("/generate", json={"input_ids": prompt, "sampling_params": {
                "max_new_tokens": 1}}))
            while not engine.app.service.held_arrivals:  # it reached the server and waits there
                await asyncio.sleep(0.005)
            status = (await client.post("/update_weights_from_disk", json={"model_path": "/ckpt/3"})).status_code
            await client.post("/continue_generation")
            assert (await held).status_code == 200
            return status

    assert asyncio.run(arrives_during_a_pause()) == 200


@pytest.mark.parametrize(("yield_every", "runs"), [(1, [1] * 32), (4, [4] * 8)])
def test_an_instant_scripted_core_yields_every_n_tokens_and_keeps_its_timing(tokenizer, yield_every, runs,
                                                                              monkeypatch):
    """Two instant generations interleave after every ``yield_every`` tokens (runs of that many tokens
    from one before the other's), and a core with a decode rate still waits for each token's time."""
    from types import SimpleNamespace

    from openclaw_rl.engine import scripted
    from openclaw_rl.engine.model import SamplingConfig

    config = SamplingConfig(temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, max_new_tokens=16)

    async def interleaving(model: ScriptedModel) -> list[int]:
        order: list[str] = []

        async def pull(name: str) -> None:
            steps = model.generate([1, 2, 3], config)
            for _ in range(16):
                await anext(steps)
                order.append(name)
            await steps.aclose()

        await asyncio.gather(pull("a"), pull("b"))
        return [len(list(run)) for _, run in itertools.groupby(order)]

    instant = ScriptedModel(tokenizer, responder=lambda ids: "x" * 40, yield_every=yield_every)
    assert asyncio.run(interleaving(instant)) == runs

    # A paced core on a stopped clock: every token after the first is due later, so each one sleeps for
    # exactly its share of the decode rate, whatever yield_every says.
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(scripted, "time", SimpleNamespace(monotonic=lambda: 100.0))
    monkeypatch.setattr(scripted, "asyncio", SimpleNamespace(sleep=sleep))
    paced = ScriptedModel(tokenizer, responder=lambda ids: "x" * 40, yield_every=yield_every, tokens_per_s=400.0)

    async def pull_nine() -> None:
        steps = paced.generate([1, 2, 3], config)
        for _ in range(9):
            await anext(steps)
        await steps.aclose()

    asyncio.run(pull_nine())
    assert waits == pytest.approx([i / 400.0 for i in range(9)])
