"""The floor of a turn: the least work a proxy with this contract does per non-streamed turn, in one process.

Stage: benchmark harness (``scripts/bench_turn_cpu.py``, issue #33 item 2). Not a server to deploy: a yardstick.
The proxy's CPU per turn is spread thin over many layers; this measures what no layering can remove, so the
benchmark can print proxy/floor beside proxy/direct. Per turn it does exactly this and nothing else:

- reads the request with httptools (keep-alive HTTP/1.1, one request at a time per connection: no pipelining)
  and parses its JSON with orjson (content-part lists flattened to text, ``developer`` → ``system``);
- renders the policy's chat template and tokenises the prompt with the proxy's own ``ChatRenderer`` (the same
  ``ChatTemplateText``, tiktoken encoder, per-session prefix reuse and shared first-block cache);
- POSTs ``/generate`` (input ids, rollout sampling parameters, log-probs on) over a raw keep-alive connection,
  parses the answer and checks it as the proxy must for exact training tokens: log-probs score exactly the
  output ids, every id in the vocabulary, every log-prob finite and ≤ 0, and the reply text is what the ids
  decode to (the client sees only the text of the ids that train);
- commits the turn (prompt ids, response ids, log-probs) to SQLite (WAL, ``synchronous=FULL``) before the
  200; the turns waiting at that moment share one transaction (group commit);
- on the session's next request, takes its trailing user/tool messages as the previous turn's next state,
  renders the judge prompt (the judge's template through ``ChatTemplateText``), asks the judge mock for
  m votes in one ``/generate`` (``n = m``, as ``judge.JudgeClient`` sends it), takes the majority, and writes
  the sample row (its pending turn row deleted in the same transaction); the last turn of a session that
  ends (``X-Session-Done``) is dropped and its row deleted;
- answers the OpenAI ``chat.completion`` JSON.

What it leaves out (the real proxy does these): pydantic validation and most 4xx checks, tool-call and
reasoning parsing of the reply (a plain-text reply needs none), the next state's own durable row, metrics,
logs, the dashboard, gates, retries, time-outs, streaming, side turns, identity schemes other than
``X-Session-Id``, the context probe. Its SQLite commits run on the event loop (no writer thread): they add
latency, not CPU. With ``--parts`` it times each part with ``time.thread_time`` and serves the totals at
``GET /parts``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sqlite3
import sys
import time
from array import array
from collections import defaultdict
from typing import Any
from urllib.parse import urlsplit

import httptools
import orjson

from openclaw_rl import codec
from openclaw_rl.chat import ChatRenderer
from openclaw_rl.chat_template import ChatTemplateText
from openclaw_rl.judge import PRM_SYSTEM, PRM_USER, majority_vote, parse_boxed

SCHEMA = """
CREATE TABLE IF NOT EXISTS turns (session TEXT, turn INTEGER, prompt_ids BLOB, response_ids BLOB, logprobs BLOB,
                                  PRIMARY KEY (session, turn));
CREATE TABLE IF NOT EXISTS samples (seq INTEGER PRIMARY KEY, session TEXT, turn INTEGER, prompt_ids BLOB,
                                    response_ids BLOB, logprobs BLOB, score REAL, votes TEXT);
"""


class Parts:
    """CPU seconds per part of the work (``time.thread_time``), or nothing at all when off."""

    def __init__(self, on: bool):
        self.on, self.cpu = on, defaultdict(float)
        self.clock = time.thread_time if on else (lambda: 0.0)

    def add(self, name: str, since: float) -> float:
        now = self.clock()
        if self.on:
            self.cpu[name] += now - since
        return now


class Spool:
    """The turn and sample rows. Writes queue until the next loop pass commits them all in one transaction."""

    def __init__(self, path: str, parts: Parts):
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)
        self.parts = parts
        self.turns: list[tuple[Any, ...]] = []
        self.samples: list[tuple[Any, ...]] = []
        self.deletes: list[tuple[str, int]] = []
        self.waiters: list[asyncio.Future] = []
        self.scheduled = False

    def _schedule(self) -> None:
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._commit)

    def save_turn(self, row: tuple[Any, ...]) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.turns.append(row)
        self.waiters.append(fut)
        self._schedule()
        return fut

    def put_sample(self, row: tuple[Any, ...] | None, key: tuple[str, int]) -> None:
        """A judged turn's sample (None: dropped), and its pending row deleted."""
        if row is not None:
            self.samples.append(row)
        self.deletes.append(key)
        self._schedule()

    def _commit(self) -> None:
        t0 = self.parts.clock()
        turns, samples, deletes, waiters = self.turns, self.samples, self.deletes, self.waiters
        self.turns, self.samples, self.deletes, self.waiters, self.scheduled = [], [], [], [], False
        try:
            self.db.execute("BEGIN")
            if turns:
                self.db.executemany("INSERT OR REPLACE INTO turns VALUES (?,?,?,?,?)", turns)
            if samples:
                self.db.executemany("INSERT INTO samples(session, turn, prompt_ids, response_ids, logprobs, score, "
                                    "votes) VALUES (?,?,?,?,?,?,?)", samples)
            if deletes:
                self.db.executemany("DELETE FROM turns WHERE session=? AND turn=?", deletes)
            self.db.execute("COMMIT")
            error = None
        except sqlite3.Error as e:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            error = e
        for fut in waiters:
            if not fut.done():
                fut.set_exception(error) if error else fut.set_result(None)
        self.parts.add("sqlite", t0)


