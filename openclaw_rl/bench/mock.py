"""``openclaw-rl mock-sglang``: a scripted SGLang stand-in with latency knobs, run as its own process.

Why: the proxy benchmark must measure the proxy's own cost, so the backend has to be cheap,
deterministic and in a separate process (its CPU must not show up in the proxy's /proc counters).
This wraps ``ScriptedModel`` (fixed reply of ``--reply-tokens`` byte tokens, then eos) in the
SGLang-compatible engine app. With ``--judge`` it answers every prompt with a short ``\\boxed{1}``
verdict, so the proxy's judge path (m votes per turn) runs for real.

Two hostile-backend behaviours for the load test's attacks (``scripts/load_test.py``): ``--pad-bytes N``
adds an N-byte junk field to every non-streamed ``/generate`` body (a huge backend body), and
``--mismatch-text`` makes the reported ``text`` differ from the ``output_ids`` (streamed chunks too).

The latency (time to first token, decode rate) can be changed while it runs, through
``POST /bench/latency`` (``{"ttft_ms": 50, "tokens_per_s": 100}``): one process set then serves several
benchmark configurations in a row, and the proxy's counters stay comparable across them.
It binds 127.0.0.1 only: it is a benchmark fixture, not a server.

The other mocked end lives here too: scripted OpenClaw traffic (``build_workload``), a system prompt,
a dozen function tools and user turns that grow a history to a target size, with the exact prompt ids
the proxy will render, so a benchmark can send the same turn through the proxy and straight to the mock.
``processes.Stack`` runs a policy mock, a judge mock and the proxy under test as three processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
JSON_HEADERS = {"content-type": "application/json"}
JUDGE_REPLY = "The user moves on. \\boxed{1}"
_FILLER = ("Done. I updated the handler, reran the tests and they pass; the config now reads the cache "
           "size from the environment, and the log shows no more retries. ")


def reply_text(tokens: int) -> str:
    """A fixed ASCII reply of exactly ``tokens`` bytes (the scripted core emits one token per byte)."""
    if tokens <= 0:
        return ""
    text = _FILLER * (tokens // len(_FILLER) + 1)
    return text[:tokens - 1] + "."


SYSTEM = ("You are a personal assistant running inside OpenClaw. You work in the user's workspace through "
          "tools: read and edit files, run commands, search the web and send messages. Prefer small, "
          "verifiable steps; say what you changed and why. Never invent file contents: read them first. "
          "When a command fails, read its output before retrying. Keep answers short unless asked otherwise.")
WORDS = ["the", "file", "config", "server", "request", "session", "token", "model", "agent", "tool", "result",
         "error", "build", "test", "deploy", "user", "cache", "memory", "queue", "thread", "worker", "python",
         "import", "return", "function", "class", "value", "list", "dict", "string", "index", "path", "output",
         "input", "stream", "retry", "timeout", "handler", "log", "line", "branch", "commit", "review", "patch"]


def _tool(name: str, doc: str, params: dict[str, str], required: list[str]) -> dict[str, Any]:
    """An OpenAI function tool; ``params`` maps a name to "type: description"."""
    props = {k: {"type": v.split(": ")[0], "description": v.split(": ")[1]} for k, v in params.items()}
    return {"type": "function", "function": {"name": name, "description": doc, "parameters": {
        "type": "object", "properties": props, "required": required}}}


TOOLS = [  # the shape of OpenClaw's tool list (names and sizes), not its text
    _tool("read", "Read a text file.", {"path": "string: file path", "offset": "integer: first line",
                                        "limit": "integer: lines"}, ["path"]),
    _tool("write", "Create or overwrite a file.", {"path": "string: file path", "content": "string: full text"},
          ["path", "content"]),
    _tool("edit", "Replace exact text in a file.", {"path": "string: file path", "old": "string: text to find",
                                                     "new": "string: replacement"}, ["path", "old", "new"]),
    _tool("exec", "Run a shell command.", {"command": "string: command line", "timeout": "integer: seconds",
                                          "background": "boolean: keep running"}, ["command"]),
    _tool("process", "Poll or kill a background command.", {"action": "string: poll|kill|log",
                                                             "id": "string: process id"}, ["action", "id"]),
    _tool("web_search", "Search the web.", {"query": "string: search terms", "count": "integer: results"},
          ["query"]),
    _tool("web_fetch", "Fetch a URL as text.", {"url": "string: address", "max_chars": "integer: truncate at"},
          ["url"]),
    _tool("browser", "Drive a browser tab.", {"action": "string: open|click|type|snapshot",
                                              "target": "string: selector"}, ["action"]),
    _tool("message", "Send a chat message.", {"channel": "string: channel", "to": "string: recipient",
                                              "text": "string: body"}, ["text"]),
    _tool("cron", "Schedule a reminder.", {"when": "string: cron expression", "text": "string: reminder"},
          ["when", "text"]),
    _tool("sessions_spawn", "Start a sub-agent.", {"task": "string: what it should do", "label": "string: name"},
          ["task"]),
    _tool("memory_search", "Search long-term memory.", {"query": "string: what to recall", "limit": "integer: hits"},
          ["query"]),
]


@dataclass
class Case:
    """One turn of a scripted session: the OpenAI messages and the ids the proxy will render from them."""

    messages: list[dict[str, Any]]
    ids: list[int]
    tools: list[dict[str, Any]] | None = None  # None: TOOLS


def build_workload(tokenizer: Any, *, sessions: int, turns: int, max_history_tokens: int, reply_tokens: int,
                   seed: int = 0) -> list[list[Case]]:
    """Sessions whose user turns add equal token counts, so the last prompt is ~``max_history_tokens``.

    The mock's reply does not depend on the prompt, so whole conversations are known in advance: the
    ids can be rendered before any timing, and equal new tokens per turn let CPU per history size tell
    history-proportional work from new-token work."""
    reply = reply_text(reply_tokens)

    def render(messages: list[dict[str, Any]]) -> list[int]:
        text = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
        return list(tokenizer.encode(text, add_special_tokens=False))

    system = {"role": "system", "content": SYSTEM}
    base = len(render([system, {"role": "user", "content": ""}]))
    reply_cost = len(tokenizer.encode(reply, add_special_tokens=False)) + 6
    per_turn = max(16, (max_history_tokens - base) // turns - reply_cost)
    per_word = len(tokenizer.encode(" ".join(WORDS * 4), add_special_tokens=False)) / (len(WORDS) * 4)
    words = max(4, round(per_turn / per_word))
    out = []
    for s in range(sessions):
        rng = random.Random(seed * 100_003 + s)
        messages: list[dict[str, Any]] = [system]
        cases = []
        for t in range(turns):
            if t:
                messages = [*messages, {"role": "assistant", "content": reply}]
            text = f"Step {t + 1} of task {s}: " + " ".join(rng.choice(WORDS) for _ in range(words))
            messages = [*messages, {"role": "user", "content": text}]
            cases.append(Case(messages, render(messages)))
        out.append(cases)
    return out


def chat_body(case: Case, reply_tokens: int, stream: bool) -> bytes:
    """What OpenClaw sends the proxy for this turn."""
    return json.dumps({"model": "policy", "messages": case.messages, "tools": TOOLS if case.tools is None else case.tools,
                       "max_tokens": reply_tokens + 8, "stream": stream}).encode()


def generate_body(case: Case, reply_tokens: int, stream: bool, stream_interval: int = 0) -> bytes:
    """What the proxy sends SGLang for this turn (main line: rollout temperature 1.0, log-probs on; a
    streamed turn asks for ``stream_interval`` tokens per event, as the proxy does)."""
    params = {"max_new_tokens": reply_tokens + 8, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0}
    if stream and stream_interval:
        params["stream_interval"] = stream_interval
    return json.dumps({"input_ids": case.ids, "sampling_params": params, "return_logprob": True,
                       "stream": stream}).encode()


def ensure_tokenizer(cache_dir: Path | None = None) -> Path:
    """The tiny model's tokenizer alone, built offline (about a second) and cached.

    The benchmark needs the vocabulary and chat template, not weights: building the tiny model itself
    includes pre-training, minutes on a small CPU. Same files as the model's tokenizer (same corpus)."""
    from openclaw_rl.embedded.tiny_model import FORMAT_VERSION, build_tokenizer, default_cache_dir

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / f"tokenizer-v{FORMAT_VERSION}"
    if (target / "tokenizer_config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tokenizer.", dir=root))
    try:
        build_tokenizer(tmp)
        tmp.chmod(0o755)
        try:
            os.rename(tmp, target)  # atomic: a concurrent builder's identical copy may already be there
        except OSError:
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


