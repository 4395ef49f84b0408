"""Helpers shared by the proxy-level tests: scripted backends, golden traffic, waiting for samples."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from starlette.requests import Request  # module level: FastAPI resolves the handlers' annotations here

GOLDEN = Path(__file__).resolve().parent / "data"  # recorded traffic, copied into the repository


async def generate_request_or_404(reader: Any, writer: Any) -> bool:
    """For a raw asyncio policy server in a test: read a request's head; True for ``POST /generate``, else answer
    404 and close (the backend's mode probe)."""
    head = await reader.readuntil(b"\r\n\r\n")
    if head.startswith(b"POST /generate"):
        return True
    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
    writer.close()
    return False


def sse_events_buffer(events: list[bytes]) -> tuple[bytearray, list[tuple[int, int]]]:
    """SSE ``data:`` lines of ``events`` in one buffer, with each event's (start, end) in it: what
    ``StreamAssembler`` reads in place."""
    buf, spans = bytearray(), []
    for e in events:
        buf += b"data: "
        spans.append((len(buf), len(buf) + len(e)))
        buf += e + b"\n\n"
    return buf, spans


def policy_reply(prompt: str) -> str:
    """The scripted policy: a tool call when asked to list files, thinking when asked to think."""
    last_user = prompt.rsplit("<|im_start|>user\n", 1)[-1]
    if "list the files" in last_user:
        return '<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'
    if "think first" in last_user:
        return "<think>\nLet me think. ðŁ caf\u00e9\n</think>\n\nThe answer is 42."
    if "tool_response" in last_user:
        return "The folder has 3 files."
    return "Sure \u2014 here is a reply with caf\u00e9 and an emoji \U0001f642 ok."


def judge_reply(prompt: str) -> str:
    """The scripted judge. PRM votes: +1 on thanks or a tool result, -1 on 'wrong', else 0.
    Hint votes: a hint on 'wrong' or 'french', -1 on thanks, an unparsable 0 otherwise."""
    state = prompt.split("## Next state", 1)[-1]
    state = state.split("\n\nClassify")[0].split("\n\nGive your decision")[0].lower()
    hint_vote = "[HINT_START] and [HINT_END]" in prompt
    if "[role: tool]" in state or "thanks" in state:
        return "\\boxed{-1}" if hint_vote else "<think>maybe \\boxed{-1}?</think>The user is happy. \\boxed{1}"
    if hint_vote and ("wrong" in state or "french" in state):
        return f"\\boxed{{1}} [HINT_START]{HINT}[HINT_END]"
    if "wrong" in state:
        return "Correction requested. \\boxed{-1}"
    return "Unclear. \\boxed{0}"


HINT = "Answer in French, the user asked for French."


def hint_aware_scorer(tokenizer: Any) -> Callable[[Any, int], float]:
    """Teacher log-probs that prove what the teacher saw: with the hint in its prompt, token t scores
    -(t % 7 + 1) / 10; without it, -5.0."""
    def score(prefix: Any, token: int) -> float:
        seen = HINT in tokenizer.decode(list(prefix)[-200:], skip_special_tokens=False)
        return -((token % 7) + 1) / 10 if seen else -5.0
    return score


@contextmanager
def scripted_server(tokenizer: Any, reply: Callable[[str], str], *, port: int | None = None,
                    **model_kw: Any) -> Iterator[Any]:
    from openclaw_rl.engine.app import make_engine_app
    from openclaw_rl.engine.scripted import ScriptedModel
    from openclaw_rl.servers import BackgroundServer

    def responder(prompt_ids: list[int]) -> str:
        return reply(tokenizer.decode(prompt_ids, skip_special_tokens=False))

    model_kw.setdefault("context_length", 65536)  # OpenClaw's prompts are ~25K tiny-tokenizer tokens
    model = ScriptedModel(tokenizer, responder=responder, **model_kw)
    app = make_engine_app(model, tokenizer, served_model_name="tiny", model_path="tiny")
    with BackgroundServer(app, port=port) as server:
        server.model, server.app = model, app
        yield server


def talk(url: str, sid: str, user_turns: list[str], done: bool = True) -> None:
    """One session through the proxy, each request the whole conversation so far; the last turn marked
    done (``X-Session-Done``) unless ``done`` is False."""
    import httpx

    convo: list[dict] = []
    for i, text in enumerate(user_turns):
        convo.append({"role": "user", "content": text})
        headers = {"X-Session-Id": sid, **({"X-Session-Done": "1"} if done and i == len(user_turns) - 1 else {})}
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": convo}, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        convo.append(r.json()["choices"][0]["message"])


def wait_until(cond: Callable[[], Any], timeout: float = 30.0) -> None:
    """Poll ``cond`` (another thread's or process's progress, which has no event to wait on)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def wait_for_samples(proxy: Any, n: int, timeout: float = 20.0) -> list[Any]:
    proxy.writer.flush()
    count = proxy.spool.wait_ready(n, timeout)
    assert count >= n, f"only {count} of {n} samples arrived"
    proxy.writer.flush()
    return list(proxy.spool.iter_samples())


def settle(proxy: Any, timeout: float = 20.0) -> None:
    """Wait until every turn of ended sessions is judged and persisted: on the proxy's loop, until its
    judgements in flight have ended (``SessionTracker.wait_judged``), then until the writer and the dashboard
    journal have flushed."""
    import asyncio

    async def judged() -> None:
        tracker = proxy.tracker
        await tracker.wait_judged(timeout)
        # A turn of an ended session that was still generating starts its judgement when it completes,
        # which its own request does; the tests call settle after their requests returned.
        assert tracker.unsettled_turns <= tracker.pending_turns, "turns of ended sessions are still unjudged"

    asyncio.run_coroutine_threadsafe(judged(), proxy.server.loop).result(timeout + 5)
    proxy.writer.flush()
    if getattr(proxy, "journal", None) is not None:  # it holds a burst's turns ~50 ms before their lines
        proxy.journal.flush()


def metric(proxy: Any, name: str, **labels: str) -> float:
    """A metric's value as ``GET /metrics`` reports it, through prometheus_client's public registry API
    (``openclaw_turns_dropped_total``, reason="no_hint"); 0 for a label set never counted."""
    value = proxy.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def request_count(proxy: Any, code: int, route: str = "/v1/chat/completions", timeout: float = 10.0,
                  expected: float = 1.0) -> float:
    """``openclaw_requests_total`` for (route, code) once it reaches ``expected`` (or the deadline passes).
    The request metrics are counted when the app returns, after the last byte is sent: a client can hold
    the response before its request is counted."""
    deadline = time.monotonic() + timeout
    while (value := metric(proxy, "openclaw_requests_total", route=route, code=str(code))) < expected \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    return value


def on_loop(proxy: Any, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on the proxy's event loop (session state is only touched there) and return its result."""
    import asyncio

    async def call() -> Any:
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), proxy.server.loop).result(30)