class _Upstream(asyncio.Protocol):
    """One keep-alive connection to a mock: a request at a time, its answer parsed by httptools."""

    def __init__(self, pool: Pool):
        self.pool, self.parser = pool, httptools.HttpResponseParser(self)
        self.transport: Any = None
        self.body: list[bytes] = []
        self.fut: asyncio.Future | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        t0 = self.pool.parts.clock()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(e)
        self.pool.parts.add("http", t0)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        fut, self.fut = self.fut, None
        if fut is not None and not fut.done():
            fut.set_result((self.parser.get_status_code(), b"".join(self.body)))
        self.body = []
        if self.parser.should_keep_alive():
            self.pool.idle.append(self)
        else:
            self.transport.close()

    def _fail(self, error: BaseException) -> None:
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(error)
        self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self in self.pool.idle:
            self.pool.idle.remove(self)
        self._fail(exc or ConnectionError("connection closed"))


class Pool:
    """Keep-alive connections to one mock (``http://host:port``)."""

    def __init__(self, url: str, parts: Parts):
        u = urlsplit(url)
        self.host, self.port, self.parts = u.hostname or "127.0.0.1", u.port or 80, parts
        self.idle: list[_Upstream] = []

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.idle:
            conn = self.idle.pop()
        else:
            _, conn = await asyncio.get_running_loop().create_connection(lambda: _Upstream(self), self.host, self.port)
        t0 = self.parts.clock()
        conn.fut = asyncio.get_running_loop().create_future()
        conn.transport.write(b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: %d"
                             b"\r\n\r\n%s" % (path.encode(), self.host.encode(), self.port, len(body), body))
        self.parts.add("http", t0)
        return await conn.fut


class _Client(asyncio.Protocol):
    """One client connection: httptools parses each request, the floor answers it."""

    def __init__(self, floor: Floor):
        self.floor, self.parser = floor, httptools.HttpRequestParser(self)
        self.transport: Any = None
        self.url, self.body, self.session, self.done = b"", [], "", False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        t0 = self.floor.parts.clock()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            self.transport.close()
        self.floor.parts.add("http", t0)

    def on_message_begin(self) -> None:
        self.url, self.body, self.session, self.done = b"", [], "", False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"x-session-id":
            self.session = value.decode()
        elif name == b"x-session-done":
            self.done = value.strip().lower() in (b"1", b"true", b"yes")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        keep = self.parser.should_keep_alive()
        request = (self.parser.get_method(), self.url, b"".join(self.body), self.session, self.done)
        asyncio.get_running_loop().create_task(self.floor.answer(self, request, keep))

    def reply(self, status: bytes, body: bytes, keep: bool) -> None:
        t0 = self.floor.parts.clock()
        self.transport.write(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
                             % (status, len(body), b"" if keep else b"Connection: close\r\n", body))
        if not keep:
            self.transport.close()
        self.floor.parts.add("http", t0)


class BadRequest(Exception):
    pass


def _text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise BadRequest("content must be a string or a list of parts")


def _messages(raw: Any) -> list[dict[str, Any]]:
    """The request's messages as the template gets them (``chat.normalize_messages`` without pydantic)."""
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages must be a non-empty list")
    out = []
    for m in raw:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("each message needs a role")
        msg = {**m, "role": "system" if m["role"] == "developer" else m["role"], "content": _text(m.get("content"))}
        out.append(msg)
    return out


