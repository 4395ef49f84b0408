"""A pause that keeps its running requests (SGLang 0.5.23's ``in_place`` and ``retract`` modes) holds them:
no token is generated between ``/pause_generation`` and ``/continue_generation``, and the request then
finishes its whole reply.

The gate holds the request before token ``AT``; the pause lands there; released, the core finishes the step
it was asked for before the pause (token ``AT``, as SGLang finishes the decode step in flight) and the
engine must then stop asking. The test waits on the engine's ``held_running`` count, never on time, and the
core records every token it is asked for while the engine is paused (there must be none).
"""

from __future__ import annotations

import socket
from collections.abc import AsyncGenerator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from support import wait_until
from token_gate import GatedModel, TokenGate

from openclaw_rl.engine import make_engine_app
from openclaw_rl.engine.model import SamplingConfig, TokenStep
from openclaw_rl.servers import BackgroundServer

REPLY = "The weather in Paris is sunny today."  # ASCII: one token per character, then eos
AT = 3


class PauseWitness(GatedModel):
    """Counts the tokens it produces and notes each token index it is asked for while the engine is paused."""

    def __init__(self, tokenizer: Any, gate: TokenGate):
        super().__init__(tokenizer, gate, responder=lambda ids: REPLY)
        self.is_paused = lambda: False  # set to the engine's once the app exists
        self.produced = 0
        self.asked_while_paused: list[int] = []

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> AsyncGenerator[TokenStep, None]:
        steps = super().generate(prompt_ids, sampling)
        index = 0
        try:
            while True:
                if self.is_paused():
                    self.asked_while_paused.append(index)
                try:
                    step = await anext(steps)
                except StopAsyncIteration:
                    return
                self.produced += 1
                index += 1
                yield step
        finally:
            await steps.aclose()


@pytest.fixture
def witnessed(tokenizer: Any) -> Iterator[tuple[Any, PauseWitness, str]]:
    gate = TokenGate(at=AT)
    model = PauseWitness(tokenizer, gate)
    app = make_engine_app(model, tokenizer, served_model_name="tiny", model_path="tiny")
    model.is_paused = lambda: app.service.paused
    server = BackgroundServer(app).start()
    yield app.service, model, server.url
    gate.close()
    server.stop()


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_a_pause_holds_running_requests_until_continue(witnessed: tuple[Any, PauseWitness, str], mode: str) -> None:
    service, model, url = witnessed
    with httpx.Client(base_url=url, timeout=10) as client, ThreadPoolExecutor(1) as pool:
        reply = pool.submit(client.post, "/generate", json={"input_ids": [5, 6, 7]})
        model.gate.wait_held()  # AT tokens out; the core waits before the next one
        assert client.post("/pause_generation", json={"mode": mode}).json()["status"] == "ok"
        model.gate.release()  # token AT (asked for before the pause) comes out; then the pause must hold
        wait_until(lambda: service.held_running == 1 or reply.done())
        assert not reply.done(), "the request ran to its end while paused"
        assert (service.held_running, model.produced, model.asked_while_paused) == (1, AT + 1, [])
        assert client.post("/continue_generation").json()["status"] == "ok"
        body = reply.result().json()
    assert body["text"] == REPLY and body["meta_info"]["finish_reason"]["type"] == "stop"
    assert body["meta_info"]["completion_tokens"] == model.produced == len(REPLY) + 1
    assert (service.held_running, model.asked_while_paused) == (0, [])


def test_an_abort_pause_over_a_hold_ends_the_request_and_the_count(witnessed: tuple[Any, Any, str]) -> None:
    """A request held by an in_place pause that a pause in abort mode then ends leaves no held or running count."""
    service, model, url = witnessed
    with httpx.Client(base_url=url, timeout=10) as client, ThreadPoolExecutor(1) as pool:
        reply = pool.submit(client.post, "/generate", json={"input_ids": [5, 6, 7]})
        model.gate.wait_held()
        client.post("/pause_generation", json={"mode": "in_place"})
        model.gate.release()
        wait_until(lambda: service.held_running == 1 or reply.done())
        assert client.post("/pause_generation", json={"mode": "abort"}).json()["status"] == "ok"
        body = reply.result().json()
        assert body["meta_info"]["finish_reason"]["type"] == "abort"
        assert (service.held_running, service._running) == (0, 0)
        client.post("/continue_generation")


def test_a_streamed_client_gone_while_held_ends_the_request_and_the_count(witnessed: tuple[Any, Any, str]) -> None:
    """A streamed request whose client goes away while a pause holds it is cancelled where it is held: the
    held and running counts fall back to 0 while still paused (no count leaks to the next pause)."""
    service, model, url = witnessed
    host, port = url.split("//")[1].split(":")
    raw = socket.create_connection((host, int(port)))
    body = b'{"input_ids": [5, 6, 7], "stream": true}'
    raw.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body)
    model.gate.wait_held()
    with httpx.Client(base_url=url, timeout=10) as client:
        client.post("/pause_generation", json={"mode": "in_place"})
        model.gate.release()
        wait_until(lambda: service.held_running == 1)
        raw.close()  # the server sees the stream's client gone and cancels the request where it is held
        wait_until(lambda: service.held_running == 0)
        assert service.paused and model.asked_while_paused == []
        wait_until(lambda: service._running == 0)
        client.post("/continue_generation")
