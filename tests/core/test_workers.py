"""``serve --workers N``: an owner process (tracker, judge, spool) and HTTP workers (openclaw_rl/workers/).

The owner runs on its own event loop thread here; the workers are the real worker app, in-process on
their own ports (so a test chooses which worker serves each turn) or, for the crash test, real worker
processes sharing one listening socket under the real supervisor.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import queue
import signal
import threading
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from support import http_client, metric, scripted_server, settle, wait_for_samples, wait_until

from openclaw_rl.config import load_settings
from openclaw_rl.dashboard import data
from openclaw_rl.errors import CommandError
from openclaw_rl.server import Proxy
from openclaw_rl.servers import BackgroundServer
from openclaw_rl.spool import Spool, SpoolLocked
from openclaw_rl.turns import DropReason
from openclaw_rl.users.identity import key_namespace
from openclaw_rl.workers.app import SPOOL_FALLBACK, Worker
from openclaw_rl.workers.owner import OwnerHub

SESSIONS = [["hello there", "thanks, that was wrong", "think first please"],
            ["list the files", "wrong again", "thanks a lot"]]


class Owner:
    """An owner (Proxy.build + OwnerHub) on its own event loop thread."""

    def __init__(self, settings: Any, tokenizer: Any, workers: int, sock: str):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.proxy = Proxy.build(settings, tokenizer=tokenizer)
        self.proxy.server = SimpleNamespace(loop=self.loop)  # support.settle reaches the tracker's loop so
        self.sock = sock
        self.hub = self.run(self._start(workers))

    async def _start(self, workers: int) -> OwnerHub:
        await self.proxy.start()
        hub = OwnerHub(self.proxy, workers)
        await hub.start(self.sock)
        return hub

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def on_loop(self, fn: Any) -> Any:
        async def call() -> Any:
            return fn()
        return self.run(call())

    def stop(self) -> None:
        self.run(self.hub.close())
        self.run(self.proxy.shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def settings_for(tmp_path: Path, tiny_model_dir: Path) -> Any:
    def make(policy_url: str, judge_url: str, name: str, **values: Any) -> Any:
        return load_settings({"proxy_tokenizer": str(tiny_model_dir), "proxy_policy_url": policy_url,
                              "judge_url": judge_url, "spool_dir": str(tmp_path / name), "judge_max_new_tokens": 256,
                              **values}, env={})
    return make


@pytest.fixture
def owner_and_workers(settings_for: Any, tokenizer: Any, tmp_path: Path) -> Any:
    started: list[Any] = []

    def start(policy_url: str, judge_url: str, workers: int = 2, **values: Any) -> tuple[Owner, list[str], list[Worker]]:
        settings = settings_for(policy_url, judge_url, "spool-owner", **values)
        owner = Owner(settings, tokenizer, workers, str(tmp_path / "owner.sock"))
        started.append(owner)
        ws, urls = [], []
        for i in range(workers):
            worker = Worker.build(settings, owner.sock, i, tokenizer=tokenizer)
            server = BackgroundServer(worker.app).start()
            started.append(server)
            ws.append(worker)
            urls.append(server.url)
        return owner, urls, ws

    yield start
    for thing in reversed(started):
        thing.stop()


def converse(http: httpx.Client, urls: list[str], pick: Any) -> list[list[str]]:
    """Run SESSIONS; turn t of session s goes to ``urls[pick(s, t)]``. Returns the reply texts."""
    replies: list[list[str]] = []
    for s, turns in enumerate(SESSIONS):
        messages: list[dict[str, str]] = []
        replies.append([])
        for t, text in enumerate(turns):
            messages.append({"role": "user", "content": text})
            headers = {"X-Session-Id": f"s{s}", **({"X-Session-Done": "1"} if t == len(turns) - 1 else {})}
            r = http.post(f"{urls[pick(s, t)]}/v1/chat/completions", headers=headers,
                          json={"model": "m", "messages": messages, "stream": t == 1})
            assert r.status_code == 200, r.text
            if t == 1:
                content = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                                  for line in r.text.splitlines() if line.startswith("data: {"))
            else:
                content = r.json()["choices"][0]["message"]["content"] or ""
            replies[-1].append(content)
            messages.append({"role": "assistant", "content": content})
            if t == 0:  # a side turn on the same session id, on the other worker: answered, never trained
                side = http.post(f"{urls[(pick(s, t) + 1) % len(urls)]}/v1/chat/completions",
                                 headers={"X-Session-Id": f"s{s}", "X-Turn-Type": "side"},
                                 json={"model": "m", "messages": [{"role": "user", "content": "summarise"}]})
                assert side.status_code == 200, side.text
                replies[-1].append(side.json()["choices"][0]["message"]["content"])
    return replies


def samples_of(proxy: Any) -> list[tuple]:
    settle(proxy)
    return sorted((s.session_id, s.turn, tuple(s.prompt_ids), tuple(s.response_ids), tuple(s.rollout_log_probs),
                   s.reward) for s in proxy.spool.iter_samples())


def drops(proxy: Any) -> dict[str, float]:
    return {r.value: metric(proxy, "openclaw_turns_dropped_total", reason=r.value) for r in DropReason}


def test_turns_alternating_between_two_workers_pair_and_match_one_process(
        policy_server, judge_server, make_proxy, owner_and_workers):
    """A session's turns served by alternating workers: each next request pairs with the turn another worker
    served (the owner's one tracker), and the samples are the one-process proxy's, id for id."""
    one, one_url = make_proxy(policy_server.url, judge_server.url)
    owner, urls, _ = owner_and_workers(policy_server.url, judge_server.url)
    with http_client() as http:
        expected_replies = converse(http, [one_url], lambda s, t: 0)
        replies = converse(http, urls, lambda s, t: (s + t) % 2)
    assert replies == expected_replies
    expected = samples_of(one)
    assert len(expected) >= 3  # two turns per session have a next state (one judged 0); the last ends its session
    assert samples_of(owner.proxy) == expected
    assert drops(owner.proxy) == drops(one) and drops(one)["no_next_state"] == 2
    assert owner.on_loop(lambda: owner.proxy.tracker.unsettled_turns) == 0
    with http_client() as http:  # /metrics (any worker) is the owner's, with every worker's counters added in
        text = http.get(f"{urls[0]}/metrics").text
        health = http.get(f"{urls[1]}/healthz").json()
    assert 'openclaw_turns_total{type="main"} 6.0' in text and 'openclaw_turns_total{type="side"} 2.0' in text
    assert health["ok"] and health["worker"] == 1 and health["workers"]["connected"] == 2


def test_a_worker_replies_only_after_the_owner_commits(policy_server, owner_and_workers):
    """The owner's writer fails the commit: the worker refuses the reply (503), never a 200 for an unsaved turn,
    and the turn is dropped as not_durable."""
    owner, urls, _ = owner_and_workers(policy_server.url, "", workers=1)
    writer = owner.proxy.writer
    real = writer.save_turn

    def failing(turn: Any) -> Any:
        fut = real(turn)
        failed: Future = Future()
        fut.add_done_callback(lambda f: failed.set_exception(OSError("disk full (test)")))
        return failed
    owner.proxy.tracker.persist = failing
    with http_client() as http:
        r = http.post(f"{urls[0]}/v1/chat/completions", headers={"X-Session-Id": "d"},
                      json={"model": "m", "messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 503, r.text
    assert "could not save this turn" in r.json()["error"]["message"]
    settle(owner.proxy)
    wait_until(lambda: metric(owner.proxy, "openclaw_turns_dropped_total", reason="not_durable") == 1)


def chat(http: httpx.Client, url: str, session: str, messages: list[dict[str, str]], **extra: Any) -> httpx.Response:
    return http.post(f"{url}/v1/chat/completions", headers={"X-Session-Id": session, **extra.pop("headers", {})},
                     json={"model": "m", "messages": messages, **extra})


def test_a_worker_dying_mid_stream_loses_nothing_acknowledged(tokenizer, judge_server, owner_and_workers):
    """Worker 1 dies while streaming turn 2 (its owner connection is cut, as the kernel cuts a killed
    process's socket): turn 1, answered 200 by worker 0, stays saved and pairs with the client's retry of
    turn 2 on worker 0; the cut turn 2 is dropped as client_disconnected and nothing of it is saved.
    (The same with real processes, SIGKILL and the supervisor's restart: the OPENCLAW_TEST_FULL test below.)"""
    with scripted_server(tokenizer, lambda prompt: "one two three four five six seven eight nine ten " * 3,
                         tokens_per_s=200) as policy:
        owner, urls, workers = owner_and_workers(policy.url, judge_server.url)
        messages = [{"role": "user", "content": "hi"}]
        with http_client() as http:
            r1 = chat(http, urls[0], "k", messages)
            assert r1.status_code == 200
            reply1 = r1.json()["choices"][0]["message"]["content"]
            messages += [{"role": "assistant", "content": reply1}, {"role": "user", "content": "thanks"}]
            with http.stream("POST", f"{urls[1]}/v1/chat/completions", headers={"X-Session-Id": "k"},
                             json={"model": "m", "messages": messages, "stream": True}) as stream:
                lines = stream.iter_lines()
                assert next(lines).startswith("data: ")  # turn 2 is streaming from worker 1
                assert [c.worker for c in list(owner.hub.conns) if c.turns] == [1]
                workers[1].owner.link.writer.transport.abort()  # worker 1 is gone, for the owner
                rest = list(lines)
            assert any('"error"' in line for line in rest) and not any('"finish_reason":"stop"' in line for line in rest)
            wait_until(lambda: len(owner.hub.conns) == 1)
            assert metric(owner.proxy, "openclaw_turns_dropped_total", reason="client_disconnected") == 1
            r2 = chat(http, urls[0], "k", messages, headers={"X-Session-Done": "1"})
            assert r2.status_code == 200
        settle(owner.proxy)
        assert owner.on_loop(lambda: owner.proxy.tracker.unsettled_turns) == 0
        samples = list(owner.proxy.spool.iter_samples())
        assert [(s.session_id, s.turn) for s in samples] == [("k", 1)]  # acknowledged, paired, judged
        assert tokenizer.decode(samples[0].response_ids, skip_special_tokens=True) == reply1


def test_only_the_owner_holds_the_spool_lock(policy_server, owner_and_workers, settings_for):
    """Workers never open the spool for writing: two build and serve beside the owner, which holds its lock
    (a worker that locked it would fail with SpoolLocked here, as a second proxy on one spool does)."""
    owner, urls, _ = owner_and_workers(policy_server.url, "")
    with http_client() as http:
        assert chat(http, urls[0], "x", [{"role": "user", "content": "hello"}]).status_code == 200
    with pytest.raises(SpoolLocked):
        Spool(owner.proxy.settings.spool.dir).lock_for_writing()


@pytest.mark.skipif(os.environ.get("OPENCLAW_TEST_FULL") != "1",
                    reason="starts three worker processes (~10-40 s on the shared machine); set OPENCLAW_TEST_FULL=1")
def test_killing_a_worker_mid_stream_loses_nothing_acknowledged(tokenizer, judge_server, settings_for, tmp_path):
    """Real worker processes on one shared listening socket, under the real supervisor: SIGKILL the one
    streaming turn 2. Turn 1 (answered 200) stays saved and pairs with the client's retry of turn 2 on the
    restarted pool; the cut turn 2 is dropped as client_disconnected, never saved; only the owner holds
    the spool's lock."""
    from openclaw_rl.workers.supervisor import Supervisor, listen

    with scripted_server(tokenizer, lambda prompt: "one two three four five six seven eight nine ten " * 3,
                         tokens_per_s=40) as policy:
        settings = settings_for(policy.url, judge_server.url, "spool-kill")
        rundir = tmp_path / "run"
        rundir.mkdir()
        settings_path = rundir / "settings.pickle"
        settings_path.write_bytes(pickle.dumps(settings))
        owner = Owner(settings, tokenizer, 2, str(rundir / "owner.sock"))
        listener = listen("127.0.0.1", 0)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        sup = Supervisor(owner.hub, listener, str(rundir), str(settings_path), "WARNING")
        try:
            owner.on_loop(lambda: sup.start(2))
            wait_until(lambda: len(owner.hub.conns) == 2, timeout=120)
            pids = [c.pid for c in owner.hub.conns]
            spool_dir = Path(settings.spool.dir).resolve()
            for pid in pids:  # the workers never open the spool (its lock file or database)
                opened = [os.path.realpath(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
                assert not [p for p in opened if p.startswith(str(spool_dir))], opened
            with pytest.raises(SpoolLocked):
                Spool(settings.spool.dir).lock_for_writing()  # the owner holds it
            messages = [{"role": "user", "content": "hi"}]
            with http_client() as http:
                r1 = http.post(f"{url}/v1/chat/completions", headers={"X-Session-Id": "k"},
                               json={"model": "m", "messages": messages})
                assert r1.status_code == 200
                reply1 = r1.json()["choices"][0]["message"]["content"]
                messages += [{"role": "assistant", "content": reply1}, {"role": "user", "content": "thanks"}]
                with pytest.raises(httpx.HTTPError), http.stream(
                        "POST", f"{url}/v1/chat/completions", headers={"X-Session-Id": "k"},
                        json={"model": "m", "messages": messages, "stream": True}) as stream:
                    lines = stream.iter_lines()
                    assert next(lines).startswith("data: ")  # the reply is streaming
                    serving = [c.pid for c in list(owner.hub.conns) if c.turns]
                    assert len(serving) == 1
                    os.kill(serving[0], signal.SIGKILL)
                    for _ in lines:
                        pass
                wait_until(lambda: owner.hub.restarts == 1 and len(owner.hub.conns) == 2, timeout=120)
                assert metric(owner.proxy, "openclaw_turns_dropped_total", reason="client_disconnected") == 1
                r2 = http.post(f"{url}/v1/chat/completions", headers={"X-Session-Id": "k", "X-Session-Done": "1"},
                               json={"model": "m", "messages": messages})
                assert r2.status_code == 200
            settle(owner.proxy)
            assert owner.on_loop(lambda: owner.proxy.tracker.unsettled_turns) == 0
            samples = [s for s in wait_for_samples(owner.proxy, 1) if s.session_id == "k"]
            assert [s.turn for s in samples] == [1]  # turn 1, acknowledged before the kill, paired and judged
            assert tokenizer.decode(samples[0].response_ids, skip_special_tokens=True) == reply1
        finally:
            owner.run(sup.stop())
            listener.close()
            owner.stop()


def test_serve_with_workers_starts_the_owner_and_one_without_is_one_process(monkeypatch, tmp_path):
    """``serve --workers 2`` goes to the supervisor with the parsed settings; the default stays one process."""
    from openclaw_rl import cli
    from openclaw_rl.workers import supervisor

    calls: list[tuple] = []
    monkeypatch.setattr(supervisor, "serve_workers", lambda settings, n, level, as_json: calls.append((settings, n)) or 0)
    args = ["serve", "--port", "0", "--spool-dir", str(tmp_path / "s"), "--tokenizer", str(tmp_path)]
    ns = cli.build_parser("serve").parse_args([*args, "--workers", "2"])
    assert cli.cmd_serve(ns) == 0
    assert [(s.spool.dir, n) for s, n in calls] == [(str(tmp_path / "s"), 2)]
    assert cli.build_parser("serve").parse_args(args).workers == 1
    with pytest.raises(CommandError, match="--workers must be at least 1"):
        cli.cmd_serve(cli.build_parser("serve").parse_args([*args, "--workers", "0"]))


def test_workers_refuse_while_the_owners_spool_is_full_and_feedback_reaches_the_owner(policy_server, owner_and_workers):
    """The owner's spool state reaches every worker (Status): a full spool is a 503 before the policy is
    called, as in one process; feedback sent to the other worker applies to the owner's waiting turn."""
    owner, urls, workers = owner_and_workers(policy_server.url, "")
    with http_client() as http:
        assert chat(http, urls[0], "f", [{"role": "user", "content": "hello"}]).status_code == 200
        r = http.post(f"{urls[1]}/v1/feedback", json={"session_id": "f", "rating": 1})
        assert r.status_code == 200 and r.json()["turn"] == 1, r.text
        assert http.post(f"{urls[1]}/v1/feedback", json={"session_id": "nobody", "rating": 1}).status_code == 404
        bound = owner.proxy.writer.max_overflow
        owner.on_loop(lambda: setattr(owner.proxy.writer, "max_overflow", 0))  # full: "overloaded" at once
        wait_until(lambda: all(w.owner.state.overloaded for w in workers))
        refused = chat(http, urls[1], "g", [{"role": "user", "content": "hello"}])
        assert refused.status_code == 503 and "the spool is full" in refused.json()["error"]["message"]
        owner.on_loop(lambda: setattr(owner.proxy.writer, "max_overflow", bound))
        wait_until(lambda: not any(w.owner.state.overloaded for w in workers))
        assert chat(http, urls[1], "g", [{"role": "user", "content": "hello"}]).status_code == 200
        assert "openclaw_backpressure_total 1.0" in http.get(f"{urls[0]}/metrics").text


def test_the_owners_spool_state_is_pushed_to_the_workers_when_it_changes(policy_server, owner_and_workers):
    """The owner polls nothing: the writer thread's own state change (a spool file replaced behind its back,
    then put back) is what sends the workers a new Status (``SampleWriter.on_state_change``), both ways."""
    # no probe refresh during the test: it recomputes the status too (a context length may be new)
    owner, _, workers = owner_and_workers(policy_server.url, "", workers=1, proxy_probe_interval_s=3600)
    client = workers[0].owner
    told: queue.Queue = queue.Queue()
    on_status = client.on_status
    client.on_status = lambda status: (on_status(status), told.put(status))

    def next_told(cond: Any) -> Any:
        while not cond(status := told.get(timeout=30)):  # the timeout only ends a hang
            pass
        return status

    path = owner.proxy.spool.path
    away, other = path.with_name("away.db"), path.with_name("other.db")
    os.link(path, away)  # the path is never empty: the writer would write the open database back there
    other.write_bytes(b"")
    os.replace(other, path)
    owner.proxy.writer.retry()
    assert "replaced by another file" in next_told(lambda s: s.problem is not None).problem
    assert client.state.problem is not None
    os.replace(away, path)  # the file it opened is back: the next retry's probe commits
    owner.proxy.writer.retry()
    next_told(lambda s: s.problem is None)
    assert owner.proxy.writer.problem is None


def test_users_are_listed_and_deleted_through_any_worker(policy_server, owner_and_workers):
    """``GET``/``DELETE /v1/users`` on a worker are the owner's answers (it holds the sessions, the spool and
    the admin keys): a user who chatted on worker 0 is deleted through worker 1, their waiting turn is a
    ``user_deleted`` drop, another user's stays; a plain key gets the owner's 403, an unknown user its 404."""
    owner, urls, _ = owner_and_workers(policy_server.url, "", proxy_api_keys=["alice", "bob"],
                                       proxy_admin_keys=["root"])
    alice_id, bob_id = key_namespace("alice"), key_namespace("bob")
    root, alice = {"Authorization": "Bearer root"}, {"Authorization": "Bearer alice"}
    with http_client() as http:
        for key, url in (("alice", urls[0]), ("bob", urls[1])):
            r = chat(http, url, "s", [{"role": "user", "content": "hello"}], headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
        listed = http.get(f"{urls[1]}/v1/users", headers=root)
        assert listed.status_code == 200, listed.text
        assert {row["user"] for row in listed.json()["data"]} == {alice_id, bob_id}
        assert http.get(f"{urls[0]}/v1/users", headers=alice).status_code == 403
        assert http.delete(f"{urls[0]}/v1/users/{bob_id}", headers=alice).status_code == 403
        assert http.delete(f"{urls[1]}/v1/users/nobody", headers=root).status_code == 404
        done = http.delete(f"{urls[1]}/v1/users/{alice_id}", headers=root)
        assert done.status_code == 200, done.text
        assert done.json()["removed"]["dropped_turns"] == 1
        left = {row["user"] for row in http.get(f"{urls[0]}/v1/users", headers=root).json()["data"]}
    assert left == {bob_id}
    assert drops(owner.proxy)["user_deleted"] == 1


def test_a_workers_dashboard_lists_the_owners_live_waiting_turns(tokenizer, owner_and_workers):
    """The dashboard on a worker asks the owner for its tracker's waiting turns (the ``waiting`` call): a turn
    served by worker 0 is listed on worker 1 as generating (not yet in the spool), then as waiting for its next
    state, the rows the owner's one-process dashboard shows. An owner that does not answer in time leaves the
    page the spool's saved rows, labelled so, never a hang."""
    gate = threading.Event()

    def reply(prompt: str) -> str:  # holds the engine until the dashboard has looked (the turn is generating)
        gate.wait(30)
        return "fine"

    with scripted_server(tokenizer, reply) as policy:
        owner, urls, workers = owner_and_workers(policy.url, "")
        with http_client() as http:
            def turns() -> list[tuple]:
                r = http.get(f"{urls[1]}/dashboard/api/session", params={"id": "w"})
                assert r.status_code == 200, r.text
                return [(t["turn"], t["fate"]) for t in r.json()["turns"]]

            done: Future = Future()

            def send() -> None:
                try:
                    done.set_result(chat(http, urls[0], "w", [{"role": "user", "content": "hello"}]))
                except Exception as e:  # noqa: BLE001 - raised by done.result below
                    done.set_exception(e)
            threading.Thread(target=send, daemon=True).start()
            wait_until(lambda: any(c.turns for c in list(owner.hub.conns)))  # begun at the owner
            try:
                assert turns() == [(1, {"state": "waiting", "reason": "generating"})]
            finally:
                gate.set()
            assert done.result(30).status_code == 200
            assert turns() == [(1, {"state": "waiting", "reason": "waiting for its next state"})]
            live = owner.on_loop(lambda: data.session_turns(owner.proxy.dashboard, "default", "w"))
            assert http.get(f"{urls[1]}/dashboard/api/session", params={"id": "w"}).json()["turns"] == live

            held = asyncio.Event()  # waited on and set on the owner's loop
            real = owner.hub._call

            async def silent(call: Any) -> Any:
                if call.what == "waiting":
                    await held.wait()
                return await real(call)
            owner.hub._call = silent
            workers[1].waiting_timeout_s = 0.05
            try:
                assert turns() == [(1, {"state": "waiting", "reason": SPOOL_FALLBACK})]
            finally:
                owner.loop.call_soon_threadsafe(held.set)