MISTRAL_CONTROL = ["[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]",
                   "[/AVAILABLE_TOOLS]", "[THINK]", "[/THINK]", "[TOOL_CALLS]", "[ARGS]", "[TOOL_RESULTS]",
                   "[/TOOL_RESULTS]"]


def record_generate(proxy: Any) -> list[dict[str, Any]]:
    """Wrap ``proxy``'s policy backend so each ``/generate`` payload it sends is kept (a copy), in order."""
    seen: list[dict[str, Any]] = []
    original = proxy.service.backend.generate

    async def recording(payload: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        seen.append(dict(payload))
        return await original(payload, *args, **kwargs)

    proxy.service.backend.generate = recording
    return seen


def mistral_shaped_tokenizer(model_dir: Path) -> Any:
    """The tiny tokenizer with Mistral's control tokens added and a Mistral-shaped chat template: the
    second model family of the chat-format tests."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.add_special_tokens({"bos_token": "<s>", "eos_token": "</s>", "additional_special_tokens": MISTRAL_CONTROL})
    tok.chat_template = (GOLDEN / "chat-formats" / "mistral.jinja").read_text()
    return tok


def load_conversation(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (GOLDEN / "openclaw-golden" / name).read_text().splitlines() if line]



class FaultBackend:
    """A policy backend speaking SGLang's /generate whose answers a test scripts call by call: values out
    of range, slow first answers (noting whether the proxy hung up on them), a context length."""

    def __init__(self, context_length: int = 4096, tokenizer: Any = None):
        self.context_length = context_length
        self.tokenizer = tokenizer  # given: a step's text and ids agree (the proxy checks that they do)
        self.plan: list[dict[str, Any]] = []  # consumed one per /generate; default: a normal 3-token answer
        self.calls: list[dict[str, Any]] = []  # request bodies received
        self.hung_up = 0  # slow answers whose caller disconnected before they were sent

    def app(self) -> Any:
        import asyncio

        from fastapi import FastAPI
        from fastapi.responses import JSONResponse, Response, StreamingResponse

        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": "fault", "object": "model", "max_model_len": self.context_length}]}

        @app.post("/generate")
        async def generate(request: Request) -> Any:
            body = await request.json()
            self.calls.append(body)
            step = self.plan.pop(0) if self.plan else {}
            deadline = time.monotonic() + step.get("delay", 0.0)
            while time.monotonic() < deadline:
                if await request.is_disconnected():
                    self.hung_up += 1
                    return JSONResponse({}, status_code=499)
                await asyncio.sleep(0.02)
            ids, text = self._ids_and_text(step)
            lps = step.get("logprobs", [-0.5] * len(ids))
            out = {"text": text, "output_ids": ids,
                   "meta_info": {"finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": len(body["input_ids"]),
                                 "weight_version": "default",
                                 "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)]}}
            if not body.get("stream"):  # json.dumps, not JSONResponse: NaN must reach the proxy as SGLang would send it
                return Response(json.dumps(out), media_type="application/json")

            def text_of(k: int) -> str:
                """A chunk's (cumulative) text: what its ids decode to, as far as it agrees with the final text
                (SGLang's chunks never carry text of ids not yet sent); without a tokenizer, the whole text."""
                if self.tokenizer is None or k == len(ids):
                    return text
                try:
                    partial, n = self.tokenizer.decode(ids[:k]), 0
                except (OverflowError, TypeError, ValueError):  # ids no tokenizer has (the invalid-value tests)
                    return text
                while n < min(len(partial), len(text)) and partial[n] == text[n]:
                    n += 1
                return text[:n]

            async def chunks() -> Any:
                for k in range(1, len(ids) + 1):
                    chunk = {**out, "text": text_of(k), "output_ids": ids[:k], "meta_info": {
                        **out["meta_info"], "finish_reason": out["meta_info"]["finish_reason"] if k == len(ids) else None,
                        "output_token_logprobs": out["meta_info"]["output_token_logprobs"][:k]}}
                    yield f"data: {json.dumps(chunk, allow_nan=True)}\n\n".encode()
                yield b"data: [DONE]\n\n"
            return StreamingResponse(chunks(), media_type="text/event-stream")

        return app

    def _ids_and_text(self, step: dict[str, Any]) -> tuple[list[int], str]:
        """The step's ids and text; with a tokenizer, whichever is missing is made to agree with the other
        (a text's ids end with the end-of-turn token, which the text omits as SGLang's does)."""
        tok = self.tokenizer
        if tok is None:
            return step.get("ids", [65, 66, 2]), step.get("text", "ok")
        ids = step.get("ids") or [*tok.encode(step.get("text", "ok"), add_special_tokens=False), tok.eos_token_id]
        if "text" in step:
            return ids, step["text"]
        try:
            return ids, tok.decode(ids, skip_special_tokens=True)
        except (OverflowError, TypeError, ValueError):  # ids no tokenizer takes (2**40): the values are the test
            return ids, "ok"


@contextmanager
def fault_backend(**kw: Any) -> Iterator[Any]:
    from openclaw_rl.servers import BackgroundServer

    backend = FaultBackend(**kw)
    with BackgroundServer(backend.app()) as server:
        backend.url = server.url  # type: ignore[attr-defined]
        yield backend


def http_client(timeout: float = 30.0) -> Any:
    """A blocking HTTP client to reuse for a test's requests. ``httpx.get`` / ``httpx.post`` build a client, and
    with it a TLS context, on every call (about 40 ms of CPU): in the restart tests' retry and health-polling
    loops that was most of the suite's in-process CPU. No keep-alive, so every request still opens its own
    connection, as the one-shot calls did (a proxy killed between two requests leaves no stale pooled
    connection behind). Thread-safe: clients in several threads may share one."""
    import httpx

    return httpx.Client(timeout=timeout, limits=httpx.Limits(max_keepalive_connections=0))


def serve_cli(port: int, *args: str, startup_s: float = 180.0) -> Any:
    """`openclaw-rl serve --port PORT ARGS…` as a user runs it; returns the process once /healthz answers.
    (Start-up imports transformers: seconds, or tens of seconds on a loaded machine.)"""
    import os
    import subprocess
    import sys

    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "openclaw_rl.cli", "serve", "--port", str(port), *args],
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + startup_s
    with http_client(timeout=1) as http:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if http.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    return proc
            except httpx.HTTPError:
                time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"proxy on port {port} did not start (exit code {proc.poll()})")