MISMATCH_PREFIX = "[mock: not the output ids] "


class Tamper:
    """ASGI wrapper of the mock engine: ``pad_bytes`` of junk appended to every non-streamed ``/generate``
    JSON body, and with ``mismatch_text`` a ``text`` that is not what ``output_ids`` decode to (prefixed,
    in every streamed chunk too). Both can be changed while it runs (``POST /bench/latency``)."""

    def __init__(self, app: Any, pad_bytes: int = 0, mismatch_text: bool = False):
        self.app, self.pad_bytes, self.mismatch_text = app, pad_bytes, mismatch_text
        self._pad = b""

    def __getattr__(self, name: str) -> Any:  # app.state, app.service, app.router … of the wrapped app
        return getattr(self.app, name)

    def padding(self) -> bytes:
        if len(self._pad) != self.pad_bytes:
            self._pad = b"x" * self.pad_bytes
        return self._pad

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/generate" or not (self.pad_bytes or self.mismatch_text):
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] = {}
        parts: list[bytes] = []

        async def tampered(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            parts.append(message.get("body", b""))
            streamed = any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in start["headers"])
            if streamed:  # rewrite each chunk as it comes
                if start.get("type"):
                    await send({**start, "headers": [(k, v) for k, v in start["headers"] if k != b"content-length"]})
                    start["type"] = ""
                await send({"type": "http.response.body", "body": self._chunk(b"".join(parts)),
                            "more_body": message.get("more_body", False)})
                parts.clear()
            elif not message.get("more_body", False):
                body = self._body(b"".join(parts))
                headers = [(k, v) for k, v in start["headers"] if k != b"content-length"]
                await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, tampered)

    def _chunk(self, data: bytes) -> bytes:
        if not self.mismatch_text:
            return data
        prefix = json.dumps(MISMATCH_PREFIX)[1:-1].encode()
        return data.replace(b'"text":"', b'"text":"' + prefix).replace(b'"text": "', b'"text": "' + prefix)

    def _body(self, data: bytes) -> bytes:
        try:
            obj = json.loads(data)
        except ValueError:
            return data
        items = obj if isinstance(obj, list) else [obj]
        if self.mismatch_text:
            for item in items:
                if isinstance(item, dict) and isinstance(item.get("text"), str):
                    item["text"] = MISMATCH_PREFIX + item["text"]
        if not self.pad_bytes or not items or not isinstance(items[0], dict):
            return json.dumps(obj, separators=(",", ":")).encode()
        first = json.dumps(items[0], separators=(",", ":")).encode()[:-1] + b',"mock_padding":"' + self.padding() + b'"}'
        if not isinstance(obj, list):  # a list (n > 1, the judge's votes): its first item carries the padding
            return first
        rest = [json.dumps(x, separators=(",", ":")).encode() for x in obj[1:]]
        return b"[" + b",".join([first, *rest]) + b"]"