def _next_state(messages: list[dict[str, Any]]) -> dict[str, str] | None:
    """The trailing user/tool run after the last assistant message (``identity.next_state_of``'s plain shapes)."""
    run = []
    for m in reversed(messages):
        if m["role"] == "assistant":
            break
        if m["role"] in ("user", "tool"):
            run.append(m)
    else:
        return None  # no assistant reply before it: a session's first request
    if not run:
        return None
    run.reverse()
    role = "tool" if all(m["role"] == "tool" for m in run) else "user"
    return {"role": role, "content": "\n\n".join(m["content"] for m in run)}


class Floor:
    def __init__(self, tokenizer: Any, policy_url: str, judge_url: str, spool_path: str, *, votes: int = 3,
                 parts: bool = False):
        self.parts = Parts(parts)
        self.renderer = ChatRenderer(tokenizer)
        self.judge_template = ChatTemplateText(tokenizer)
        self.decode = self.renderer.decoder(True)
        self.vocab = self.renderer.vocab_size
        self.policy, self.judge = Pool(policy_url, self.parts), Pool(judge_url, self.parts)
        self.spool = Spool(spool_path, self.parts)
        self.votes = votes
        self.sessions: dict[str, tuple[int, Any]] = {}  # session → (its last turn's index, that turn)
        self.tasks: set[asyncio.Task] = set()
        self.counts: dict[str, int] = defaultdict(int)

    async def answer(self, conn: _Client, request: tuple[bytes, bytes, bytes, str, bool], keep: bool) -> None:
        method, url, body, session, done = request
        try:
            if method == b"POST" and url == b"/v1/chat/completions":
                status, out = b"200 OK", await self.turn(body, session, done)
            elif url == b"/healthz":
                status, out = b"200 OK", b'{"ok":true}'
            elif url == b"/parts":
                status, out = b"200 OK", orjson.dumps({"cpu_s": self.parts.cpu, "counts": self.counts})
            else:
                status, out = b"404 Not Found", b'{"error":"not found"}'
        except BadRequest as e:
            status, out = b"400 Bad Request", orjson.dumps({"error": str(e)})
        except Exception as e:  # noqa: BLE001 - the backend's or the spool's failure
            status, out = b"502 Bad Gateway", orjson.dumps({"error": repr(e)})
        conn.reply(status, out, keep)

    async def turn(self, body: bytes, session: str, done: bool) -> bytes:
        parts = self.parts
        t = parts.clock()
        try:
            req = orjson.loads(body)
            messages = _messages(req.get("messages"))
        except orjson.JSONDecodeError as e:
            raise BadRequest(f"invalid JSON: {e}") from e
        if not session:
            raise BadRequest("X-Session-Id is required")
        tools = req.get("tools") or None
        max_new = int(req.get("max_completion_tokens") or req.get("max_tokens") or 2048)
        t = parts.add("json", t)
        index, prev = self.sessions.get(session, (0, None))
        index += 1
        if prev is not None:  # the request brings the previous turn's next state: judge it now
            next_state = _next_state(messages)
            if next_state is not None:
                task = asyncio.get_running_loop().create_task(self.judge_turn(session, index - 1, prev, next_state))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            else:
                self.spool.put_sample(None, (session, index - 1))
                self.counts["dropped_no_next_state"] += 1
            self.sessions[session] = (index - 1, None)
        t = parts.add("session", t)
        text = self.renderer.template(messages, tools, True, plain=True)
        t = parts.add("template", t)
        ids_array = self.renderer._encode_cached(text, session)
        t = parts.add("tokenise", t)
        payload = codec.dumps({"input_ids": ids_array, "sampling_params": {
            "max_new_tokens": max_new, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "temperature": 1.0},
            "return_logprob": True})
        parts.add("json", t)
        status, data = await self.policy.post("/generate", payload)
        t = parts.clock()
        if status != 200:
            raise ConnectionError(f"policy answered {status}")
        answer = orjson.loads(data)
        answer = answer[0] if isinstance(answer, list) else answer
        meta = answer["meta_info"]
        out_ids = answer["output_ids"]
        triples = meta["output_token_logprobs"]
        t = parts.add("json", t)
        if len(triples) != len(out_ids) or [tr[1] for tr in triples] != out_ids:
            raise ConnectionError("log-probs do not score the output ids")
        logprobs = [float(tr[0]) for tr in triples]
        if out_ids and not (min(out_ids) >= 0 and max(out_ids) < self.vocab):
            raise ConnectionError("output id outside the vocabulary")
        if logprobs and not (all(map(math.isfinite, logprobs)) and max(logprobs) <= 0.0):
            raise ConnectionError("log-prob not finite or above 0")
        reply = str(answer.get("text") or "")
        if self.decode(out_ids) != reply:
            raise ConnectionError("the reply text is not what its ids decode to")
        finish = (meta.get("finish_reason") or {}).get("type", "stop")
        t = parts.add("checks", t)
        turn = (ids_array.tobytes(), array("i", out_ids).tobytes(), array("d", logprobs).tobytes(), reply)
        fut = self.spool.save_turn((session, index, turn[0], turn[1], turn[2]))
        if done:
            self.sessions.pop(session, None)
            self.renderer.forget(session)
        else:
            self.sessions[session] = (index, turn)
        t = parts.add("session", t)
        await fut
        t = parts.clock()
        if done:  # the session's last turn: nothing will bring its next state
            self.spool.put_sample(None, (session, index))
            self.counts["dropped_no_next_state"] += 1
        self.counts["turns"] += 1
        n = len(out_ids)
        out = orjson.dumps({
            "id": "chatcmpl-" + os.urandom(12).hex(), "object": "chat.completion", "created": int(time.time()),
            "model": req.get("model") or "policy",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "logprobs": None,
                         "finish_reason": "length" if finish == "length" else "stop"}],
            "usage": {"prompt_tokens": len(ids_array), "completion_tokens": n, "total_tokens": len(ids_array) + n}})
        parts.add("json", t)
        return out

    async def judge_turn(self, session: str, index: int, turn: tuple[bytes, bytes, bytes, str],
                         next_state: dict[str, str]) -> None:
        parts = self.parts
        t = parts.clock()
        user = PRM_USER.format(response=turn[3], role=next_state["role"], next_state=next_state["content"])
        prompt = self.judge_template([{"role": "system", "content": PRM_SYSTEM}, {"role": "user", "content": user}],
                                     plain=True)
        t = parts.add("judge_template", t)
        body = orjson.dumps({"text": prompt, "sampling_params": {
            "temperature": 0.6, "top_p": 1.0, "top_k": -1, "n": self.votes, "max_new_tokens": 4096,
            "skip_special_tokens": False, "no_stop_trim": True, "spaces_between_special_tokens": False},
            "return_logprob": False})
        parts.add("judge", t)
        try:
            status, data = await self.judge.post("/generate", body)
        except (OSError, httptools.HttpParserError):
            status, data = 0, b""
        t = parts.clock()
        try:
            items = orjson.loads(data) if status == 200 else []
        except orjson.JSONDecodeError:
            items = []
        items = items if isinstance(items, list) else [items]
        raws = [str(i["text"]) if isinstance(i, dict) and "text" in i else None for i in items]
        raws = (raws + [None] * self.votes)[: self.votes]
        votes = [None if r is None else parse_boxed(r) for r in raws]
        score = majority_vote(votes)
        if score:
            self.spool.put_sample((session, index, *turn[:3], score, orjson.dumps(votes).decode()), (session, index))
            self.counts["samples"] += 1
        else:  # RL: an ambiguous or failed judgement trains nothing (zero_score / judge_failed)
            self.spool.put_sample(None, (session, index))
            self.counts["dropped_zero_score"] += 1
        parts.add("judge", t)


async def serve(floor: Floor, port: int, host: str = "127.0.0.1", started: Any = None) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: _Client(floor), host, port, reuse_address=True)
    if started is not None:
        started(server)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="turn_floor", description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--policy-url", required=True)
    p.add_argument("--judge-url", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--spool", required=True, help="the SQLite file")
    p.add_argument("--votes", type=int, default=3)
    p.add_argument("--parts", action="store_true", help="time each part (time.thread_time); GET /parts")
    ns = p.parse_args(argv)
    from openclaw_rl.server import load_tokenizer

    floor = Floor(load_tokenizer(ns.tokenizer, "--tokenizer"), ns.policy_url, ns.judge_url, ns.spool,
                  votes=ns.votes, parts=ns.parts)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - plain asyncio
        uvloop = None
    try:
        if uvloop is not None:
            uvloop.run(serve(floor, ns.port))
        else:  # pragma: no cover
            asyncio.run(serve(floor, ns.port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