@contextmanager
def build_lock(cache: Path) -> Iterator[None]:
    """One builder at a time per cache: with ``pytest -n``, one process builds (a minute of CPU) while the
    others wait for it and then find the finished model, instead of each building its own copy."""
    import fcntl

    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.with_name(cache.name + ".lock"), "w") as lock:  # beside it: the cache holds only models
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def private_model_build(environ: Mapping[str, str]) -> bool:
    """Whether the session builds its own tiny model instead of using the repository's cache: only with
    ``OPENCLAW_TEST_FRESH_MODEL=1`` (``scripts/run_full_tests.sh`` sets it). ``OPENCLAW_TEST_FULL=1`` alone
    once implied it, so a single full-size test (``test_workers``' SIGKILL test: 16 s) also paid a whole
    build first (46-128 s of fixture setup on the shared machine)."""
    return environ.get("OPENCLAW_TEST_FRESH_MODEL") == "1"


def build_session_model(cache: Path, locked: Callable[[], None] = lambda: None) -> Path:
    """The suite's default tiny model (h128, seed 0) in `cache`, built under `build_lock` if missing;
    `locked` is called once the lock is held. Run in the background by ``python tests/support.py CACHE``."""
    from openclaw_rl.embedded.tiny_model import ensure_tiny_model

    with build_lock(cache):
        locked()
        return ensure_tiny_model("h128", cache_dir=cache)


if __name__ == "__main__":  # the background builder (conftest.tiny_model_in_background)
    import sys

    build_session_model(Path(sys.argv[1]), lambda: print("locked", flush=True))