def build_mock_app(tokenizer: Any, *, judge: bool = False, ttft_s: float = 0.0, tokens_per_s: float = 0.0,
                   reply_tokens: int = 64, context_length: int = 131072,
                   incremental_streaming_output: bool = False, stream_interval: int = 1,
                   pad_bytes: int = 0, mismatch_text: bool = False) -> Any:
    """The engine app over a ``ScriptedModel`` whose reply never depends on the prompt.

    A prompt-independent reply keeps the mock's own cost flat across history sizes, so any growth of
    the proxy's cost with history is the proxy's. ``app.state.model`` is the core (latency knobs).
    It streams in either of SGLang's modes (cumulative by default, as SGLang). ``POST /bench/latency``
    also takes ``reply_tokens`` and ``incremental`` (the stream mode), so one process serves several
    reply lengths and both modes.
    """
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from openclaw_rl.engine.app import make_engine_app
    from openclaw_rl.engine.scripted import ScriptedModel

    reply = [JUDGE_REPLY if judge else reply_text(reply_tokens)]
    # The judge's votes are never streamed: it yields to its event loop every 16 instant tokens instead of
    # after each (3.7-4.4 -> 2.7-2.8 ms of CPU per 3-vote request, on the cores the proxies are measured on).
    model = ScriptedModel(tokenizer, responder=lambda prompt_ids: reply[0], ttft_s=ttft_s, tokens_per_s=tokens_per_s,
                          context_length=context_length, yield_every=16 if judge else 1)
    name = "mock-judge" if judge else "mock-policy"
    app = make_engine_app(model, tokenizer, served_model_name=name, model_path=name,
                          incremental_streaming_output=incremental_streaming_output, stream_interval=stream_interval)
    app.state.model = model
    tamper = Tamper(app, pad_bytes, mismatch_text)

    async def set_latency(request: Request) -> JSONResponse:
        body = await request.json()
        model.ttft_s = max(0.0, float(body.get("ttft_ms", model.ttft_s * 1000.0))) / 1000.0
        model.tokens_per_s = max(0.0, float(body.get("tokens_per_s", model.tokens_per_s)))
        if body.get("reply_tokens") is not None and not judge:
            reply[0] = reply_text(int(body["reply_tokens"]))
        if body.get("incremental") is not None:  # SGLang's stream mode (the proxy reads it per chunk)
            app.service.incremental_streaming_output = bool(body["incremental"])
        if body.get("pad_bytes") is not None:
            tamper.pad_bytes = max(0, int(body["pad_bytes"]))
        if body.get("mismatch_text") is not None:
            tamper.mismatch_text = bool(body["mismatch_text"])
        return JSONResponse({"ttft_ms": model.ttft_s * 1000.0, "tokens_per_s": model.tokens_per_s,
                             "reply_chars": len(reply[0]), "pad_bytes": tamper.pad_bytes,
                             "mismatch_text": tamper.mismatch_text,
                             "incremental": app.service.incremental_streaming_output})

    app.router.add_route("/bench/latency", set_latency, methods=["POST"])  # plain Starlette: no annotations read
    app.router.add_route("/v1/chat/completions", _chat_route(model, reply, name), methods=["POST"])
    return tamper


