"""The simulated users: scripted reactions, the driver (retries, headers, rates, plot), the LLM user."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from openclaw_rl.embedded import task
from openclaw_rl.embedded.simulate import (
    REPLY_PREFIX,
    LLMUser,
    ScriptedUser,
    moving_average,
    run_llm_simulation,
    run_simulation,
    strip_thinking,
)
from openclaw_rl.servers import BackgroundServer

RNG = random.Random(0)


def reply_in(style: str) -> str:
    return task.answer(style, task.REQUESTS[0], RNG)


def completion(content: str) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def test_scripted_user_reacts_like_a_user() -> None:
    user = ScriptedUser("pirate", seed=1)
    first = user.open()
    assert task.request_by_text(first) is not None and not user.instructed
    message, matched = user.react(reply_in("formal"))
    assert not matched and user.instructed
    assert message == task.correction("pirate", first) and message.startswith("No, please answer like a pirate.")
    message, matched = user.react("<think>\n\n</think>\n\n" + reply_in("pirate"))
    assert matched and not user.instructed
    assert re.match(r"(Thanks|Great)", message) and task.request_by_text(message.split(": ", 1)[1]) is not None
    assert ScriptedUser("pirate", seed=1).open() == first
    with pytest.raises(ValueError, match="unknown style"):
        ScriptedUser("rude", seed=0)


def test_moving_average() -> None:
    assert moving_average([True, False, True, True], 2) == [1.0, 0.5, 0.5, 1.0]
    assert moving_average([], 5) == []


class StandIn:
    """A proxy-less stand-in: the first call answers 503 + Retry-After; then a "policy" that follows
    instructions and, uninstructed, only answers in the preferred style from its `learn_after`-th call."""

    def __init__(self, preferred: str, learn_after: int):
        self.preferred, self.learn_after = preferred, learn_after
        self.url = ""
        self.calls: list[dict[str, Any]] = []
        self.rejected = 0
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.chat)
        self.app.get("/v1/models")(lambda: {"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def chat(self, request: Request) -> Any:
        if not self.rejected:
            self.rejected += 1
            return JSONResponse({"error": {"message": "weights syncing"}}, status_code=503,
                                headers={"Retry-After": "0.05"})
        body = await request.json()
        self.calls.append({"headers": dict(request.headers), "body": body})
        asked = task.instruction_style(body["messages"][-1]["content"])
        fresh = len([c for c in self.calls if task.instruction_style(c["body"]["messages"][-1]["content"]) is None])
        style = asked or (self.preferred if fresh > self.learn_after else "casual")
        return completion(reply_in(style))


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server_app = StandIn("bullet", learn_after=10)
    with BackgroundServer(server_app.app) as server:
        server_app.url = server.url
        yield server_app


def test_run_simulation_records_rates_headers_and_plot(stand_in: StandIn, tmp_path: Path) -> None:
    seen: list[int] = []
    result = asyncio.run(run_simulation(stand_in.url, interactions=30, concurrency=3, preferred_style="bullet",
                                        seed=0, on_interaction=lambda r: seen.append(len(r.interactions)),
                                        turns_per_session=3, window=5))
    assert stand_in.rejected == 1 and len(stand_in.calls) == 30  # the 503 was waited out, not counted
    assert seen == list(range(1, 31)) and len(result.interactions) == 30
    # Corrections are followed (instructed) but do not count; fresh requests flip after 10 calls.
    assert all(i.matched for i in result.interactions if i.instructed)
    assert result.first_window_rate == 0.0 and result.last_window_rate == 1.0
    openings = [i for i in result.interactions if i.turn == 0]
    assert len(result.opening_matches) == len(openings) == 10  # 30 calls, 3 per session
    assert result.opening_rates() == (sum(i.matched for i in openings[:5]) / 5, sum(i.matched for i in openings[-5:]) / 5)
    assert result.opening_rates()[0] == 0.0 and all(result.opening_matches[-3:])  # the stand-in flips at call 10
    assert len(result.matches) == len(result.rate_curve()) == sum(not i.instructed for i in result.interactions)
    assert result.rate_curve(2)[-1] == 1.0 and len(result.matches_all) == 30
    by_session: dict[str, list[dict[str, str]]] = {}
    for call in stand_in.calls:
        by_session.setdefault(call["headers"]["x-session-id"], []).append(call["headers"])
    assert all(len(h) <= 3 for h in by_session.values())
    assert all(h[-1].get("x-session-done") == "true" and all("x-session-done" not in x for x in h[:-1])
               for h in by_session.values())
    assert "formal" not in result.summary() and "bullet" in result.summary()
    png = tmp_path / "curve.png"
    result.save_plot(str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_simulation_without_session_headers(stand_in: StandIn) -> None:
    asyncio.run(run_simulation(stand_in.url, interactions=4, concurrency=1, preferred_style="bullet", seed=1,
                               session_headers=False))
    assert all("x-session-id" not in c["headers"] for c in stand_in.calls)


def test_run_simulation_through_the_real_proxy(tokenizer: Any, make_proxy: Any) -> None:
    """The scripted engine behind the real proxy: formal when told to, casual otherwise."""
    from support import scripted_server

    def policy(prompt: str) -> str:
        last_user = prompt.rsplit("<|im_start|>user\n", 1)[-1]
        return reply_in("formal" if task.instruction_style(last_user) == "formal" else "casual")

    with scripted_server(tokenizer, policy) as engine:
        _proxy, url = make_proxy(engine.url)
        result = asyncio.run(run_simulation(url, interactions=8, concurrency=2, preferred_style="formal", seed=0,
                                            turns_per_session=2))
    assert len(result.interactions) == 8
    assert result.matches and not any(result.matches)  # never formal unless told
    assert all(i.matched for i in result.interactions if i.instructed)


def test_strip_thinking() -> None:
    assert strip_thinking("<think>\nplan\n</think>\n\nmake it simpler") == "make it simpler"
    assert strip_thinking("<think>cut off") == ""


class FakeLLMUser:
    """An OpenAI-compatible endpoint playing the student: a rewrite request, then the sentinel."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.chat)
        self.app.get("/v1/models")(lambda: {"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def chat(self, request: Request) -> Any:
        body = await request.json()
        self.requests.append(body)
        if len(self.requests) == 1:
            return completion("<think>too AI-like</think>\n\nlol can u write it more normal, no lists")
        return completion("<think>fine</think>HOMEWORK_DONE")


def test_llm_user_with_a_mocked_endpoint() -> None:
    from openai import AsyncOpenAI

    fake, policy_calls = FakeLLMUser(), []
    policy = FastAPI()

    @policy.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        policy_calls.append({"headers": dict(request.headers), "body": await request.json()})
        return completion(f"1. Step one\n2. **Final answer**: 26 (reply {len(policy_calls)})")

    with BackgroundServer(fake.app) as user_server, BackgroundServer(policy) as policy_server:
        async def main() -> Any:
            client = AsyncOpenAI(base_url=f"{user_server.url}/v1", api_key="x")
            try:
                user = LLMUser(client, "sim", "student")
                first = user.open({"question": "What is 2 + 3?", "answer": "5"})
                assert "What is 2 + 3?" in first
                assert await user.react("5") == "lol can u write it more normal, no lists"
                roles = [m["role"] for m in fake.requests[0]["messages"]]
                assert roles == ["system", "assistant", "user"]  # role-inverted history
                assert fake.requests[0]["messages"][2]["content"] == REPLY_PREFIX + "5"
                assert "HOMEWORK_DONE" in fake.requests[0]["messages"][0]["content"]
                assert await user.react("5, written casually") is None  # the sentinel ends it
                fake.requests.clear()
                return await run_llm_simulation(policy_server.url, client, "sim", scenario="student",
                                                num_problems=1, max_turns=4)
            finally:
                await client.close()

        outcomes = asyncio.run(main())
    assert len(outcomes) == 1 and outcomes[0].completed and outcomes[0].turns == 2
    assert outcomes[0].first_reply.endswith("(reply 1)")
    assert len({c["headers"]["x-session-id"] for c in policy_calls}) == 1
    assert [m["role"] for m in policy_calls[-1]["body"]["messages"]] == ["user", "assistant", "user"]
    with pytest.raises(ValueError, match="scenario"):
        LLMUser(None, "m", "principal")


def test_simulate_command(stand_in: StandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from openclaw_rl.cli import main

    png = tmp_path / "curve.png"
    assert main(["simulate", "--proxy-url", stand_in.url, "--interactions", "6", "--concurrency", "2",
                 "--preferred-style", "bullet", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "[6/6] moving 'bullet' rate" in out and "6 interactions" in out and png.is_file()


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/", "//v1//"])
def test_simulate_takes_the_url_the_proxy_prints_with_or_without_v1(stand_in: StandIn, suffix: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`local` prints `proxy at http://127.0.0.1:PORT/v1`: pasted into --proxy-url it used to end in a
    404 traceback (the client asked /v1/v1/chat/completions)."""
    from openclaw_rl.cli import main

    assert main(["simulate", "--proxy-url", stand_in.url + suffix, "--interactions", "2", "--concurrency", "1"]) == 0
    assert "2 interactions" in capsys.readouterr().out
    assert all(call["headers"]["host"] in stand_in.url for call in stand_in.calls) and len(stand_in.calls) == 2


def test_simulate_says_in_one_line_what_is_wrong_with_the_proxy_url(capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing listening, a server that is not the proxy, a refused key, a URL that is not http: one line on
    stderr and a non-zero exit code, no traceback."""
    from openclaw_rl.cli import main
    from openclaw_rl.servers import free_port

    def one_line_error(args: list[str], code: int = 1) -> str:
        assert main(["simulate", "--interactions", "2", *args]) == code
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        return err

    port = free_port()
    assert f"cannot reach the proxy at http://127.0.0.1:{port}" in one_line_error(
        ["--proxy-url", f"http://127.0.0.1:{port}/v1"])
    elsewhere = FastAPI()
    elsewhere.get("/v1/models")(lambda: JSONResponse({"error": {"message": "bad key"}}, status_code=401))
    with BackgroundServer(FastAPI()) as other, BackgroundServer(elsewhere) as keyed:
        assert "answered HTTP 404" in one_line_error(["--proxy-url", f"{other.url}/api/v1"])
        assert "refused the API key" in one_line_error(["--proxy-url", keyed.url, "--api-key", "wrong"])
    assert "not an http(s) URL" in one_line_error(["--proxy-url", "127.0.0.1:30000"], code=2)


def test_a_proxy_failing_mid_run_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """After the check, an error the users do not retry (a 400, say) ends the command in one line too."""
    from openclaw_rl.cli import main

    failing = FastAPI()
    failing.get("/v1/models")(lambda: {"object": "list", "data": []})
    failing.post("/v1/chat/completions")(
        lambda: JSONResponse({"error": {"message": "prompt too long", "type": "invalid_request_error"}}, status_code=400))
    with BackgroundServer(failing) as server:
        assert main(["simulate", "--proxy-url", server.url, "--interactions", "2"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "answered HTTP 400: prompt too long" in err, err
