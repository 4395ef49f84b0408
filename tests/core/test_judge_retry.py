"""Judge/teacher calls that fail for a reason that can pass are retried, bounded; the judge's context is
learned before the first call and re-learned from a context-length 400 (issue #27 item 9).

The mock judges speak SGLang 0.5.23's protocol: ``/v1/models`` reports ``max_model_len``, and a request
beyond the context gets the real 400 (tests/data/sglang-golden, ``error_too_long_with_output``)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from openclaw_rl import codec
from openclaw_rl.config import JudgeSettings, load_settings
from openclaw_rl.judge import JudgeClient
from openclaw_rl.judge_retry import Retrier, RetryPolicy, context_from_error

CONTEXT = 4096
TOO_LONG = ("Requested token count exceeds the model's maximum context length of {ctx} tokens. You requested a "
            "total of {total} tokens: {prompt} tokens from the input messages and {new} tokens for the completion. "
            "Please reduce the number of tokens in the input messages or the completion to fit within the limit.")


class MockJudge:
    """An SGLang-like judge of ``CONTEXT`` tokens. ``fail`` answers the first calls of a path with a status
    (or raises a connection error for 0); ``models`` is how ``GET /v1/models`` answers, call by call."""

    def __init__(self, tokenizer: Any, *, fail: dict[str, list[int]] | None = None,
                 models: list[int] | None = None, report_context: bool = True):
        self.tokenizer, self.fail = tokenizer, {k: list(v) for k, v in (fail or {}).items()}
        self.models, self.report_context = list(models or []), report_context
        self.generate_bodies: list[dict[str, Any]] = []
        self.model_probes = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            self.model_probes += 1
            status = self.models.pop(0) if self.models else 200
            if status == 0:
                raise httpx.ConnectError("connection refused", request=request)
            data = {"id": "judge", "object": "model", **({"max_model_len": CONTEXT} if self.report_context else {})}
            return httpx.Response(status, json={"object": "list", "data": [data]} if status == 200 else {})
        if path == "/get_server_info":
            return httpx.Response(404, json={"detail": "Not Found"})
        queued = self.fail.get(path)
        if queued:
            status = queued.pop(0)
            if status == 0:
                raise httpx.ConnectError("connection refused", request=request)
            return httpx.Response(status, text="Service Unavailable" if status >= 500 else "Bad Request")
        body = codec.loads(request.content)
        self.generate_bodies.append(body)
        if "input_ids" in body:  # teacher scoring: every response token at -0.5
            ids = body["input_ids"]
            entries = [[None, ids[body["logprob_start_len"]], None]] + [[-0.5, t, None]
                                                                        for t in ids[body["logprob_start_len"] + 1:]]
            return httpx.Response(200, json={"text": "", "meta_info": {"input_token_logprobs": entries}})
        params = body["sampling_params"]
        prompt = len(self.tokenizer.encode(body["text"], add_special_tokens=False))
        if prompt + params["max_new_tokens"] > CONTEXT:
            message = TOO_LONG.format(ctx=CONTEXT, total=prompt + params["max_new_tokens"], prompt=prompt,
                                      new=params["max_new_tokens"])
            return httpx.Response(400, json={"error": {"message": message}})
        return httpx.Response(200, json=[{"text": "The user moves on. \\boxed{1}", "meta_info": {}}] * params["n"])


def run_judge(judge: MockJudge, tokenizer: Any, call: Callable[[JudgeClient], Any], **settings: Any,
              ) -> tuple[Any, list[tuple[str, str, str]]]:
    events: list[tuple[str, str, str]] = []

    async def main() -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(judge)) as http:
            cfg = dataclasses.replace(JudgeSettings(), url="http://judge", votes=2,
                                      **{"retry_backoff_s": 0.0, **settings})
            client = JudgeClient(http, cfg, tokenizer=tokenizer, on_retry=lambda *e: events.append(e))
            return await call(client)

    return asyncio.run(main()), events


def prm(client: JudgeClient) -> Any:
    return client.prm("Here is the answer.", {"role": "user", "content": "thanks, next question"})


def test_a_judge_that_503s_twice_then_answers_gives_the_turn_its_votes(tokenizer) -> None:
    judge = MockJudge(tokenizer, fail={"/generate": [503, 0]})
    result, events = run_judge(judge, tokenizer, prm)
    assert result.score == 1.0 and not result.failed and result.votes == [1, 1]
    assert events == [("retry", "votes", "5xx"), ("retry", "votes", "unreachable")]


def test_a_judge_down_for_good_fails_after_the_bounded_attempts(tokenizer) -> None:
    judge = MockJudge(tokenizer, fail={"/generate": [503] * 10})
    result, events = run_judge(judge, tokenizer, prm, retry_attempts=3)
    assert result.failed and result.votes == [None, None]
    assert events == [("retry", "votes", "5xx")] * 2 + [("gave_up", "votes", "5xx")]
    assert judge.fail["/generate"] == [503] * 7  # exactly 3 calls went out


def test_a_refusal_that_cannot_pass_is_not_retried(tokenizer) -> None:
    judge = MockJudge(tokenizer, fail={"/generate": [422, 503]})
    result, events = run_judge(judge, tokenizer, prm)
    assert result.failed and events == [] and judge.fail["/generate"] == [503]


def test_the_time_bound_stops_retries_before_the_attempts_do() -> None:
    """Backoff 1, 2, 4 s, then the 8 s wait is cut to the 3 s left of max_s = 10: a 5th attempt, then none."""
    now = [0.0]
    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)
        now[0] += s

    async def attempt() -> None:
        from openclaw_rl.errors import BackendTimeout
        raise BackendTimeout("judge /generate timed out")

    events: list[tuple[str, str, str]] = []
    retrier = Retrier(RetryPolicy(attempts=100, max_s=10.0, backoff_s=1.0), lambda *e: events.append(e),
                      sleep=sleep, clock=lambda: now[0])
    with pytest.raises(Exception, match="timed out"):
        asyncio.run(retrier.run(attempt, "teacher"))
    assert waits == [1.0, 2.0, 4.0, 3.0]
    assert events[-1] == ("gave_up", "teacher", "timeout") and len(events) == 5


def test_the_context_is_learned_before_the_first_call(tokenizer) -> None:
    """The judge is still starting (its probe fails twice): no vote goes out unclamped meanwhile, and the
    first /generate already fits its 4K context (no 400)."""
    judge = MockJudge(tokenizer, models=[0, 503])
    result, events = run_judge(judge, tokenizer, prm)
    assert result.score == 1.0 and judge.model_probes == 3
    assert len(judge.generate_bodies) == 1
    prompt = len(tokenizer.encode(judge.generate_bodies[0]["text"], add_special_tokens=False))
    assert judge.generate_bodies[0]["sampling_params"]["max_new_tokens"] == CONTEXT - prompt
    assert events == [("retry", "votes", "unreachable")] * 2


def test_a_context_length_400_relearns_the_context_and_retries_clamped(tokenizer) -> None:
    """A judge that reports no context (or a proxy that learned a stale one): the real 400 teaches it."""
    judge = MockJudge(tokenizer, report_context=False)
    result, events = run_judge(judge, tokenizer, prm)
    assert result.score == 1.0 and not result.failed
    sent = [b["sampling_params"]["max_new_tokens"] for b in judge.generate_bodies]
    prompt = len(tokenizer.encode(judge.generate_bodies[0]["text"], add_special_tokens=False))
    assert sent == [4096, CONTEXT - prompt]
    assert events == [("retry", "votes", "context")]


def test_teacher_calls_are_retried_too(tokenizer) -> None:
    judge = MockJudge(tokenizer, fail={"/generate": [502]})
    result, events = run_judge(judge, tokenizer, lambda c: c.teacher_log_probs([1, 2], [3, 4]))
    assert result.log_probs == [-0.5, -0.5] and events == [("retry", "teacher", "5xx")]


def test_context_from_the_real_messages() -> None:
    assert context_from_error(TOO_LONG.format(ctx=4096, total=4190, prompt=4090, new=100)) == 4096
    assert context_from_error("The input (5000 tokens) is longer than the model's context length (4096 tokens).") == 4096
    assert context_from_error("This model's maximum context length is 8192 tokens. However, you requested 9000 "
                              "tokens (900 in the messages, 8100 in the completion).") == 8192
    assert context_from_error("max_new_tokens must be at least 0, got -1.") is None


@pytest.mark.parametrize("key,value", [("judge_retry_attempts", 0), ("judge_retry_max_s", 0),
                                       ("judge_retry_backoff_s", -1)])
def test_retry_settings_are_checked(key: str, value: float) -> None:
    with pytest.raises(ValueError, match=key):
        load_settings({key: value}, env={})