def _chat_route(model: Any, reply: list[str], name: str) -> Any:
    """SGLang's non-streamed ``/v1/chat/completions`` with ``logprobs`` (golden shape), for upstream's
    proxy in the side-by-side benchmark (it calls this, not ``/generate``). The same scripted reply, one
    token per byte and log-prob -0.5; the latency knobs apply; the prompt is not rendered (that is the
    server's cost, not a proxy's)."""
    from starlette.requests import Request
    from starlette.responses import Response

    from openclaw_rl import codec

    cache: dict[str, list[dict[str, Any]]] = {}

    def token_logprobs(text: str) -> list[dict[str, Any]]:
        if text not in cache:
            cache.clear()
            out = []
            for ch in text:
                raw = list(ch.encode())
                entry = {"token": ch, "bytes": raw, "logprob": -0.5}
                out.append({**entry, "top_logprobs": [entry]})
            cache[text] = out
        return cache[text]

    async def chat(request: Request) -> Response:
        body = codec.loads(await request.body())
        text = reply[0]
        if model.ttft_s or model.tokens_per_s:
            await asyncio.sleep(model.ttft_s + (len(text) / model.tokens_per_s if model.tokens_per_s else 0.0))
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": None,
                                          "tool_calls": None},
                  "logprobs": {"content": token_logprobs(text)} if body.get("logprobs") else None,
                  "finish_reason": "stop", "matched_stop": None}
        completion = len(text.encode()) + 1
        out = {"id": uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()), "model": name,
               "choices": [choice], "usage": {"prompt_tokens": 0, "total_tokens": completion,
                                              "completion_tokens": completion, "prompt_tokens_details": None,
                                              "reasoning_tokens": 0, "completion_tokens_details": None},
               "metadata": {"weight_version": "default"}}
        return Response(codec.dumps(out), media_type="application/json")

    return chat


def add_mock_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", required=True, help="tokenizer dir (byte-level BPE, e.g. the tiny model's)")
    p.add_argument("--port", type=int, required=True, help="port on 127.0.0.1")
    p.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first token")
    p.add_argument("--tokens-per-s", type=float, default=0.0, help="decode rate after it (0 = instant)")
    p.add_argument("--reply-tokens", type=int, default=64, help="reply length in tokens (eos follows)")
    p.add_argument("--context-length", type=int, default=131072)
    p.add_argument("--judge", action="store_true", help="answer every prompt with a short \\boxed{1} verdict")
    p.add_argument("--incremental-streaming-output", action="store_true",
                   help="stream only new text/ids/log-probs per chunk (SGLang's flag); default cumulative")
    p.add_argument("--stream-interval", type=int, default=1,
                   help="tokens per stream event when a request sets no sampling_params.stream_interval")
    p.add_argument("--pad-bytes", type=int, default=0,
                   help="append this many junk bytes to every non-streamed /generate body (a huge backend body)")
    p.add_argument("--mismatch-text", action="store_true",
                   help="report a text that differs from the output ids (a backend whose text and ids disagree)")


def cmd_mock(ns: argparse.Namespace) -> int:
    import uvicorn

    from openclaw_rl.server import load_tokenizer

    tokenizer = load_tokenizer(ns.tokenizer, "--tokenizer")
    app = build_mock_app(tokenizer, judge=ns.judge, ttft_s=ns.ttft_ms / 1000.0, tokens_per_s=ns.tokens_per_s,
                         reply_tokens=ns.reply_tokens, context_length=ns.context_length,
                         incremental_streaming_output=ns.incremental_streaming_output,
                         stream_interval=ns.stream_interval, pad_bytes=ns.pad_bytes,
                         mismatch_text=ns.mismatch_text)
    logging.getLogger(__name__).info("mock SGLang (%s) on http://%s:%d", "judge" if ns.judge else "policy",
                                     HOST, ns.port)
    uvicorn.run(app, host=HOST, port=ns.port, log_level="warning", access_log=False)
    return 0


def register_mock_command(sub: Any) -> None:
    """Add ``mock-sglang`` to the ``openclaw-rl`` subcommands (see ``cli._EXTRA_COMMANDS``)."""
    p = sub.add_parser("mock-sglang", help="a scripted SGLang stand-in with latency knobs (benchmarks)",
                       description=__doc__.splitlines()[0])
    add_mock_flags(p)
    p.set_defaults(fn=cmd_mock)


def main(argv: list[str] | None = None) -> int:
    """``python -m openclaw_rl.bench.mock``: the same as ``openclaw-rl mock-sglang``."""
    p = argparse.ArgumentParser(prog="mock-sglang", description=__doc__.splitlines()[0])
    add_mock_flags(p)
    return cmd_mock(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
